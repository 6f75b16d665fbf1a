"""No wait on a cluster without an end: a training job submitted by address to a real
Dask scheduler with two workers, and to a real Ray head, loses a worker (SIGKILL) at
each phase of its work: the warm-up, the making of the pinned pool's slots, the first
round, mid-training and the final evaluation. Each run finishes within a bounded time
with the model and metrics of an uninterrupted run, and records the lost worker. A lost
scheduler or head ends the job in one line with the command that resumes it, and the
resumed run ends with the uninterrupted model.

The worker dies exactly at the chosen call: the cluster processes load
``tests/faults/sitecustomize.py`` (PYTHONPATH), which SIGKILLs the process making the
N-th call of a function across the cluster when the test arms it."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bigrate import load_model
from tests.conftest import REPO, run_cli, start_cli
from tests.runner.test_jobs import events, job_file, only_run

BIN = Path(sys.executable).parent
FAULTS = REPO / "tests" / "faults"
EPOCHS = 4  # 16 rounds of 2 tasks
# the phases a worker is lost at, as (target, call number) of the fault injector: the
# first round alone, and two losses in each of the other runs (a second worker lost
# after the first one's replacement joined)
PHASES = {
    "slots, then mid-training": [("slot", 1), ("round", 17)],
    "warm-up, then the evaluation": [("warm", 1), ("evaluate", 1)],
    "first round": [("round", 1)],
}
BOUND = 60.0  # seconds a run with a lost worker may take (they take 4-15 s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def cluster_env(fault_file, **kw):
    return dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        PYTHONPATH=str(FAULTS),
        BIGRATE_FAULT_FILE=str(fault_file),
        RAY_USAGE_STATS_ENABLED="0",
        **kw,
    )


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the process group this test started, SIGKILL after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # anything of the group still alive
    except ProcessLookupError:
        pass


def start_dask(fault_file, n_workers=2):
    port = free_port()
    sched = subprocess.Popen(
        [str(REPO / "cluster/dask/start-scheduler.sh")],
        env=cluster_env(fault_file, PORT=str(port), DASHBOARD="none"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"tcp://127.0.0.1:{port}"
    workers = [start_dask_worker(fault_file, address) for _ in range(n_workers)]
    from dask.distributed import Client

    try:
        with Client(address, timeout="60s") as c:
            if n_workers:
                c.wait_for_workers(n_workers, timeout=120)
    except BaseException:
        for p in [sched, *workers]:
            stop_group(p)
        raise
    return address, sched, workers


def start_dask_worker(fault_file, address):
    return subprocess.Popen(
        [str(REPO / "cluster/dask/start-worker.sh")],
        env=cluster_env(fault_file, SCHEDULER=address, MEMORY_LIMIT="2GiB"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def start_ray(fault_file, tmp):
    port = free_port()
    head = subprocess.Popen(
        [str(REPO / "cluster/ray/start-head.sh"), "--block", "--temp-dir", str(tmp)],
        env=cluster_env(fault_file, PORT=str(port), NUM_CPUS="2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.time()
    try:
        while not _port_open(port):
            assert head.poll() is None, head.stderr.read()[-3000:]
            assert time.time() - t0 < 180, "the Ray head did not come up in 180 s"
            time.sleep(0.2)
    except BaseException:
        stop_group(head, grace=3)
        raise
    time.sleep(2.0)  # the raylet registers after the GCS listens
    return f"127.0.0.1:{port}", head


def arm(fault_file: Path, kills: list | None, delay: float = 0.0) -> None:
    """Kill at the n-th call of ``target`` for every (target, n) of ``kills`` from now
    on, every wrapped call after the first kill ``delay`` seconds slower (None: kill
    nothing; the calls counted so far stay, for :func:`fired`)."""
    if kills is None:
        fault_file.unlink(missing_ok=True)
        return
    for f in fault_file.parent.glob("*-*"):
        f.unlink()
    fault_file.write_text("".join(f"{t} {n} {delay}\n" for t, n in kills))


def fired(fault_file: Path, target: str, n: int) -> bool:
    return (fault_file.parent / f"{target}-{n}").exists()


def train_body(data, out, engine, epochs=EPOCHS, every=20, name="wl"):
    return f"""
