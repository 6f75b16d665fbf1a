"""NPSearchCV on a real local Ray runtime (2 CPUs, 127.0.0.1): results, resume after the
sweep process is killed, a Ray worker killed mid-task."""

import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bigrate import NeymanPearsonSVC, NPSearchCV
from tests.conftest import kill_a_fitting_worker
from tests.kernel.test_smo_svc import two_gaussians

# processes these tests start load compiled kernels instead of compiling them
pytestmark = pytest.mark.usefixtures("compiled_kernels")

GRID = {"C": [20.0, 200.0, 2000.0], "gamma": [0.1, 0.5, 2.0]}


def test_npsearchcv_on_ray(tmp_path):
    X, y = two_gaussians(0, n=150)
    s = NPSearchCV(
        NeymanPearsonSVC(),
        GRID,
        rho=0.1,
        cv=3,
        engine="ray",
        n_workers=2,
        run_dir=tmp_path / "run",
        progress=False,
    ).fit(X, y)
    j = s.cv_results_["mean_J_val"]
    assert np.isfinite(j).all() and s.best_score_ == j.min()
    from sklearn.model_selection import ParameterGrid

    assert s.best_params_ in list(ParameterGrid(GRID))
    assert s.predict(X).shape == y.shape and s.n_failed_ == 0
    recs = list((tmp_path / "run" / "results").glob("*.json"))
    assert len(recs) == 27 and (tmp_path / "run" / "results.parquet").exists()
    # the same run directory again: nothing is refit
    s2 = NPSearchCV(
        NeymanPearsonSVC(),
        GRID,
        rho=0.1,
        cv=3,
        engine="local",
        run_dir=tmp_path / "run",
        progress=False,
    ).fit(X, y)
    assert s2.best_params_ == s.best_params_


SCRIPT = """
import numpy as np, sys
from bigrate import NeymanPearsonSVC, NPSearchCV
from tests.kernel.test_smo_svc import two_gaussians

X, y = two_gaussians(1, n=400)
grid = {{"C": [20.0, 200.0, 2000.0, 20000.0], "gamma": [0.1, 0.5, 2.0]}}
NPSearchCV(NeymanPearsonSVC(max_iter=400), grid, rho=0.05, cv=3, engine="{engine}",
           n_workers=2, run_dir=sys.argv[1], progress=False).fit(X, y)
"""


def _start(tmp_path, engine):
    (tmp_path / "sweep.py").write_text(textwrap.dedent(SCRIPT.format(engine=engine)))
    import os

    from tests.conftest import REPO

    return subprocess.Popen(
        [sys.executable, str(tmp_path / "sweep.py"), str(tmp_path / "run")],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_killed_sweep_resumes_without_refitting(tmp_path):
    proc = _start(tmp_path, "local")
    t0 = time.time()
    while time.time() - t0 < 120:
        if len(list((tmp_path / "run" / "results").glob("*.json"))) >= 5:
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {
        p.name: p.read_bytes() for p in (tmp_path / "run" / "results").glob("*.json")
    }
    assert 5 <= len(before) < 36
    proc = _start(tmp_path, "ray")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    after = {
        p.name: p.read_bytes() for p in (tmp_path / "run" / "results").glob("*.json")
    }
    assert len(after) == 36
    assert all(after[k] == v for k, v in before.items())  # none done twice
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    done = [(e["point"], e["fold"]) for e in events if e["event"] == "task_done"]
    assert len(done) == len(set(done)) == 36  # none lost, none twice


def test_ray_worker_killed_mid_task(tmp_path):
    proc = _start(tmp_path, "ray")
    # the victim: the Ray worker named by the first task record, a descendant of the
    # driver this test started, killed by its process id
    killed = kill_a_fitting_worker(tmp_path, proc.pid, proc)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert killed is not None, "no running fit was found to kill"
    recs = [
        json.loads(p.read_text()) for p in (tmp_path / "run" / "results").glob("*.json")
    ]
    assert len(recs) == 36 and all(r["status"] == "ok" for r in recs)


def test_bad_search_input():
    X, y = two_gaussians(0, n=50)
    with pytest.raises(ValueError, match="rho must be in"):
        NPSearchCV(NeymanPearsonSVC(), GRID, rho=1.5, engine="local").fit(X, y)
    with pytest.raises(ValueError, match="Invalid parameter 'Cee'"):
        NPSearchCV(NeymanPearsonSVC(), {"Cee": [1.0]}, rho=0.1, engine="local").fit(
            X, y
        )
