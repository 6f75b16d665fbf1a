"""Jobs end to end through the real `bigrate` command on the local engine: run
directories, failures recorded, SIGKILL of the driver and resume, locks, reports."""

import json
import os
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest

from bigrate import load_model
from tests.conftest import run_cli, start_cli, wait_for_results


def job_file(tmp_path, body: str):
    p = tmp_path / "job.toml"
    p.write_text(body)
    return p


def train_job(data, out, engine="local", extra="", epochs=4):
    return f"""
[job]
kind = "train"
name = "t"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = {epochs} {extra} }}
[engine]
name = "{engine}"
rounds_per_epoch = 4  # rounds enough to stop or lose a worker in
[output]
dir = "{out}"
"""


def events(run):
    """The run's events.jsonl, as dicts, in order."""
    return [json.loads(line) for line in (run / "events.jsonl").open()]


def only_run(out):
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1
    return runs[0]


def test_train_job_run_directory(tmp_path, synth):
    p = run_cli(
        "run", job_file(tmp_path, train_job(synth, tmp_path / "runs")), check=True
    )
    run = only_run(tmp_path / "runs")
    for name in (
        "job.toml",
        "config.json",
        "env.json",
        "events.jsonl",
        "metrics.json",
        "model/model.json",
        "model/arrays.npz",
    ):
        assert (run / name).exists(), name
    assert not (run / ".lock").exists()
    env = json.loads((run / "env.json").read_text())
    assert env["bigrate"] and env["numpy"] and env["python"]
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").open()]
    assert events[0] == "run_started" and events[-1] == "run_finished"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["evaluation"]["test"]["pfa"] < 0.1
    assert metrics["engine"]["name"] == "local" and metrics["engine"]["rounds"] == 16
    assert metrics["engine"]["merge"] == "driver"  # no workers: combined here
    assert "test" in p.stdout and f"run directory: {run}" in p.stdout
    # predict, and the saved model gives identical scores
    run_cli("predict", run, synth, "--out", tmp_path / "s.parquet", check=True)
    scores = pq.read_table(tmp_path / "s.parquet")
    from bigrate import ShardedDataset

    ds = ShardedDataset(synth)
    test = ds.to_csr("test")
    model = load_model(run / "model")
    got = scores.filter(scores.column("split").to_numpy(zero_copy_only=False) == "test")
    order = np.argsort(got.column("row_id").to_numpy())
    np.testing.assert_array_equal(
        got.column("score").to_numpy()[order], model.decision_function(test.X)
    )
    # status and report
    st = run_cli("status", run, check=True).stdout
    assert "state    complete" in st
    rep = run_cli("report", run, check=True).stdout
    assert (run / "report" / "index.html").exists() and (
        run / "report" / "roc.png"
    ).exists()
    assert "report:" in rep
    html = (run / "report" / "index.html").read_text()
    assert html.count("data:image/png;base64,") >= 2


def sweep_job(
    data, out, grid="alpha = [1e-5, 1e-4, 1e-3, 1e-2]", cv=3, engine="local", epochs=3
):
    return f"""
[job]
kind = "sweep"
name = "s"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = {epochs} }}
[sweep]
grid = {{ {grid} }}
cv = {cv}
[engine]
name = "{engine}"
rounds_per_epoch = 4  # rounds enough to stop or lose a worker in
[output]
dir = "{out}"
"""


