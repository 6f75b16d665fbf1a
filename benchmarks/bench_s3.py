"""Datasets on object storage: what opening one costs, against the same dataset on local
disk, measured in one run on moto's S3 server on 127.0.0.1 (a real HTTP endpoint).

    python benchmarks/bench_s3.py [--files 10000] [--rows-per-file 8]

Writes a dataset of ``--files`` part files (tiny ones: the cost measured is per file,
not per byte) to the server with bigrate's writer (parts uploaded as they close, the
manifest last) and to a local directory, then for each: the time to open it
(``ShardedDataset``), the requests the server logged for the open (listing requests
counted apart), the time of the manifest-only check (``check(files=False)``, what a job
does before starting on object storage) and the time until the first batch of rows
arrives from a streaming pass. Prints a table and writes benchmarks/out/s3.json.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--rows-per-file", type=int, default=8)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    a = ap.parse_args()
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