[job]
kind = "train"
name = "{name}"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = {epochs}, calibrate = "umbrella" }}
[engine]
name = "{engine}"
rounds_per_epoch = 4  # rounds enough to stop or lose a worker in
[output]
dir = "{out}"
checkpoint_rounds = {every}
"""


def prep_data(tmp_path_factory):
    """The jobs' data: 24,000 synthetic rows in row groups of 2,048."""
    from bigrate.data.prep import prep_synth

    d = tmp_path_factory.mktemp("wl") / "syn"
    prep_synth(d, rows=24_000, features=800, row_group_size=2048, progress=False)
    return d


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prep_data(tmp_path_factory)


def run_job(tmp_path, data, engine, address, name="runs"):
    out = tmp_path / name
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = job_file(tmp_path, train_body(data, out, engine))
    t0 = time.monotonic()
    p = run_cli("run", job, "--address", address, timeout=BOUND + 60)
    return p, time.monotonic() - t0, out


def same_model(a, b):
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)
    assert a.multiplier_ == b.multiplier_


@functools.cache
def reference(data, epochs: int) -> tuple:
    """The model and metrics of the job, uninterrupted: its rounds on the local engine
    with the data dealt into two shares (the clusters' two workers), evaluated in
    this process."""
    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.engines.local import LocalEngine
    from bigrate.linear.distributed import fit_distributed
    from bigrate.runner.job import evaluate_model

    est = NeymanPearsonSGD(
        rho=0.05, epochs=epochs, calibrate="umbrella", random_state=0
    )
    ds = ShardedDataset(data)
    fit_distributed(est, ds, LocalEngine(), workers=2, progress=False,
                    rounds_per_epoch=4)  # fmt: skip
    metrics = json.loads(json.dumps(evaluate_model(est, ds, ds.splits)))
    return est, metrics


def check_phase(tmp_path, data, engine, address, fault_file, phase):
    kills = PHASES[phase]
    # a Dask nanny's new worker joins ~0.5-1 s after the loss: the calls after it are
    # slowed so that the job still runs then; a new Ray actor is made at the next call
    arm(fault_file, kills, delay=0.1 if engine == "dask" else 0.0)
    try:
        p, seconds, out = run_job(tmp_path, data, engine, address)
    finally:
        arm(fault_file, None)
    assert p.returncode == 0, p.stderr[-3000:]
    for target, n in kills:
        assert fired(fault_file, target, n), f"no worker was killed at {target} {n}"
    assert seconds < BOUND, f"{phase}: the run took {seconds:.0f} s"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    run = only_run(out)
    ev = events(run)
    kinds = [e["event"] for e in ev]
    assert kinds.count("worker_lost") >= len(kills), (phase, kinds)
    # the replacement of a worker lost before the evaluation joined while the job ran
    assert "worker_joined" in kinds, (phase, kinds)
    ref_model, ref_metrics = reference(data, EPOCHS)
    same_model(load_model(run / "model"), ref_model)
    got = json.loads((run / "metrics.json").read_text())["evaluation"]
    assert got == ref_metrics


# ------------------------------------------------------------------------------ Dask


