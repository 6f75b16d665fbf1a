"""Jobs submitted by address to real clusters started with the scripts in cluster/,
on 127.0.0.1: a Dask scheduler with two workers, and a Ray head node. A worker is killed
during each job and the job still completes with the right result."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, descendants, kill_a_fitting_worker, start_cli
from tests.runner.test_jobs import job_file, only_run, sweep_job, train_job

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**kw):
    e = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", **kw)
    return e


def listening_ports(pids) -> set:
    out = set()
    for pid in pids:
        try:
            for c in psutil.Process(pid).net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add(c.laddr.ip.removeprefix("::ffff:"))  # v4-mapped
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from bigrate.data.prep import prep_synth

    d = tmp_path_factory.mktemp("cl") / "syn"
    prep_synth(d, rows=120_000, features=3000, progress=False)
    return d


@pytest.fixture(scope="module")
def dask_cluster():
    port = free_port()
    sched = subprocess.Popen(
        [str(REPO / "cluster/dask/start-scheduler.sh")],
        env=env(PORT=str(port), DASHBOARD="none"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    address = f"tcp://127.0.0.1:{port}"
    workers = [
        subprocess.Popen(
            [str(REPO / "cluster/dask/start-worker.sh")],
            env=env(SCHEDULER=address, MEMORY_LIMIT="2GiB"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    from dask.distributed import Client

    with Client(address, timeout="60s") as c:
        c.wait_for_workers(2, timeout=120)
    yield address, sched, workers
    for p in workers + [sched]:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in workers + [sched]:
        p.wait(timeout=60)


def test_dask_scripts_bind_loopback(dask_cluster):
    address, sched, workers = dask_cluster
    pids = (
        [sched.pid]
        + [
            c.pid
            for w in workers
            for c in psutil.Process(w.pid).children(recursive=True)
        ]
        + [w.pid for w in workers]
    )
    assert listening_ports(pids) <= {"127.0.0.1"}


def test_dask_worker_script_turns_the_memory_pause_off(dask_cluster):
    from dask.distributed import Client

    with Client(dask_cluster[0], timeout="60s") as c:
        # a lambda travels by value: these workers cannot import the tests package
        got = c.run(
            lambda: __import__("dask").config.get("distributed.worker.memory.pause")
        )
    assert len(got) == 2 and set(got.values()) == {False}


def test_train_job_on_dask_by_address_survives_a_killed_worker(
    tmp_path, synth, dask_cluster
):
    address, _, workers = dask_cluster
    body = train_job(synth, tmp_path / "runs", engine="dask", epochs=12)
    proc = start_cli("run", job_file(tmp_path, body), "--address", address, text=True)
    # wait for training rounds to start, then kill one worker process (not its nanny)
    victim = None
    t0 = time.time()
    while time.time() - t0 < 120 and victim is None:
        run = (
            list((tmp_path / "runs").glob("t-*"))
            if (tmp_path / "runs").exists()
            else []
        )
        ev = run[0] / "events.jsonl" if run else None
        if ev is not None and ev.exists() and "train_started" in ev.read_text():
            time.sleep(1.0)
            # the worker process under the first nanny: a process id the workers report
            # themselves, checked to be below the nanny this test started
            from distributed import Client

            with Client(address, timeout=10) as c:
                known = set(c.run(os.getpid).values())
            mine = {k.pid for k in descendants(workers[0].pid)}
            victim = psutil.Process((known & mine).pop())
            victim.kill()
        time.sleep(0.05)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert victim is not None
    assert f"dask engine ({address})" in err
    run = only_run(tmp_path / "runs")
    lost = [json.loads(line) for line in (run / "events.jsonl").open()]
    lost = [e for e in lost if e["event"] == "worker_lost"]
    assert lost and lost[0]["worker"].startswith("tcp://127.0.0.1:")
    assert f"worker {lost[0]['worker']} lost" in err
    m = json.loads((run / "metrics.json").read_text())
    assert m["evaluation"]["test"]["pfa"] < 0.1 and m["evaluation"]["test"]["pnd"] < 0.8
    # the rounds were combined worker to worker, by the job's default
    assert m["engine"]["merge"] == "direct" and m["engine"]["calls"] == "actors"


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def ray_cluster(short_tmp):
    """A Ray head started by cluster/ray/start-head.sh with --block, as a child of this
    test in its own process group, stopped by that group alone (not by Ray's own stop
    command, which would stop every Ray cluster on the machine)."""
    port = free_port()
    e = env(PORT=str(port), NUM_CPUS="2", RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.Popen(
        [
            str(REPO / "cluster/ray/start-head.sh"),
            "--block",
            "--temp-dir",
            str(short_tmp / "ray"),
        ],
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        t0 = time.time()
        while not _port_open(port):
            assert head.poll() is None, head.stderr.read()[-3000:]
            assert time.time() - t0 < 180, "the Ray head did not come up in 180 s"
            time.sleep(0.2)
        time.sleep(2.0)  # the raylet registers after the GCS listens
        yield f"127.0.0.1:{port}", head
    finally:
        _stop_group(head)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group this test started, SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    # anything of the group still alive (a worker that ignored SIGTERM)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_sweep_on_ray_by_address_survives_a_killed_worker(tmp_path, synth, ray_cluster):
    address, head = ray_cluster
    assert listening_ports([p.pid for p in descendants(head.pid)]) <= {"127.0.0.1"}
    body = sweep_job(
        synth,
        tmp_path / "runs",
        grid="alpha = [1e-5, 1e-4, 1e-3]",
        cv=2,
        engine="ray",
        epochs=6,
    )
    proc = start_cli("run", job_file(tmp_path, body), "--address", address, text=True)
    killed = kill_a_fitting_worker(tmp_path / "runs", head.pid, proc)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert killed is not None, "no running task was found to kill"
    run = only_run(tmp_path / "runs")
    res = [json.loads(f.read_text()) for f in (run / "results").glob("*.json")]
    assert len(res) == 6 and all(r["status"] == "ok" for r in res)
    assert f"ray engine ({address})" in err
    assert "sweep: best point" in out


def test_embedded_ray_binds_loopback_and_maps():
    from bigrate.engines.ray import RayEngine

    with RayEngine(n_workers=2) as eng:
        assert eng.node_addresses() == ["127.0.0.1"]
        mine = descendants(os.getpid())  # the embedded runtime's processes
        assert listening_ports([p.pid for p in mine]) <= {"127.0.0.1"}
        handle = eng.put(list(range(10)))
        got = dict(eng.map(_square_sum, [(handle, k) for k in range(4)]))
        assert got == {k: sum(x * x for x in range(10)) + k for k in range(4)}
        errs = dict(eng.map(_boom, [(1,)]))
        assert "ZeroDivisionError" in str(errs[0])
        from tests.engines.batching import (
            check_allreduce,
            check_map_dynamic,
            check_map_guided,
            check_pinned,
            check_sweep_batches_short_tasks,
        )

        check_allreduce(eng)
        check_allreduce(eng, on="direct")
        from tests.engines.batching import tree_combine, tree_task

        with eng.pinned() as pool:  # the slots' own listeners: on loopback too
            pool.allreduce(tree_task, [(k, 3, 1.0) for k in range(3)], tree_combine,
                           shared="s", on="direct")  # fmt: skip
            ports = listening_ports([p.pid for p in descendants(os.getpid())])
            assert ports <= {"127.0.0.1"} and pool.direct_failures == 0
        check_map_dynamic(eng)
        check_map_guided(eng)
        check_sweep_batches_short_tasks(eng)

        def kill(pid):  # an actor process of this test's embedded runtime
            assert pid in [p.pid for p in descendants(os.getpid())]
            os.kill(pid, signal.SIGKILL)

        check_pinned(eng, "actors", kill)
        # the actors are the engine's: a later pool (the next fit) finds them up,
        # and they hold no CPU: plain tasks run beside them
        from tests.engines.batching import pid_and_calls

        with eng.pinned() as pool:
            pids = [r[0] for r in pool.run(pid_and_calls, [(0,), (1,)])]
        with eng.pinned() as pool:
            assert [r[0] for r in pool.run(pid_and_calls, [(0,), (1,)])] == pids
            ray = eng._ray
            busy = [ray.remote(_square_sum).remote([1, 2], k) for k in range(2)]
            assert ray.get(busy, timeout=60) == [5, 6]


def _square_sum(xs, k):
    return sum(x * x for x in xs) + k


def _boom(x):
    return x / 0


def test_train_sets_the_embedded_dask_workers_memory_limit(tmp_path, synth):
    """`bigrate train --memory-limit` reaches the embedded Dask workers: a fit there
    keeps a quarter of that limit as its row-group cache (recorded in the model)."""
    from tests.conftest import run_cli

    p = run_cli("train", synth, "--engine", "dask", "--workers", "1",
                "--memory-limit", "800MiB", "--epochs", "1", "--out", tmp_path / "r",
                "--quiet")  # fmt: skip
    assert p.returncode == 0, p.stderr
    model = json.loads((tmp_path / "r" / "model" / "model.json").read_text())
    assert model["fitted"]["engine_"]["cache_mb"] == pytest.approx(200.0)
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["job"]["memory_limit"] == "800MiB"
    p = run_cli("train", synth, "--engine", "local", "--memory-limit", "1GiB",
                "--out", tmp_path / "r2")  # fmt: skip
    assert p.returncode == 2
    assert (
        "engine.memory_limit: sets the workers' limit of an embedded Dask" in p.stderr
    )
