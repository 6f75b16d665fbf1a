"""The life of a run as a user sees it: dead cluster addresses, failures recorded with
whether resume can help, `bigrate runs`, NAME-LATEST, permissions, broken pipes."""

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest

from tests.conftest import run_cli
from tests.runner.test_jobs import job_file, only_run, train_job


def dead_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "engine,address", [("dask", "tcp://127.0.0.1:{port}"), ("ray", "127.0.0.1:{port}")]
)
def test_dead_address_fails_in_one_line_without_a_run_directory(
    tmp_path,
    synth,
    engine,
    address,
):
    address = address.format(port=dead_port())
    body = train_job(synth, tmp_path / "runs", engine=engine)
    body = body.replace(f'name = "{engine}"', f'name = "{engine}"\ntimeout = 3')
    t0 = time.time()
    p = run_cli("run", job_file(tmp_path, body), "--address", address, timeout=120)
    took = time.time() - t0
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("bigrate: error: cannot reach")
    assert address in lines[0] and "within 3 s" in lines[0]
    assert "Traceback" not in p.stderr and took < 60
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


class _Server:
    """A loopback server that greets each connection with ``banner`` (None: says
    nothing), as an SSH daemon or a busy HTTP server would."""

    def __init__(self, banner: bytes | None):
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.banner, self.conns = banner, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.banner:
                c.sendall(self.banner)

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("engine", ["dask", "ray"])
@pytest.mark.parametrize(
    "banner, answered",
    [(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", "answered 'SSH-2.0-OpenSSH_9.2p1 Debian-2'"),
     (None, "accepted the connection but said nothing in 3 s")],
    ids=["banner", "silent"],
)  # fmt: skip
def test_an_address_that_is_not_a_cluster_fails_in_one_line(
    tmp_path, synth, engine, banner, answered
):
    server = _Server(banner)
    try:
        address = ("tcp://" if engine == "dask" else "") + f"127.0.0.1:{server.port}"
        body = train_job(synth, tmp_path / "runs", engine=engine)
        body = body.replace(f'name = "{engine}"', f'name = "{engine}"\ntimeout = 3')
        t0 = time.time()
        p = run_cli("run", job_file(tmp_path, body), "--address", address, timeout=120)
        took = time.time() - t0
    finally:
        server.close()
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"bigrate: error: the server at {address} {answered}")
    assert "Traceback" not in p.stderr and took < 30
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_manifest_that_lies_is_refused_before_any_cluster_starts(tmp_path, synth):
    data = tmp_path / "data"
    shutil.copytree(synth, data)
    man = json.loads((data / "manifest.json").read_text())
    true_neg = man["rows"]["train"]["neg"]
    man["rows"]["train"]["neg"] = true_neg + 1943
    (data / "manifest.json").write_text(json.dumps(man))
    body = train_job(data, tmp_path / "runs", engine="dask")
    p = run_cli("run", job_file(tmp_path, body))
    assert p.returncode == 2, p.stderr
    assert f"rows['train']['neg'] is {true_neg + 1943:,} but its files hold" in p.stderr
    assert "engine" not in p.stderr and "Traceback" not in p.stderr  # none started
    assert not (tmp_path / "runs").exists()
    p = run_cli("train", data, "--engine", "dask")
    assert p.returncode == 2 and "but its files hold" in p.stderr


def test_failure_is_recorded_and_status_says_resume_cannot_help(tmp_path, synth):
    data = tmp_path / "data"
    shutil.copytree(synth, data)
    m = json.loads((data / "manifest.json").read_text())
    m["n_features"] = 100  # the shards hold larger indices: a DataError when read
    (data / "manifest.json").write_text(json.dumps(m))
    p = run_cli("run", job_file(tmp_path, train_job(data, tmp_path / "runs", epochs=1)))
    assert p.returncode == 2 and "outside [0, 100)" in p.stderr
    run = only_run(tmp_path / "runs")
    ev = [json.loads(line) for line in (run / "events.jsonl").open()]
    failed = [e for e in ev if e["event"] == "run_failed"]
    assert failed and failed[-1]["resumable"] is False
    assert "DataError" in failed[-1]["error"]
    st = run_cli("status", run, check=True).stdout
    assert "state    failed:" in st and "resuming cannot help" in st
    listing = run_cli("runs", tmp_path / "runs", check=True).stdout
    assert run.name in listing and "failed" in listing


