"""Prep and streaming benchmarks on RCV1-scale synthetic data (issue: foundation).

    python benchmarks/bench_prep.py [--rows 804414] [--out benchmarks/out]

1. `bigrate prep svmlight` of an RCV1-scale svmlight file vs scikit-learn's plain
   `load_svmlight_file` of the same file: wall-time ratio (goal <= 1.5) and peak RSS,
   our peak RSS above the interpreter's baseline against the in-memory CSR's size
   (goal < 1/4).
2. One full streaming pass over the shards into CSR batches vs `scipy.sparse.load_npz`
   of the same matrix from local disk (goal <= 1.5), both from a warm page cache.

Each measurement runs in its own process; peak RSS is that process's ru_maxrss. Prints
and saves `prep.json` in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(
    code: str | None = None, args: list[str] | None = None
) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of a fresh Python process."""
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:4]} failed:\n{err.decode()}")
    return wall, usage.ru_maxrss / 1024.0, out.decode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=804_414)
    ap.add_argument("--features", type=int, default=47_236)
    ap.add_argument("--out", default=str(HERE / "out"))
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shards = out / f"rcv1s-{a.rows}"
    svm = out / f"rcv1s-{a.rows}.svm"
    npz = out / f"rcv1s-{a.rows}.npz"
    res: dict = {
        "rows": a.rows,
        "features": a.features,
        "python": sys.version.split()[0],
    }

    if not (shards / "manifest.json").exists():
        wall, rss, _ = run(
            args=[
                "-m",
                "bigrate.cli",
                "prep",
                "synth",
                "--rows",
                str(a.rows),
                "--features",
                str(a.features),
                "--out",
                str(shards),
                "--quiet",
                "--split",
                "train=1",
            ]
        )
        res["synth_seconds"] = wall
    if not svm.exists() or not npz.exists():
        code = f"""
import scipy.sparse as sp
from bigrate.data import ShardedDataset
from bigrate.data.prep.svmlight import dump_svmlight
b = ShardedDataset({str(shards)!r}).to_csr('train')
dump_svmlight({str(svm) + ".tmp"!r}, b.X, b.y)
sp.save_npz({str(npz) + ".tmp.npz"!r}, b.X, compressed=False)
"""
        run(code)
        os.replace(str(svm) + ".tmp", svm)
        os.replace(str(npz) + ".tmp.npz", npz)
    res["svmlight_mib"] = svm.stat().st_size / 2**20

    sk = f"""
import json, time
from sklearn.datasets import load_svmlight_file
t = time.perf_counter(); X, y = load_svmlight_file({str(svm)!r}); t = time.perf_counter() - t
print(json.dumps({{"seconds": t, "csr_bytes": X.data.nbytes + X.indices.nbytes + X.indptr.nbytes,
                  "nnz": int(X.nnz)}}))
"""
    base_wall, base_rss, _ = run(
        "import sklearn.datasets, bigrate.cli, bigrate.data.prep"
    )
    sk_runs, ours_runs = [], []
    for _ in range(a.repeat):
        wall, rss, txt = run(sk)
        sk_runs.append({"wall": wall, "rss": rss, **json.loads(txt)})
        wall, rss, _ = run(
            args=[
                "-m",
                "bigrate.cli",
                "prep",
                "svmlight",
                str(svm),
                "--out",
                str(out / "prep-out"),
                "--overwrite",
                "--quiet",
            ]
        )
        ours_runs.append({"wall": wall, "rss": rss})
    sk_best = min(sk_runs, key=lambda r: r["wall"])
    ours_best = min(ours_runs, key=lambda r: r["wall"])
    csr_mib = sk_best["csr_bytes"] / 2**20
    res["prep"] = {
        "sklearn_load_wall_s": sk_best["wall"],
        "sklearn_load_peak_rss_mib": sk_best["rss"],
        "bigrate_prep_wall_s": ours_best["wall"],
        "bigrate_prep_peak_rss_mib": ours_best["rss"],
        "interpreter_baseline_rss_mib": base_rss,
        "in_memory_csr_mib": csr_mib,
        "time_ratio_vs_sklearn": ours_best["wall"] / sk_best["wall"],
        "rss_above_baseline_over_csr": (ours_best["rss"] - base_rss) / csr_mib,
        "peak_rss_over_csr": ours_best["rss"] / csr_mib,
        "goal": "time ratio <= 1.5; peak RSS < csr/4",
    }

    stream = f"""
import json, time
from bigrate.data import ShardedDataset
ds = ShardedDataset({str(shards)!r})
best = 1e9
for _ in range(3):
    t = time.perf_counter(); n = 0
    for b in ds.iter_batches('train', batch_rows=65536):
        n += b.X.nnz
    best = min(best, time.perf_counter() - t)
print(json.dumps({{"seconds": best, "nnz": n}}))
"""
    npz_code = f"""
import json, time, scipy.sparse as sp
best = 1e9
for _ in range(3):
    t = time.perf_counter(); X = sp.load_npz({str(npz)!r}); n = X.nnz
    best = min(best, time.perf_counter() - t)
print(json.dumps({{"seconds": best, "nnz": int(n)}}))
"""
    _, s_rss, s_txt = run(stream)
    _, n_rss, n_txt = run(npz_code)
    s, n = json.loads(s_txt), json.loads(n_txt)
    assert s["nnz"] == n["nnz"]
    res["stream"] = {
        "bigrate_stream_pass_s": s["seconds"],
        "bigrate_stream_peak_rss_mib": s_rss,
        "load_npz_s": n["seconds"],
        "load_npz_peak_rss_mib": n_rss,
        "time_ratio_vs_load_npz": s["seconds"] / n["seconds"],
        "shards_mib": sum(f.stat().st_size for f in shards.rglob("*.parquet")) / 2**20,
        "npz_mib": npz.stat().st_size / 2**20,
        "goal": "time ratio <= 1.5",
    }
    print(json.dumps(res, indent=2))
    from bigrate.files import atomic_write_text

    atomic_write_text(out / "prep.json", json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
