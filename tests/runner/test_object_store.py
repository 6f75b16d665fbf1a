"""Datasets on object storage, end to end, against a real S3 API: moto's standalone
server on 127.0.0.1 (tests/s3server.py), which s3fs talks to over HTTP. Prep streams
shards up and commits by writing the manifest last; every command reads s3:// datasets;
credentials come from the standard variables or a job's storage options naming
environment variables, and never land in a run directory; clusters whose workers share
no directory with the driver train, sweep and resume on data that is only on S3."""

import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, random_svmlight, run_cli, start_cli, wait_for_results
from tests.runner.test_clusters import _stop_group, free_port
from tests.runner.test_clusters import env as cluster_env
from tests.runner.test_jobs import job_file, only_run, sweep_job, train_job
from tests.s3server import start_s3_server

BUCKET = "bgr"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = start_s3_server(tmp_path_factory.mktemp("moto") / "requests.log")
    try:
        server.fs().mkdir(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_synth(s3):
    """RCV1-shaped synthetic shards written straight to S3 by `bigrate prep synth`:
    they never exist on this machine's disk as a dataset."""
    url = f"s3://{BUCKET}/data/syn"
    run_cli("prep", "synth", "--rows", "30000", "--features", "2000", "--out", url,
            "--quiet", env=s3.env(), check=True)  # fmt: skip
    return url


def _svm_input(s3, tmp_path, n=3000, name="in.svm", bad_tail=False):
    local = random_svmlight(tmp_path / name, n, 40, seed=3)
    if bad_tail:
        with local.open("a") as f:
            f.write("1 3:not-a-number\n")
    s3.fs().put_file(str(local), f"{BUCKET}/inputs/{name}")
    return local, f"s3://{BUCKET}/inputs/{name}"


def test_prep_from_s3_to_s3_commits_the_manifest_last(s3, tmp_path):
    local, url = _svm_input(s3, tmp_path)
    out = f"s3://{BUCKET}/ds/plain"
    opts = ["--rows-per-file", "512", "--row-group-size", "256", "--quiet"]
    before = len(s3.requests())
    run_cli("prep", "svmlight", url, "--out", out, *opts, env=s3.env(), check=True)
    puts = [r.split()[1] for r in s3.requests()[before:] if r.startswith("PUT ")]
    mine = [p for p in puts if p.startswith(f"/{BUCKET}/ds/plain/")]
    assert mine[-1] == f"/{BUCKET}/ds/plain/manifest.json"  # the commit, last
    assert sum(p.endswith(".parquet") for p in mine) >= 6  # streamed up part by part
    # the same bytes as a prep of the local file into a local directory
    run_cli("prep", "svmlight", local, "--out", tmp_path / "plain", *opts, check=True)
    here = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    fs = s3.fs()
    there = json.loads(fs.cat(f"{BUCKET}/ds/plain/manifest.json"))
    assert [(f["path"], f["sha256"]) for f in there["files"]] == [
        (f["path"], f["sha256"]) for f in here["files"]
    ]
    blob = fs.cat(f"{BUCKET}/ds/plain/{there['files'][0]['path']}")
    assert hashlib.sha256(blob).hexdigest() == there["files"][0]["sha256"]
    # info and info --verify read it where it is
    p = run_cli("info", out, env=s3.env())
    assert p.returncode == 0 and out in p.stdout, p.stderr
    p = run_cli("info", out, "--verify", env=s3.env())
    assert p.returncode == 0 and "verified" in p.stdout, p.stderr
    # a second prep to the same prefix is refused without --overwrite
    p = run_cli("prep", "svmlight", url, "--out", out, *opts, env=s3.env())
    assert p.returncode == 2 and "already holds a dataset" in p.stderr


def test_opening_a_dataset_reads_its_manifest_and_lists_nothing(
    s3, tmp_path, monkeypatch
):
    from bigrate.data import ShardedDataset

    _, url = _svm_input(s3, tmp_path, name="open.svm")
    out = f"s3://{BUCKET}/ds/open"
    run_cli("prep", "svmlight", url, "--out", out, "--rows-per-file", "256",
            "--row-group-size", "256", "--quiet", env=s3.env(), check=True)  # fmt: skip
    opts = {"key": "${BGR_T_KEY}", "secret": "${BGR_T_SECRET}",
            "client_kwargs": {"endpoint_url": s3.endpoint}}  # fmt: skip
    monkeypatch.setenv("BGR_T_KEY", s3.KEY)
    monkeypatch.setenv("BGR_T_SECRET", s3.SECRET)
    before = len(s3.requests())
    ds = ShardedDataset(out, storage_options=opts)
    reqs = s3.requests()[before:]
    assert len(ds.files()) >= 10
    assert len(reqs) <= 3, reqs
    assert not [r for r in reqs if "list-type" in r or "?prefix" in r], reqs


def test_a_prep_killed_midway_leaves_no_readable_dataset(s3, tmp_path, monkeypatch):
    from bigrate.data import ShardedDataset

    _, url = _svm_input(s3, tmp_path, n=60_000, name="big.svm")
    out = f"s3://{BUCKET}/ds/broken"
    before = len(s3.requests())
    proc = start_cli("prep", "svmlight", url, "--out", out, "--rows-per-file", "256",
                     "--row-group-size", "256", "--quiet", env=s3.env())  # fmt: skip
    t0 = time.time()
    while (
        len([r for r in s3.requests()[before:] if r.startswith("PUT /bgr/ds/broken/")])
        < 20
    ):
        assert proc.poll() is None and time.time() - t0 < 120
        time.sleep(0.02)
    proc.kill()  # dies outright: no clean-up runs
    proc.communicate(timeout=60)
    staged = list(Path(tempfile.gettempdir()).glob(f"bigrate-prep-{proc.pid}-*"))
    assert staged  # its local staging directory is left behind ...
    puts = [r for r in s3.requests()[before:] if r.startswith("PUT /bgr/ds/broken")]
    assert any(".parquet" in r for r in puts)  # parts went up before the kill
    assert not any("manifest.json" in r for r in puts)
    fs = s3.fs()
    assert not fs.exists(f"{BUCKET}/ds/broken/manifest.json")
    p = run_cli("info", out, env=s3.env())
    assert p.returncode == 2 and "no committed manifest.json" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    monkeypatch.setenv("K", s3.KEY)
    monkeypatch.setenv("S", s3.SECRET)
    opts = {"key": "${K}", "secret": "${S}",
            "client_kwargs": {"endpoint_url": s3.endpoint}}  # fmt: skip
    with pytest.raises(FileNotFoundError, match="ds/broken: no committed manifest"):
        ShardedDataset(out, storage_options=opts)
    # the parts left behind are no obstacle to the prep run again
    p = run_cli("prep", "svmlight", url, "--out", out, "--rows-per-file", "4096",
                "--row-group-size", "4096", "--quiet", env=s3.env())  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert not any(d.exists() for d in staged)  # ... until the next prep removes it
    ds = ShardedDataset(out, storage_options=opts)
    ds.check()
    # and are gone: the prefix holds the new dataset's files and nothing else
    held = {k.split("/ds/broken/", 1)[1] for k in fs.find(f"{BUCKET}/ds/broken")}
    assert held == {f.path for f in ds.files()} | {"manifest.json"}


def test_an_overwrite_killed_midway_leaves_the_old_dataset_readable(s3, tmp_path):
    _, small = _svm_input(s3, tmp_path, n=3000, name="old.svm")
    _, big = _svm_input(s3, tmp_path, n=60_000, name="new.svm")
    out = f"s3://{BUCKET}/ds/replaced"
    opts = ["--rows-per-file", "256", "--row-group-size", "256", "--quiet"]
    run_cli("prep", "svmlight", small, "--out", out, *opts, env=s3.env(), check=True)
    fs = s3.fs()
    old = fs.cat(f"{BUCKET}/ds/replaced/manifest.json")
    old_keys = set(fs.find(f"{BUCKET}/ds/replaced"))
    before = len(s3.requests())
    proc = start_cli("prep", "svmlight", big, "--out", out, "--overwrite", *opts,
                     env=s3.env())  # fmt: skip
    t0 = time.time()
    while (
        len(
            [r for r in s3.requests()[before:] if r.startswith("PUT /bgr/ds/replaced/")]
        )
        < 20
    ):
        assert proc.poll() is None and time.time() - t0 < 120
        time.sleep(0.02)
    proc.kill()  # dies outright, halfway through replacing the dataset
    proc.communicate(timeout=60)
    reqs = s3.requests()[before:]
    assert not [r for r in reqs if r.startswith("DELETE ")], reqs  # nothing removed
    # the old dataset is still committed, whole and readable
    assert fs.cat(f"{BUCKET}/ds/replaced/manifest.json") == old
    p = run_cli("info", out, "--verify", env=s3.env())
    assert p.returncode == 0 and "verified" in p.stdout, p.stderr
    assert "old.svm" in p.stdout, p.stdout  # its source, not the new one's
    # the new parts went up under keys of their own, next to the old ones
    fs.invalidate_cache()
    now = set(fs.find(f"{BUCKET}/ds/replaced"))
    assert old_keys < now
    # an overwrite run to the end replaces it, and only the new dataset's files remain
    # (the old dataset's and the killed run's are gone)
    run_cli("prep", "svmlight", small, "--out", out, "--overwrite", "--rows-per-file",
            "1024", "--row-group-size", "512", "--quiet", env=s3.env(),
            check=True)  # fmt: skip
    new = json.loads(fs.cat(f"{BUCKET}/ds/replaced/manifest.json"))
    assert new["rows_per_file"] == 1024
    fs.invalidate_cache()
    held = {k.split("/ds/replaced/", 1)[1] for k in fs.find(f"{BUCKET}/ds/replaced")}
    assert held == {f["path"] for f in new["files"]} | {"manifest.json"}
    p = run_cli("info", out, "--verify", env=s3.env())
    assert p.returncode == 0 and "verified" in p.stdout, p.stderr


def test_a_missing_backend_is_one_line(tmp_path):
    p = run_cli("info", "gs://some-bucket/data")  # gcsfs is not installed
    assert p.returncode == 2 and "gcsfs" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = run_cli("prep", "svmlight", "gs://some-bucket/in.svm", "--out",
                tmp_path / "x")  # fmt: skip
    assert p.returncode == 2 and "gcsfs" in p.stderr and "Traceback" not in p.stderr


def test_credentials_from_named_variables_are_never_written(s3, s3_synth, tmp_path):
    secret = "s3cr3t-" + os.urandom(8).hex()
    body = train_job(s3_synth, tmp_path / "runs", engine="dask", epochs=2)
    body = body.replace(
        "[model]",
        '[data.storage_options]\nkey = "${BGR_KEY}"\nsecret = "${BGR_SECRET}"\n'
        f'client_kwargs = {{ endpoint_url = "{s3.endpoint}" }}\n[model]',
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(BGR_KEY=s3.KEY, BGR_SECRET=secret)
    body = body.replace('name = "dask"', 'name = "dask"\nworkers = 2')
    p = run_cli("run", job_file(tmp_path, body), env=env)
    assert p.returncode == 0, p.stderr
    run = only_run(tmp_path / "runs")
    m = json.loads((run / "metrics.json").read_text())
    assert m["evaluation"]["test"]["pfa"] < 0.1
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["job"]["storage_options"]["secret"] == "${BGR_SECRET}"
    for f in run.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert secret not in p.stdout + p.stderr
    # a secret written into the job is refused before anything runs
    bad = body.replace('secret = "${BGR_SECRET}"', f'secret = "{secret}"')
    p = run_cli("run", job_file(tmp_path, bad), env=env)
    assert p.returncode == 2 and "data.storage_options.secret" in p.stderr
    assert secret not in p.stderr
    assert len([d for d in (tmp_path / "runs").iterdir() if d.is_dir()]) == 1


@pytest.fixture(scope="module")
def remote_dask(s3, tmp_path_factory):
    """A Dask scheduler and two workers started by cluster/'s scripts in directories of
    their own (working, local and temp directories that are not the driver's), with
    the standard AWS variables: the only way they reach the data is S3."""
    port = free_port()
    homes = [tmp_path_factory.mktemp(f"dask-node{i}") for i in range(3)]
    sched = subprocess.Popen(
        [str(REPO / "cluster/dask/start-scheduler.sh")],
        env=cluster_env(PORT=str(port), DASHBOARD="none", TMPDIR=str(homes[0])),
        cwd=homes[0], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    address = f"tcp://127.0.0.1:{port}"
    workers = [
        subprocess.Popen(
            [str(REPO / "cluster/dask/start-worker.sh"), "--local-directory", str(h)],
            env=s3.env(
                cluster_env(SCHEDULER=address, MEMORY_LIMIT="2GiB", TMPDIR=str(h))
            ),
            cwd=h,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        for h in homes[1:]
    ]
    try:
        from dask.distributed import Client

        with Client(address, timeout="60s") as c:
            c.wait_for_workers(2, timeout=120)
            cwds = set(c.run(os.getcwd).values())
        assert cwds == {str(h) for h in homes[1:]}
        yield address
    finally:
        for p in workers + [sched]:
            _stop_group(p)


def test_train_and_a_resumed_sweep_on_dask_workers_that_share_no_disk(
    s3, s3_synth, remote_dask, tmp_path
):
    env = s3.env()
    body = train_job(s3_synth, tmp_path / "runs", engine="dask", epochs=3)
    p = run_cli("run", job_file(tmp_path, body), "--address", remote_dask, env=env)
    assert p.returncode == 0, p.stderr
    run = only_run(tmp_path / "runs")
    m = json.loads((run / "metrics.json").read_text())
    assert m["evaluation"]["test"]["pfa"] < 0.1
    # predict and report read the dataset where it is
    p = run_cli("predict", run, s3_synth, "--splits", "test", "--out",
                tmp_path / "pred.parquet", env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    import pyarrow.parquet as pq

    pred = pq.read_table(tmp_path / "pred.parquet")
    assert pred.num_rows == sum(m["evaluation"]["test"][k] for k in ("n_pos", "n_neg"))
    p = run_cli("report", run, env=env)
    assert p.returncode == 0 and (run / "report" / "roc.png").exists(), p.stderr
    # a sweep whose driver is killed outright, resumed: the results finished before
    # the kill are kept, the rest are done
    runs = tmp_path / "sweeps"
    body = sweep_job(s3_synth, runs, grid="alpha = [1e-5, 1e-4, 1e-3]", cv=2,
                     engine="dask", epochs=2)  # fmt: skip
    proc = start_cli("run", job_file(tmp_path, body), "--address", remote_dask,
                     env=env, text=True)  # fmt: skip
    run = wait_for_results(runs, "s-*", 2, proc, timeout=300)
    proc.kill()
    proc.communicate(timeout=60)
    kept = {f.name: f.read_bytes() for f in (run / "results").glob("*.json")}
    assert len(kept) >= 2
    p = run_cli("resume", run, "--address", remote_dask, env=env)
    assert p.returncode == 0, p.stderr
    res = [json.loads(f.read_text()) for f in (run / "results").glob("*.json")]
    assert len(res) == 6 and all(r["status"] == "ok" for r in res)
    assert all((run / "results" / k).read_bytes() == v for k, v in kept.items())
    assert "sweep: best point" in p.stdout


def test_train_on_a_ray_cluster_from_s3(s3, s3_synth, tmp_path, short_tmp):
    port = free_port()
    home = tmp_path / "ray-node"
    home.mkdir()
    head = subprocess.Popen(
        [str(REPO / "cluster/ray/start-head.sh"), "--block", "--temp-dir",
         str(short_tmp / "s3")],
        env=s3.env(cluster_env(PORT=str(port), NUM_CPUS="2",
                               RAY_USAGE_STATS_ENABLED="0", TMPDIR=str(home))),
        cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        from tests.runner.test_clusters import _port_open

        t0 = time.time()
        while not _port_open(port):
            assert head.poll() is None and time.time() - t0 < 180
            time.sleep(0.2)
        time.sleep(2.0)
        body = train_job(s3_synth, tmp_path / "runs", engine="ray", epochs=3)
        p = run_cli("run", job_file(tmp_path, body), "--address",
                    f"127.0.0.1:{port}", env=s3.env())  # fmt: skip
        assert p.returncode == 0, p.stderr
        m = json.loads((only_run(tmp_path / "runs") / "metrics.json").read_text())
        assert m["evaluation"]["test"]["pfa"] < 0.1
        # and a sweep: every fit of the grid a task on the Ray workers, reading S3
        body = sweep_job(s3_synth, tmp_path / "sweeps", grid="alpha = [1e-5, 1e-3]",
                         cv=2, engine="ray", epochs=1)  # fmt: skip
        p = run_cli("run", job_file(tmp_path, body), "--address",
                    f"127.0.0.1:{port}", env=s3.env())  # fmt: skip
        assert p.returncode == 0, p.stderr
        run = only_run(tmp_path / "sweeps")
        res = [json.loads(f.read_text()) for f in (run / "results").glob("*.json")]
        assert len(res) == 4 and all(r["status"] == "ok" for r in res), res
        assert "sweep: best point" in p.stdout
    finally:
        _stop_group(head)


def test_streaming_from_s3_is_the_local_stream_in_one_ranged_get_a_row_group(
    s3, s3_synth, tmp_path, monkeypatch
):
    """The same rows, the same model, as from a local copy; once a file's footer is
    known (kept per process), each row group is one GET and nothing else."""
    from bigrate import NeymanPearsonSGD
    from bigrate.data import ShardedDataset

    for k, v in s3.env({}).items():
        monkeypatch.setenv(k, v)
    local = tmp_path / "copy"
    s3.fs().get(s3_synth.removeprefix("s3://") + "/", str(local) + "/", recursive=True)
    remote, here = ShardedDataset(s3_synth), ShardedDataset(local)
    f = remote.files("train", "neg")[0]
    a = list(remote.iter_file(f, 4096))
    b = list(here.iter_file(f, 4096))
    assert len(a) == len(b) and all(
        (x.X != y.X).nnz == 0 and (x.row_id == y.row_id).all() for x, y in zip(a, b)
    )

    def fit(ds):
        return NeymanPearsonSGD(rho=0.1, epochs=1, calibrate=None, random_state=0).fit(
            ds
        )

    fit(remote)  # footers now known in this process
    before = len(s3.requests())
    m_remote = fit(remote)
    reqs = s3.requests()[before:]
    m_local = fit(here)
    assert (m_remote.coef_ == m_local.coef_).all()
    assert m_remote.intercept_ == m_local.intercept_
    # a row group read is one GET: no HEAD, no listing, no footer again
    assert reqs and not [r for r in reqs if not r.startswith("GET ")], reqs
    assert all("/train/" in r for r in reqs), reqs