def test_runs_lists_states_and_latest_names_the_newest_complete_run(
    tmp_path,
    synth,
):
    out = tmp_path / "runs"
    body = train_job(synth, out, epochs=1).replace('name = "t"', 'name = "a9a-np"')
    for _ in range(2):
        run_cli("run", job_file(tmp_path, body), "--quiet", check=True)
        time.sleep(1.1)  # run directories are stamped to the second
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(runs) == 2
    listing = run_cli("runs", out, check=True).stdout.splitlines()
    assert [line.split()[0] for line in listing[1:]] == [r.name for r in runs]
    assert all("complete" in line for line in listing[1:])
    # the shipped evaluate job names runs/a9a-np-LATEST/model
    shipped = (
        open(os.path.join(os.path.dirname(__file__), "../../jobs/a9a_evaluate.toml"))
        .read()
        .replace('path = "data/a9a"', f'path = "{synth}"')
        .replace('dir = "runs"', f'dir = "{tmp_path / "evals"}"')
    )
    (tmp_path / "eval.toml").write_text(shipped)
    p = run_cli("run", tmp_path / "eval.toml", cwd=tmp_path, check=True)
    ev = only_run(tmp_path / "evals")
    metrics = json.loads((ev / "metrics.json").read_text())
    assert metrics["model"] == str(runs[-1] / "model")
    assert set(metrics["evaluation"]) == {"val", "test"}
    assert "test" in p.stdout
    st = run_cli("status", out / "a9a-np-LATEST", check=True).stdout
    assert str(runs[-1]) in st
    missing = run_cli("status", out / "nothing-LATEST")
    assert (
        missing.returncode == 2 and "no complete run of job 'nothing'" in missing.stderr
    )


def test_train_out_refuses_an_existing_model_without_overwrite(tmp_path, synth):
    args = ("train", synth, "--engine", "local", "--epochs", "1", "--quiet")
    run_cli(*args, "--out", tmp_path / "m", check=True)
    before = (tmp_path / "m" / "model" / "arrays.npz").read_bytes()
    p = run_cli(*args, "--out", tmp_path / "m")
    assert p.returncode == 2 and "--overwrite" in p.stderr
    assert (tmp_path / "m" / "model" / "arrays.npz").read_bytes() == before
    run_cli(*args, "--out", tmp_path / "m", "--overwrite", check=True)


def test_run_directory_files_follow_the_umask(tmp_path, synth):
    p = run_cli("run", job_file(tmp_path, train_job(synth, tmp_path / "runs", epochs=1)), "--quiet",
                check=True)  # fmt: skip
    run = only_run(tmp_path / "runs")
    mask = os.umask(0)
    os.umask(mask)
    run_cli("report", run, check=True)
    for f in ["config.json", "env.json", "metrics.json", "events.jsonl", "job.toml",
              "model/model.json", "model/arrays.npz", "report/roc.png"]:  # fmt: skip
        mode = stat.S_IMODE((run / f).stat().st_mode)
        assert mode == 0o666 & ~mask, (f, oct(mode))
    for d in ["model", "report", "results"]:
        assert stat.S_IMODE((run / d).stat().st_mode) == 0o777 & ~mask, d
    assert p.returncode == 0


def test_info_json_into_a_closed_pipe(synth):
    cmd = f"{sys.executable} -m bigrate.cli info {synth} --json | head -3"
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    assert len(p.stdout.splitlines()) == 3
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def test_version():
    from bigrate import __version__

    p = run_cli("--version", check=True)
    assert p.stdout.strip() == f"bigrate {__version__}"


def test_a_killed_driver_leaves_no_process_of_its_embedded_ray(tmp_path, synth):
    """SIGKILL to `bigrate train --engine ray` mid-training: every process the
    embedded runtime had started is gone soon after (before the reaper, Ray's
    dashboard and runtime-env agents stayed, reparented to init, for good)."""
    import psutil

    from tests.conftest import start_cli

    out = tmp_path / "run"
    proc = start_cli("train", synth, "--engine", "ray", "--workers", "2", "--rho",
                     "0.1", "--epochs", "400", "--out", out)  # fmt: skip
    t0 = time.time()
    while not (out / "events.jsonl").exists() or (
        "train_started" not in (out / "events.jsonl").read_text()
    ):
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() - t0 < 180
        time.sleep(0.2)
    time.sleep(2.0)
    runtime = [
        (p, p.create_time()) for p in psutil.Process(proc.pid).children(recursive=True)
    ]
    assert len(runtime) >= 5  # GCS, raylet, agents, workers, the reaper
    proc.kill()
    proc.communicate(timeout=60)

    def alive():
        out = []
        for p, started in runtime:
            try:
                if p.is_running() and p.create_time() == started:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        out.append(p)
            except psutil.Error:
                pass
        return out

    t0 = time.time()
    while alive() and time.time() - t0 < 30:
        time.sleep(0.5)
    left = alive()
    for p in left:  # this test's own, by process id: never left running
        p.kill()
    assert not left, [(p.pid, p.name()) for p in left]
