"""A sweep job over the kernel NP-SVM end to end through the real `bigrate` command:
the driver is SIGKILLed mid-sweep, resumed without redoing finished (point, fold) tasks,
and the refitted model predicts from the run directory."""

import json
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest

from bigrate import NeymanPearsonSVC, ShardedDataset, load_model
from tests.conftest import run_cli, start_cli, wait_for_results

# processes these tests start load compiled kernels instead of compiling them
pytestmark = pytest.mark.usefixtures("compiled_kernels")


@pytest.fixture(scope="module")
def iono(tmp_path_factory, shared_data):
    from bigrate.data.prep import run_recipe

    d = tmp_path_factory.mktemp("kernel") / "ionosphere"
    run_recipe("ionosphere", d, shared=shared_data)
    return d


def test_npsvc_sweep_survives_sigkill_resumes_and_predicts(tmp_path, iono):
    job = tmp_path / "job.toml"
    job.write_text(f"""
[job]
kind = "sweep"
name = "k"
[data]
path = "{iono}"
[model]
estimator = "NeymanPearsonSVC"
params = {{ rho = 0.1, max_iter = 60 }}
[sweep]
grid = {{ C = [10.0, 30.0, 100.0, 300.0], gamma = [0.03, 0.1, 0.3, 1.0] }}
cv = 3
[engine]
name = "local"
[output]
dir = "{tmp_path / "runs"}"
""")
    proc = start_cli("run", job, "--quiet")
    run = wait_for_results(tmp_path / "runs", "k-*", 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {f.name: f.read_bytes() for f in (run / "results").glob("*.json")}
    assert 2 <= len(before) < 48
    p = run_cli("resume", run, check=True)
    after = {f.name: f.read_bytes() for f in (run / "results").glob("*.json")}
    assert len(after) == 48
    for name, data in before.items():  # finished tasks were not redone
        assert after[name] == data
    events = [json.loads(line) for line in (run / "events.jsonl").open()]
    done = [(e["point"], e["fold"]) for e in events if e["event"] == "task_done"]
    assert len(done) == len(set(done)) == 48
    assert all(json.loads(v)["status"] == "ok" for v in after.values()), (
        "every NP-SVM fit of the grid finished"
    )
    assert "sweep: best point" in p.stdout
    # the refitted model is a saved NeymanPearsonSVC that predicts from the run
    model = load_model(run / "model")
    assert isinstance(model, NeymanPearsonSVC)
    metrics = json.loads((run / "metrics.json").read_text())
    best = metrics["sweep"]["best"]["params"]
    assert model.C == best["C"] and model.gamma == best["gamma"]
    assert metrics["evaluation"]["test"]["pfa"] < 0.5  # not the all-positive rule
    run_cli("predict", run, iono, "--out", tmp_path / "s.parquet", check=True)
    scores = pq.read_table(tmp_path / "s.parquet")
    test = ShardedDataset(iono).to_csr("test")
    got = scores.filter(scores.column("split").to_numpy(zero_copy_only=False) == "test")
    order = np.argsort(got.column("row_id").to_numpy())
    np.testing.assert_allclose(
        got.column("score").to_numpy()[order],
        model.decision_function(test.X),
        rtol=1e-12,
        atol=1e-12,
    )
    st = run_cli("status", run, check=True).stdout
    assert "state    complete" in st and "48/48 tasks done" in st
    # the per-point summary and the report (NP-SVM history: DC iterations)
    assert pq.read_table(run / "summary.parquet").num_rows == 16
    run_cli("report", run, check=True)
    page = (run / "report" / "index.html").read_text()
    assert "every point, ranked" in page and page.count("data:image/png") == 3


def _warm_job(tmp_path, iono, cv="3"):
    job = tmp_path / "warm.toml"
    job.write_text(f"""
[job]
kind = "sweep"
name = "w"
[data]
path = "{iono}"
[model]
estimator = "NeymanPearsonSVC"
[sweep]
grid = {{ C = [100.0, 10.0, 30.0], gamma = [0.1, 0.3] }}
cv = {cv}
warm_start = true
[engine]
name = "local"
[output]
dir = "{tmp_path / "runs"}"
""")
    return job


def test_warm_started_sweep_job_runs_c_chains(tmp_path, iono):
    """[sweep] warm_start = true: per gamma and fold one task along C (10, 30, 100),
    the first fit cold, the others from the previous solution; every point recorded."""
    p = run_cli("run", _warm_job(tmp_path, iono), "--quiet", check=True)
    assert p.returncode == 0
    (run,) = (tmp_path / "runs").glob("w-*")
    recs = [json.loads(f.read_text()) for f in (run / "results").glob("*.json")]
    assert len(recs) == 6 * 3 and all(r["status"] == "ok" for r in recs)
    for r in recs:
        assert r["warm_started"] is (r["params"]["C"] != 10.0), r["params"]
    events = [json.loads(line) for line in (run / "events.jsonl").open()]
    waves = [e for e in events if e["event"] == "sweep_wave"]
    assert waves and waves[0]["chains"] == 2 * 3


def test_warm_start_job_needs_folds(tmp_path, iono):
    p = run_cli("run", _warm_job(tmp_path, iono, cv='"val"'), "--quiet")
    assert p.returncode == 2 and "sweep.warm_start" in p.stderr
    assert "needs k-fold" in p.stderr and not (tmp_path / "runs").exists()
