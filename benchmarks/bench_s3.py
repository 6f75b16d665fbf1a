"""Datasets on object storage: what opening one costs, against the same dataset on local
disk, measured in one run on moto's S3 server on 127.0.0.1 (a real HTTP endpoint).

    python benchmarks/bench_s3.py open  [--files 10000] [--rows-per-file 8]
    python benchmarks/bench_s3.py epoch [--rows 400000] [--latency-ms 20] [--vw-python PY]
        [--read-ahead 4,2,0] [--workers 1,2] [--store-cores 1]
    python benchmarks/bench_s3.py clients [--client-mib 160] [--store-cores 1]

Writes a dataset of ``--files`` part files (tiny ones: the cost measured is per file,
not per byte) to the server with bigrate's writer (parts uploaded as they close, the
manifest last) and to a local directory, then for each: the time to open it
(``ShardedDataset``), the requests the server logged for the open (listing requests
counted apart), the time of the manifest-only check (``check(files=False)``, what a job
does before starting on object storage) and the time until the first batch of rows
arrives from a streaming pass. Prints a table and writes benchmarks/out/s3.json.

``epoch``: one epoch of NeymanPearsonSGD streamed from RCV1-shaped synthetic shards on
local disk, from the S3 server, and from the S3 server behind a TCP proxy (a process
of its own) that holds every request ``--latency-ms`` before passing it on (a store
across a network), on 1 worker (in process) and on 2 Dask workers (LocalCluster, 127.0.0.1), each with the
row-group read-ahead on and off; the requests of each S3 epoch from the server's log
and its bytes from the proxy (every reply of the S3 + latency fits passes through it).
With ``--vw-python``, Vowpal Wabbit (run by that interpreter) reads its own cache of
the same train rows, one pass, as the out-of-core peer. Writes
benchmarks/out/s3_epoch.json. ``--store-cores`` pins the server and the proxy to those
cores and the learner to the others.

``clients``: the CPU the client process spends receiving the same bytes with s3fs,
pyarrow's native S3 and botocore (benchmarks/out/s3_clients.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bigrate.data import DatasetWriter, RowBlock, ShardedDataset  # noqa: E402
from tests.s3server import start_s3_server  # noqa: E402


def make(out: str, files: int, rows: int, d: int = 50) -> float:
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    per = {("train", "pos"): 0, ("train", "neg"): 0}
    with DatasetWriter(out, splits=("train",), row_group_size=rows,
                       rows_per_file=rows) as w:  # fmt: skip
        for i in range(files):
            cls = "pos" if i % 2 == 0 else "neg"
            X = sp.random(rows, d, density=0.2, format="csr", random_state=rng,
                          dtype=np.float32)  # fmt: skip
            y = np.full(rows, 1 if cls == "pos" else -1, np.int8)
            ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
            w.write_part("train", cls, per[("train", cls)], RowBlock(X, y, ids))
            per[("train", cls)] += 1
        w.commit(n_features=d, label_mapping={"positive": ["1"], "negative": ["-1"]},
                 preprocessing={}, sources=[])  # fmt: skip
    return time.perf_counter() - t


def measure(url: str, server=None, storage_options=None) -> dict:
    before = len(server.requests()) if server else 0
    t = time.perf_counter()
    ds = ShardedDataset(url, storage_options=storage_options)
    open_s = time.perf_counter() - t
    reqs = server.requests()[before:] if server else []
    t = time.perf_counter()
    ds.check(files=False)
    check_s = time.perf_counter() - t
    t = time.perf_counter()
    next(iter(ds.iter_batches("train", batch_rows=64)))
    first_s = time.perf_counter() - t
    return {
        "files": len(ds.files()),
        "open_seconds": open_s,
        "open_requests": len(reqs),
        "open_list_requests": sum("list-type" in r for r in reqs),
        "check_manifest_seconds": check_s,
        "first_batch_seconds": first_s,
    }


def _child(url: str, what: str) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks.bench_s3 import measure, ShardedDataset;"
        "print(json.dumps(measure(sys.argv[2]) if sys.argv[3] == 'all' else "
        "len(ShardedDataset(sys.argv[2]).files())))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(REPO), url, what],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_fresh(url: str, server=None) -> dict:
    """:func:`measure` in a new process (no filesystem instance or listing cache of
    this one, which wrote the dataset, can answer for the store); the requests of an
    open are those the server logs while another new process only opens it."""
    res = _child(url, "all")
    if server:
        before = len(server.requests())
        _child(url, "open")
        reqs = server.requests()[before:]
        res["open_requests"] = len(reqs)
        res["open_list_requests"] = sum("list-type" in r for r in reqs)
        res["open_request_lines"] = reqs
    return res


class LatencyProxy:
    """127.0.0.1:port -> target, holding each piece a client sends (a request: they are
    small) ``latency`` seconds before passing it on; replies pass straight back, their
    bytes counted in ``counter`` (a multiprocessing.Value: the proxy runs in a process
    of its own, see :class:`ProxyProcess`)."""

    def __init__(self, target_port: int, latency: float, counter):
        import socket
        import threading

        self.latency, self.target = latency, target_port
        self.counter = counter  # reply bytes passed back to clients (the data read)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _pipe(self, src, dst, delay: float) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if delay:
                    time.sleep(delay)
                else:
                    with self.counter.get_lock():
                        self.counter.value += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def _accept(self) -> None:
        import socket
        import threading

        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.target))
            for a, b, d in ((c, u, self.latency), (u, c, 0.0)):
                threading.Thread(target=self._pipe, args=(a, b, d), daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def _serve_proxy(target_port: int, latency: float, counter, ports, stop) -> None:
    proxy = LatencyProxy(target_port, latency, counter)
    ports.put(proxy.port)
    stop.wait()
    proxy.close()


class ProxyProcess:
    """A :class:`LatencyProxy` in a process of its own, as the network between a
    worker and a store is: its threads (a recv and a send per 64 KiB of the replies)
    take no turn at the learner's interpreter lock in the in-process fits. Stopped
    by its own PID."""

    def __init__(self, target_port: int, latency: float):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._bytes = ctx.Value("q", 0)
        ports, self._stop = ctx.Queue(), ctx.Event()
        self.proc = ctx.Process(
            target=_serve_proxy,
            args=(target_port, latency, self._bytes, ports, self._stop),
            daemon=True,
        )
        self.proc.start()
        self.port = ports.get(timeout=60)

    @property
    def bytes_down(self) -> int:
        return self._bytes.value

    def close(self) -> None:
        self._stop.set()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)


def _epoch(url: str, workers: int, warm: str, repeat: int) -> float:
    """Seconds of one epoch of NeymanPearsonSGD on ``url``, the least of ``repeat``
    fits (these machines are shared: one fit of ~1 s varies by a third): in this
    process (after a first, untimed fit; nothing of ``url`` is cached between fits) or
    each on a new LocalCluster of ``workers`` (after a fit on the small dataset
    ``warm``, which loads the compiled kernels and caches none of ``url``'s row
    groups: the timed fit reads them all)."""
    from bigrate import NeymanPearsonSGD

    def est():
        return NeymanPearsonSGD(rho=0.1, epochs=1, calibrate=None, random_state=0)

    times = []
    if workers == 1:
        est().fit(url)
        for _ in range(repeat):
            t = time.perf_counter()
            est().fit(url)
            times.append(time.perf_counter() - t)
        return min(times)
    from bigrate.engines.dask import DaskEngine
    from bigrate.linear import fit_distributed

    for _ in range(repeat):
        with DaskEngine(n_workers=workers, dashboard=False) as eng:
            fit_distributed(est(), warm, eng, progress=False)
            t = time.perf_counter()
            fit_distributed(est(), url, eng, progress=False)
            times.append(time.perf_counter() - t)
    return min(times)


_VW_PASS = """
import sys, time
import vowpalwabbit
from vowpalwabbit import Workspace
data, cache = sys.argv[1], sys.argv[2]
ws = Workspace(f"-d {data} --cache_file {cache} -k --passes 1 --quiet")  # builds it
ws.run_parser()
ws.finish()
out = {"version": vowpalwabbit.__version__, "pass_s": {}}
for name, args in (("--sgd hinge", "--sgd --loss_function hinge"), ("defaults", "")):
    best = None
    for _ in range(3):
        t = time.perf_counter()
        ws = Workspace(f"--cache_file {cache} --passes 1 --quiet {args}")
        ws.run_parser()
        out["examples"] = int(ws.get_weighted_examples())
        ws.finish()
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    out["pass_s"][name] = best
print(repr(out))
"""


def vw_peer(local: str, work: Path, python: str) -> dict:
    """Vowpal Wabbit (PyPI ``vowpalwabbit``, in the interpreter ``python``) reading its
    own cache of the train split's rows: the out-of-core peer users know. The cache is
    built by a first pass (not timed); then one pass from it, best of 3, with
    ``--sgd --loss_function hinge`` and with VW's defaults."""
    import ast

    from sklearn.datasets import dump_svmlight_file

    block = ShardedDataset(local).to_csr("train")
    svm, path = work / "train.svm", work / "train.vw"
    dump_svmlight_file(block.X, np.where(block.y == 1, 1, -1), str(svm))
    with svm.open() as src, path.open("w") as dst:  # "y j:v ..." -> "y |f j:v ..."
        for line in src:
            label, _, feats = line.partition(" ")
            dst.write(f"{label} |f {feats}")
    cache = work / "train.vw.cache"
    p = subprocess.run(
        [python, "-c", _VW_PASS, str(path), str(cache)],
        capture_output=True,
        text=True,
        check=True,
    )
    out = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    out["cache_mib"] = cache.stat().st_size / 2**20
    return out


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` (threads it starts later inherit it) to
    ``cores``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def epoch_main(a) -> None:
    import s3fs

    work = Path(tempfile.mkdtemp(prefix="bgr-s3e-"))
    server = start_s3_server(work / "requests.log")
    port = int(server.endpoint.rsplit(":", 1)[1])
    proxy = ProxyProcess(port, a.latency_ms / 1000.0)
    if a.store_cores:  # the store as if on other machines: its own cores
        store = {int(c) for c in a.store_cores.split(",")}
        learner = os.sched_getaffinity(0) - store
        if not learner:
            raise SystemExit(
                f"--store-cores {a.store_cores} leaves no core to learn on"
            )
        for pid in (server.proc.pid, proxy.proc.pid):
            pin(pid, store)
        pin(os.getpid(), learner)  # this process, and the workers it starts
        print(f"store (S3 server, proxy) on cores {sorted(store)}, "
              f"learner on {sorted(learner)}", flush=True)  # fmt: skip
    rows = []
    try:
        os.environ.update(server.env())
        server.fs().mkdir("bench")
        from bigrate.data.prep import prep_synth

        local = str(work / "syn")
        prep_synth(local, rows=a.rows, features=a.features, progress=False)
        warm = str(work / "warm")
        prep_synth(warm, rows=40_000, features=a.features, seed=1, progress=False)
        server.fs().put(local + "/", "bench/syn/", recursive=True)
        train_mib = (
            sum(
                os.path.getsize(os.path.join(local, f.path))
                for f in ShardedDataset(local).files("train")
            )
            / 2**20
        )
        slow = f"http://127.0.0.1:{proxy.port}"
        for workers in (int(v) for v in a.workers.split(",")):
            for ahead in (int(v) for v in a.read_ahead.split(",")):
                r = {"workers": workers, "read_ahead": ahead}
                from bigrate.data import reader

                reader.READ_AHEAD = ahead  # here, and in workers started from now
                os.environ["BIGRATE_READ_AHEAD"] = str(ahead)
                r["local_s"] = _epoch(local, workers, warm, a.repeat)
                fits = a.repeat + (workers == 1)  # fits that read s3://bench/syn
                for name, endpoint in (("s3", server.endpoint), ("s3_latency", slow)):
                    os.environ["AWS_ENDPOINT_URL"] = endpoint
                    # fsspec keeps one S3FileSystem per argument set in a process, made
                    # with the endpoint of its time: without this, the in-process fits
                    # of the S3 + latency row would go on using the direct endpoint
                    s3fs.S3FileSystem.clear_instance_cache()
                    before, bytes0 = len(server.requests()), proxy.bytes_down
                    r[name + "_s"] = _epoch("s3://bench/syn", workers, warm, a.repeat)
                    reqs = server.requests()[before:]
                    r[name + "_requests_per_epoch"] = len(reqs) / fits
                # every reply byte of the S3+lat fits passed through the proxy
                r["s3_mib_per_epoch"] = (proxy.bytes_down - bytes0) / fits / 2**20
                os.environ["AWS_ENDPOINT_URL"] = server.endpoint
                r["s3_over_local"] = r["s3_s"] / r["local_s"]
                r["s3_latency_over_local"] = r["s3_latency_s"] / r["local_s"]
                rows.append(r)
                print(r, flush=True)
    finally:
        proxy.close()
        server.stop()
    res = {
        "command": "python benchmarks/bench_s3.py " + " ".join(sys.argv[1:]),
        "rows": a.rows,
        "features": a.features,
        "latency_ms": a.latency_ms,
        "repeat": a.repeat,
        "store_cores": a.store_cores,
        "train_mib_on_disk": train_mib,
        "runs": rows,
    }
    if a.vw_python:
        res["vw"] = vw_peer(local, work, a.vw_python)
    print(f"{'workers':>8}{'ahead':>6}{'local s':>9}{'S3 s':>8}{'S3+lat s':>10}"
          f"{'S3/local':>10}{'S3+lat/local':>14}{'req/epoch':>10}{'MiB/epoch':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['workers']:>8}{r['read_ahead']:>6}{r['local_s']:>9.2f}{r['s3_s']:>8.2f}"
              f"{r['s3_latency_s']:>10.2f}{r['s3_over_local']:>10.2f}"
              f"{r['s3_latency_over_local']:>14.2f}{r['s3_requests_per_epoch']:>10.0f}"
              f"{r['s3_mib_per_epoch']:>10.1f}")  # fmt: skip
    print(f"train split on disk: {train_mib:.1f} MiB")
    if "vw" in res:
        v = res["vw"]
        print(
            f"Vowpal Wabbit {v['version']}, one pass from its cache of the "
            f"{v['examples']:,} train rows ({v['cache_mib']:.1f} MiB): "
            + ", ".join(f"{k} {t:.2f} s" for k, t in v["pass_s"].items())
        )
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "s3_epoch.json").write_text(json.dumps(res, indent=2) + "\n")


def clients_main(a) -> None:
    """CPU the client process spends receiving ``--client-mib`` MiB from the S3 server
    as 8 MiB objects (the size of a row group's reads), 8 at a time, with the store
    pinned to ``--store-cores`` and this process to the other cores: the share of an
    S3 epoch that lands on the learner's own core whatever the network. Best of 3 by
    wall time, for s3fs (bigrate's client), pyarrow's native S3 and botocore."""
    from concurrent.futures import ThreadPoolExecutor

    import botocore.session
    import pyarrow.fs as pafs
    import s3fs

    work = Path(tempfile.mkdtemp(prefix="bgr-s3c-"))
    server = start_s3_server(work / "requests.log")
    res = {"command": "python benchmarks/bench_s3.py " + " ".join(sys.argv[1:])}
    try:
        store = {int(c) for c in (a.store_cores or "1").split(",")}
        pin(server.proc.pid, store)
        pin(os.getpid(), os.sched_getaffinity(0) - store)
        os.environ.update(server.env())
        fs = server.fs()
        fs.mkdir("blobs")
        size, n = 8 * 2**20, max(1, a.client_mib // 8)
        blob = np.random.default_rng(0).bytes(size)  # incompressible, as shards are
        keys = [f"blobs/k{i}" for i in range(n)]
        for k in keys:
            fs.pipe_file(k, blob)
        pool = ThreadPoolExecutor(8)
        s3 = s3fs.S3FileSystem(endpoint_url=server.endpoint)
        pa = pafs.S3FileSystem(
            endpoint_override=server.endpoint.removeprefix("http://"),
            scheme="http",
            access_key=server.KEY,
            secret_key=server.SECRET,
            region="us-east-1",
        )
        bc = botocore.session.get_session().create_client(
            "s3", endpoint_url=server.endpoint, region_name="us-east-1"
        )

        def pa_get(k):
            with pa.open_input_file(k) as f:
                return f.read_at(size, 0)

        ways = {
            "s3fs cat_ranges": lambda: s3.cat_ranges(keys, [0] * n, [size] * n),
            "pyarrow S3FileSystem, 8 threads": lambda: list(pool.map(pa_get, keys)),
            "botocore get_object, 8 threads": lambda: list(
                pool.map(
                    lambda k: bc.get_object(Bucket="blobs", Key=k[6:])["Body"].read(),
                    keys,
                )  # fmt: skip
            ),
        }

        def server_cpu() -> float:  # utime + stime of the server process, seconds
            fields = Path(f"/proc/{server.proc.pid}/stat").read_text().split(")")[-1]
            return sum(int(v) for v in fields.split()[11:13]) / os.sysconf("SC_CLK_TCK")

        for name, fn in ways.items():
            best = None
            for _ in range(3):
                w, c, sv = time.perf_counter(), time.process_time(), server_cpu()
                got = fn()
                w, c = time.perf_counter() - w, time.process_time() - c
                sv = server_cpu() - sv
                assert sum(len(b) for b in got) == n * size
                best = (w, c, sv) if best is None or w < best[0] else best
            res[name] = {"wall_s": best[0], "cpu_s": best[1], "server_cpu_s": best[2],
                         "cpu_ms_per_mib": 1000 * best[1] / (n * 8)}  # fmt: skip
            print(f"{name:34s} wall {best[0]:.3f} s  client CPU {best[1]:.3f} s "
                  f"({1000 * best[1] / (n * 8):.2f} ms/MiB)  server CPU {best[2]:.2f} s",
                  flush=True)  # fmt: skip
    finally:
        server.stop()
    res["mib"] = n * 8
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "s3_clients.json").write_text(json.dumps(res, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["open", "epoch", "clients"])
    ap.add_argument("--client-mib", type=int, default=160,
                    help="clients: MiB received per measurement")  # fmt: skip
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--rows-per-file", type=int, default=8)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=47_236)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--read-ahead", default="4,2,0",
                    help="epoch: the row-group read-ahead depths to run")  # fmt: skip
    ap.add_argument("--workers", default="1,2", help="epoch: the worker counts")
    ap.add_argument(
        "--store-cores", default="",
        help="epoch: pin the S3 server and the latency proxy to these cores (e.g. 1) "
             "and the learner, local and S3 fits alike, to the others: a store that "
             "takes no CPU from the learner, as one on other machines",
    )  # fmt: skip
    ap.add_argument(
        "--repeat", type=int, default=3, help="epoch: timed fits, least kept"
    )
    ap.add_argument(
        "--vw-python",
        help="epoch: a Python with vowpalwabbit installed, to time VW's cache pass too",
    )
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    a = ap.parse_args()
    if a.what == "epoch":
        epoch_main(a)
        return
    if a.what == "clients":
        clients_main(a)
        return
    work = Path(tempfile.mkdtemp(prefix="bgr-s3-"))
    server = start_s3_server(work / "requests.log")
    try:
        os.environ.update(server.env())
        server.fs().mkdir("bench")
        url = "s3://bench/many"
        up = make(url, a.files, a.rows_per_file)
        local = make(str(work / "many"), a.files, a.rows_per_file)
        s3 = measure_fresh(url, server)
        disk = measure_fresh(str(work / "many"))
    finally:
        server.stop()
    res = {
        "command": "python benchmarks/bench_s3.py " + " ".join(sys.argv[1:]),
        "files": a.files,
        "write_seconds": {"s3": up, "local": local},
        "s3": s3,
        "local": disk,
        "open_ratio_s3_over_local": s3["open_seconds"] / disk["open_seconds"],
    }
    print(f"{a.files:,} part files; writing: S3 {up:.1f} s, local {local:.1f} s")
    print(
        f"{'':8}{'open s':>9}{'requests':>10}{'lists':>7}{'check s':>9}{'1st batch s':>13}"
    )
    for k, r in (("S3", s3), ("local", disk)):
        print(f"{k:8}{r['open_seconds']:>9.3f}{r['open_requests']:>10}"
              f"{r['open_list_requests']:>7}{r['check_manifest_seconds']:>9.3f}"
              f"{r['first_batch_seconds']:>13.3f}")  # fmt: skip
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "s3.json").write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