@pytest.fixture(scope="module")
def dask_faulty(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("dask-faults")
    fault_file = d / "fault"
    address, sched, workers = start_dask(fault_file)
    try:
        yield address, fault_file
    finally:
        for p in workers + [sched]:
            stop_group(p)


@pytest.mark.parametrize("phase", list(PHASES))
def test_dask_worker_lost_at_every_phase(tmp_path, data, dask_faulty, phase):
    address, fault_file = dask_faulty
    check_phase(tmp_path, data, "dask", address, fault_file, phase)


# ------------------------------------------------------------------------------- Ray


# ------------------------------------------------------- a lost scheduler or head


def wait_for_checkpoint(out, proc, at_least=4, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        for run in out.glob("*/events.jsonl") if out.exists() else []:
            ck = [e for e in events(run.parent) if e["event"] == "checkpoint"]
            if ck and ck[-1]["round"] >= at_least:
                return run.parent
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


def check_cluster_lost(tmp_path, data, engine, address, kill, restart, what):
    """A job whose scheduler or head is killed (``kill()``) after a checkpoint ends in
    one line naming it, what is saved and the command that resumes; on a new cluster
    (``restart()`` gives its address) that command finishes with the model of an
    uninterrupted run there. Rounds are slowed (50 ms a task) so that the kill lands
    mid-training."""
    (tmp_path / "nofault").write_text("slow 0.05\n")
    out = tmp_path / "runs"
    body = train_body(data, out, engine, epochs=8, every=4, name="lost")
    proc = start_cli("run", job_file(tmp_path, body), "--address", address, text=True)
    run = wait_for_checkpoint(out, proc)
    kill()
    t = time.monotonic()
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - t
    assert proc.returncode == 75, err[-3000:]
    assert took < 30, f"{took:.0f} s from the kill to the end"
    assert "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"bigrate: the {what} at {address} was lost at round "), line
    ck = max(e["round"] for e in events(run) if e["event"] == "checkpoint")
    assert f"the checkpoint after round {ck} is saved" in line, line
    assert line.endswith(f"Continue with: bigrate resume {run} --address {address}")
    st = run_cli("status", run, check=True).stdout
    assert "state    interrupted: " in st and "bigrate resume" in st
    (tmp_path / "nofault").unlink()
    new = restart()
    p = run_cli("resume", run, "--address", new, "--quiet", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = [e for e in events(run) if e["event"] == "resumed"]
    assert resumed and resumed[-1]["from_round"] == ck
    same_model(load_model(run / "model"), reference(data, 8)[0])


def test_lost_dask_scheduler_says_how_to_resume(tmp_path, data):
    fault_file = tmp_path / "nofault"
    address, sched, workers = start_dask(fault_file)
    procs = [sched, *workers]
    try:

        def kill():
            os.killpg(sched.pid, signal.SIGKILL)

        def restart():
            for w in workers:
                stop_group(w)
            new, s2, w2 = start_dask(fault_file)
            procs.extend([s2, *w2])
            return new

        check_cluster_lost(
            tmp_path, data, "dask", address, kill, restart, "Dask scheduler"
        )
    finally:
        for p in procs:
            stop_group(p)


def test_a_killed_scheduler_is_found_lost_within_the_reconnect_window(tmp_path):
    """check_cluster asks the scheduler afresh; a dead one is lost within
    RECONNECT_SECONDS whether or not the client has seen its connection close yet.
    (distributed's scheduler_info() would retry connecting to the dead address for the
    client's whole connect timeout, 30 s, when it had not: a CI run once took 31 s.)"""
    from bigrate.engines import ClusterLost
    from bigrate.engines.dask import RECONNECT_SECONDS, DaskEngine

    address, sched, workers = start_dask(tmp_path / "nofault", n_workers=1)
    try:
        eng = DaskEngine(address=address, timeout=30)
        try:
            eng.check_cluster()  # answers while it lives
            os.killpg(sched.pid, signal.SIGKILL)
            sched.wait(10)
            t = time.monotonic()
            with pytest.raises(ClusterLost, match="scheduler at"):
                for _ in range(100):  # the first call may still find it, or not
                    eng.check_cluster()
                    eng.workers()
            assert time.monotonic() - t < RECONNECT_SECONDS + 5
        finally:
            eng.close()
    finally:
        for p in [sched, *workers]:
            stop_group(p)


class DroppingProxy:
    """A TCP relay on 127.0.0.1 in front of a scheduler that can drop every connection
    through it and refuse new ones for a while: a brief network drop, after which the
    same scheduler answers again."""

    def __init__(self, target_port: int):
        import threading

        self.target = target_port
        self.down_until = 0.0
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while not self.closed:
            try:
                a, _ = self.server.accept()
            except OSError:
                return
            if time.monotonic() < self.down_until:
                a.close()
                continue
            b = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.socks += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(
                    target=self._pump, args=(src, dst), daemon=True
                ).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self, seconds: float):
        self.down_until = time.monotonic() + seconds
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.server.close()
        self.drop(0)


def test_a_brief_drop_of_the_scheduler_connection_is_not_a_lost_cluster(tmp_path):
    """While the client connects again to the same scheduler (a network drop of a
    second), asking for the workers or checking the cluster waits for it instead of
    calling the cluster lost."""
    from bigrate.engines.dask import DaskEngine

    address, sched, workers = start_dask(tmp_path / "nofault", n_workers=1)
    proxy = DroppingProxy(int(address.rsplit(":", 1)[1]))
    try:
        eng = DaskEngine(address=f"tcp://127.0.0.1:{proxy.port}", timeout=30)
        try:
            before = eng.workers()
            assert len(before) == 1
            proxy.drop(1.5)
            t = time.monotonic()
            while eng.client.status != "connecting":
                assert time.monotonic() - t < 10, eng.client.status
                time.sleep(0.01)
            assert eng.workers() == before  # waited for the client to reconnect
            assert time.monotonic() - t >= 1.0
            eng.check_cluster()
            assert eng.poll_events() == []
        finally:
            eng.close()
    finally:
        proxy.close()
        for p in [sched, *workers]:
            stop_group(p)
