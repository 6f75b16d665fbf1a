"""Training checkpoints through the real `bigrate` command: a training job killed
(SIGKILL) or interrupted (Ctrl-C) mid-training resumes from its last checkpoint, and its
final model equals that of an uninterrupted run with the same seed and engine."""

import os
import signal
import time

import numpy as np
import pytest

from bigrate import load_model
from bigrate.linear.distributed import load_snapshot
from tests.conftest import run_cli, start_cli
from tests.runner.test_jobs import events, job_file, only_run


def train_body(data, out, engine="local", epochs=15, every=1):
    return f"""
[job]
kind = "train"
name = "ck"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = {epochs} }}
[engine]
name = "{engine}"
rounds_per_epoch = 4  # rounds enough to stop or lose a worker in
workers = 2
[output]
dir = "{out}"
checkpoint_rounds = {every}
"""


def wait_for_checkpoint(out, round_at_least, proc, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        runs = list(out.glob("ck-*")) if out.exists() else []
        if runs and (runs[0] / "events.jsonl").exists():
            ck = [e for e in events(runs[0]) if e["event"] == "checkpoint"]
            if ck and ck[-1]["round"] >= round_at_least:
                return runs[0]
        if proc.poll() is not None:
            raise AssertionError(f"the job ended first: {proc.stderr.read().decode()}")
        time.sleep(0.01)
    raise AssertionError("no checkpoint appeared")


def same_model(a, b):
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)
    assert a.multiplier_ == b.multiplier_ and a.t_ == b.t_


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, synth):
    out = tmp_path_factory.mktemp("ck") / "runs"
    tmp = out.parent
    run_cli("run", job_file(tmp, train_body(synth, out)), "--quiet", check=True)
    run = only_run(out)
    kinds = [e["event"] for e in events(run)]
    assert kinds.count("checkpoint") >= 50  # every round but the last (60 rounds)
    return load_model(run / "model")


def test_sigkill_mid_training_resumes_from_the_last_checkpoint(
    tmp_path,
    synth,
    uninterrupted,
):
    out = tmp_path / "runs"
    proc = start_cli("run", job_file(tmp_path, train_body(synth, out)), "--quiet")
    run = wait_for_checkpoint(out, 5, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    snap = load_snapshot(run / "checkpoint")
    assert 5 <= snap.round < 60
    st = run_cli("status", run, check=True).stdout
    assert "interrupted" in st and "checkpoint after round" in st
    p = run_cli("resume", run, check=True)
    ev = events(run)
    resumed = [e for e in ev if e["event"] == "resumed"]
    assert resumed and resumed[-1]["from_round"] >= snap.round
    assert ev[-1]["event"] == "run_finished"
    assert "continues from the checkpoint" in p.stderr
    same_model(load_model(run / "model"), uninterrupted)


def test_ctrl_c_writes_a_checkpoint_and_prints_the_resume_command(tmp_path, synth):
    out = tmp_path / "runs"
    # 300 epochs (~5 s on a Zen 5 core; 60 took 1.1 s there, and a Ctrl-C a fixed
    # second after the start landed after training on a loaded machine, with no
    # checkpoint to name); only the Ctrl-C writes a checkpoint
    body = train_body(synth, out, epochs=300, every=1000)
    whole = tmp_path / "whole"
    whole.mkdir()
    run_cli("run", job_file(whole, train_body(synth, whole / "runs", epochs=300,
                                              every=1000)), "--quiet", check=True)  # fmt: skip
    uninterrupted = load_model(only_run(whole / "runs") / "model")
    # the Ctrl-C at half the uninterrupted run's training time after its start:
    # mid-training, after the first rounds, however fast the machine
    fit_s = [
        e for e in events(only_run(whole / "runs")) if e["event"] == "train_finished"
    ]
    wait = fit_s[0]["seconds"] / 2
    proc = start_cli("run", job_file(tmp_path, body), "--quiet")
    t0 = time.time()
    while time.time() - t0 < 120:  # wait for training rounds to run
        runs = list(out.glob("ck-*")) if out.exists() else []
        if runs and (runs[0] / "events.jsonl").exists():
            if "train_started" in (runs[0] / "events.jsonl").read_text():
                break
        time.sleep(0.01)
    time.sleep(wait)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    run = only_run(out)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"bigrate resume {run}" in err and "checkpoint after round" in err
    ev = events(run)
    assert [e["event"] for e in ev if e["event"] in ("checkpoint", "interrupted")] == [
        "checkpoint",
        "interrupted",
    ]
    assert not (run / ".lock").exists()
    run_cli("resume", run, check=True)
    same_model(load_model(run / "model"), uninterrupted)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_to_the_process_group_interrupts_a_dask_job_cleanly(
    tmp_path, synth, sig
):
    """A terminal's Ctrl-C (SIGINT) or a batch system's SIGTERM, sent to the whole
    process group (the driver and its embedded Dask workers): an interruption, not a
    failure: the last round's checkpoint, the resume command, exit 128 + signal, no
    traceback from any process; the resumed run ends with the uninterrupted model
    (the rounds on the local engine with the data in the same two shares)."""
    from bigrate import NeymanPearsonSGD
    from bigrate.engines.local import LocalEngine
    from bigrate.linear.distributed import fit_distributed

    out = tmp_path / "b"
    body = train_body(synth, out, engine="dask", epochs=4)
    proc = start_cli("run", job_file(tmp_path, body), "--quiet",
                     start_new_session=True)  # fmt: skip
    run = wait_for_checkpoint(out, 3, proc)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=180)
    err = err.decode()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "Error" not in err, err
    what = "interrupted (SIGTERM)" if sig == signal.SIGTERM else "interrupted"
    assert f"bigrate: {what}; training checkpoint after round" in err, err
    assert f"bigrate resume {run}" in err
    st = run_cli("status", run, check=True).stdout
    assert "state    interrupted" in st
    snap = load_snapshot(run / "checkpoint")
    assert snap.round < 16 and snap.schedule["workers"] == 2
    run_cli("resume", run, check=True)
    whole = NeymanPearsonSGD(rho=0.05, epochs=4, random_state=0)
    fit_distributed(whole, synth, LocalEngine(), workers=2, progress=False,
                    rounds_per_epoch=4)  # fmt: skip
    same_model(load_model(run / "model"), whole)


def test_a_dask_job_with_a_memory_limit_resumes_with_it_after_a_sigkill(
    tmp_path, synth
):
    """`[engine] memory_limit` reaches the embedded Dask workers, and a resume after a
    SIGKILLed driver opens its new cluster with the same limit (from config.json): the
    fit keeps a quarter of it as its row-group cache, and finished rounds are not run
    again."""
    import json

    out = tmp_path / "m"
    body = train_body(synth, out, engine="dask", epochs=6).replace(
        "workers = 2\n", 'workers = 2\nmemory_limit = "800MiB"\n'
    )
    assert 'memory_limit = "800MiB"' in body
    proc = start_cli("run", job_file(tmp_path, body), "--quiet")
    run = wait_for_checkpoint(out, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    snap = load_snapshot(run / "checkpoint")
    assert 3 <= snap.round < 24
    run_cli("resume", run, check=True)
    ev = events(run)
    resumed = [e for e in ev if e["event"] == "resumed"]
    assert resumed and resumed[-1]["from_round"] >= snap.round
    assert ev[-1]["event"] == "run_finished"
    model = json.loads((run / "model" / "model.json").read_text())
    assert model["fitted"]["engine_"]["cache_mb"] == pytest.approx(200.0)