def test_failing_task_is_recorded_and_the_sweep_goes_on(tmp_path, synth):
    body = sweep_job(
        synth, tmp_path / "runs", grid="gamma0 = [0.1, 5000.0], alpha = [1e-3]", cv=2
    )
    p = run_cli("run", job_file(tmp_path, body), check=True)
    run = only_run(tmp_path / "runs")
    res = [json.loads(f.read_text()) for f in sorted((run / "results").glob("*.json"))]
    failed = [r for r in res if r["status"] == "failed"]
    assert len(res) == 4 and len(failed) == 2
    assert all("gamma0 * alpha must be < 1" in r["error"] for r in failed)
    assert all("Traceback" in r["traceback"] for r in failed)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["sweep"]["best"]["params"] == {"alpha": 1e-3, "gamma0": 0.1}
    assert metrics["sweep"]["failed_tasks"] == 2
    assert "2 failed task(s)" in p.stdout
    table = pq.read_table(run / "results.parquet")
    assert table.num_rows == 4
    # the per-point summary: ranked, mean and spread over folds, failed point unranked
    summary = pq.read_table(run / "summary.parquet").to_pylist()
    assert len(summary) == 2
    good = next(r for r in summary if r["param_gamma0"] == 0.1)
    bad = next(r for r in summary if r["param_gamma0"] == 5000.0)
    assert good["rank"] == 1 and bad["rank"] is None and bad["n_ok"] == 0
    folds = [r for r in res if r["status"] == "ok"]
    vals = [r["metrics"]["J_val"] for r in folds]
    assert good["mean_J_val"] == pytest.approx(np.mean(vals))
    assert good["std_J_val"] == pytest.approx(np.std(vals))
    assert "rank" in p.stdout and "mean J_val" in p.stdout


def test_driver_sigkill_mid_sweep_then_resume(tmp_path, synth):
    body = sweep_job(
        synth,
        tmp_path / "runs",
        grid="alpha = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 3e-2]",
        cv=3,
        epochs=6,
    )
    proc = start_cli("run", job_file(tmp_path, body), "--quiet")
    run = wait_for_results(tmp_path / "runs", "s-*", 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {f.name: f.read_bytes() for f in (run / "results").glob("*.json")}
    assert 3 <= len(before) < 18
    assert (run / ".lock").exists()  # left by the killed driver: stale, taken over
    st = run_cli("status", run, check=True).stdout
    assert "state    interrupted" in st and f"{len(before)}/18 tasks done" in st
    p = run_cli("resume", run, check=True)
    after = {f.name: f.read_bytes() for f in (run / "results").glob("*.json")}
    assert len(after) == 18
    for name, data in before.items():  # finished tasks were not redone
        assert after[name] == data
    table = pq.read_table(run / "results.parquet").to_pydict()
    pairs = list(zip(table["point"], table["fold"]))
    assert len(pairs) == 18 == len(set(pairs))
    events = [json.loads(line) for line in (run / "events.jsonl").open()]
    kinds = [e["event"] for e in events]
    assert (
        "resumed" in kinds
        and "stale_lock_removed" in kinds
        and kinds[-1] == "run_finished"
    )
    done = [(e["point"], e["fold"]) for e in events if e["event"] == "task_done"]
    assert len(done) == len(set(done)) == 18  # every grid point exactly once
    # the train split read and its folds put on the engine before each sweep starts
    loaded = [k for k, e in enumerate(events) if e["event"] == "data_loaded"]
    started = [k for k, e in enumerate(events) if e["event"] == "sweep_started"]
    assert len(loaded) == len(started) >= 1
    assert all(a < b for a, b in zip(loaded, started))
    assert all(events[k]["seconds"] >= 0 for k in loaded)
    assert "sweep: best point" in p.stdout
    again = run_cli("resume", run, check=True)
    assert "already complete" in again.stderr


def test_two_runs_never_share_a_run_directory(tmp_path, synth):
    from bigrate.rundir import RunDir, RunLockedError

    run = RunDir.create(tmp_path / "runs", "x", None, {"job": {}})
    with pytest.raises(RunLockedError, match=f"in use by pid {os.getpid()}"):
        RunDir.open(run.path).lock()
    p = run_cli("resume", run.path)
    assert p.returncode == 2 and "in use by pid" in p.stderr
    run.unlock()
    other = RunDir.create(tmp_path / "runs", "x", None, {"job": {}})
    assert other.path != run.path
    other.unlock()


def test_task_records_read_once_while_the_run_is_locked(tmp_path):
    """The process holding a run's lock reads results/ once and keeps the records up
    to date as it saves them (a long sweep does not re-read every file at every table
    rewrite); what it returns is what the files say; a reader without the lock reads
    the files every time."""
    from bigrate.rundir import RunDir

    run = RunDir.create(tmp_path / "runs", "x", None, {"job": {}})  # locked
    run.save_result(0, 0, {"point": 0, "fold": 0, "status": "ok",
                           "metrics": {"J_val": np.float64(0.25)}})  # fmt: skip
    reader = RunDir.open(run.path)  # no lock
    assert reader.results() == run.results()
    # a file written behind the locked run's back is not seen by it (only it writes
    # there), but is by the reader
    (run.path / "results" / "point-00009-fold-000.json").write_text(
        json.dumps({"point": 9, "fold": 0, "status": "ok", "metrics": {}})
    )
    assert (9, 0) not in run.results() and (9, 0) in reader.results()
    run.save_result(1, 2, {"point": 1, "fold": 2, "status": "failed", "error": "x"})
    got = run.results()
    assert got[(1, 2)] == json.loads(
        (run.path / "results" / "point-00001-fold-002.json").read_text()
    )
    assert got[(0, 0)]["metrics"]["J_val"] == 0.25
    got.clear()  # a copy: the kept records are not the caller's
    assert len(run.results()) == 2
    run.unlock()  # without the lock, the files again
    assert sorted(run.results()) == [(0, 0), (1, 2), (9, 0)]


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path, synth):
    body = sweep_job(
        synth,
        tmp_path / "runs",
        grid="alpha = [1e-6, 1e-5, 1e-4, 1e-3]",
        cv=3,
        epochs=6,
    )
    proc = start_cli("run", job_file(tmp_path, body), "--quiet")
    run = wait_for_results(tmp_path / "runs", "s-*", 1, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "bigrate resume" in err.decode()
    assert not (run / ".lock").exists()  # released
    run_cli("resume", run, check=True)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_swallowed_inside_a_finaliser_is_still_seen():
    # Python raises the KeyboardInterrupt inside __del__ and only prints it there; the
    # recorded request is what makes the sweep and the command stop anyway.
    from bigrate.runner import interrupt

    class Finaliser:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # the handler runs here, inside __del__

    old = signal.getsignal(signal.SIGINT)
    try:
        interrupt.install()
        Finaliser()  # dropped at once: the interrupt is raised and swallowed
        assert interrupt.requested()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
    finally:
        interrupt.clear()
        signal.signal(signal.SIGINT, old)


def test_a_ctrl_c_during_training_rounds_waits_for_the_end_of_the_round():
    # within interrupt.deferred (training rounds) the first Ctrl-C is recorded and
    # raised by the next check (between rounds), a second one at once; outside, at once
    from bigrate.runner import interrupt

    def press():
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler runs here

    old = signal.getsignal(signal.SIGINT)
    try:
        interrupt.install()
        with interrupt.deferred():
            press()  # not raised
            assert interrupt.requested()
            with pytest.raises(KeyboardInterrupt):
                interrupt.check()
            with pytest.raises(KeyboardInterrupt):
                press()  # the second one
        interrupt.clear()
        with pytest.raises(KeyboardInterrupt):
            press()
    finally:
        interrupt.clear()
        signal.signal(signal.SIGINT, old)


def test_a_val_sweep_delivers_the_model_it_chose(tmp_path, synth):
    """With cv = "val", the sweep's fits of a learner trained by rounds are the rounds
    the refit of the best point runs (the same shares and schedule, on the local
    engine in each task): the delivered model's val score is the score the point was
    chosen by, to the last bit. Before, the refit was another run of SGD, and on the
    PSM file a point chosen at 67 val targets was delivered at 43 (10 on test)."""
    body = sweep_job(synth, tmp_path / "runs", grid="alpha = [1e-4, 1e-3]", cv='"val"',
                     epochs=2)  # fmt: skip
    run_cli("run", job_file(tmp_path, body), check=True)
    m = json.loads((only_run(tmp_path / "runs") / "metrics.json").read_text())
    best = m["sweep"]["best"]
    assert best["n_ok"] == 1 and m["params"]["alpha"] == best["params"]["alpha"]
    assert m["evaluation"]["val"]["J_val"] == best["mean_J_val"]
