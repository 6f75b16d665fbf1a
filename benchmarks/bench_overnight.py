"""What trustworthy overnight jobs cost: the checks of every row group read (against the
streaming pass they are part of) and training checkpoints (against the training time).

    python benchmarks/bench_overnight.py [--rows 804414] [--data DIR]

1. Data checks: one streaming pass over the train split of an RCV1-shaped synthetic
   dataset (``bigrate prep synth``), with the time spent in
   :func:`bigrate.data.format.check_block` measured inside the same pass; the ratio is the
   checks' time over the rest of the pass (read, decode). Goal: under 5%.
2. Checkpoints: NP-SGD trained by the distributed rounds on the local engine, every
   checkpoint's write timed (``save_snapshot``: npz + JSON, fsynced, renamed), at the
   default interval (20 rounds or 5 minutes) and at every round. Goal at the default:
   under 1% of the training time.

Writes benchmarks/out/overnight.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def data_checks(ds, repeats: int = 3) -> dict:
    import bigrate.data.format as F

    real = F.check_block
    spent = [0.0]

    def timed(*a, **k):
        t = time.perf_counter()
        real(*a, **k)
        spent[0] += time.perf_counter() - t

    best = None
    for _ in range(repeats):
        F.check_block = timed
        spent[0] = 0.0
        t = time.perf_counter()
        rows = nnz = 0
        try:
            for b in ds.iter_batches("train", batch_rows=65_536):
                rows += len(b)
                nnz += b.X.nnz
        finally:
            F.check_block = real
        total = time.perf_counter() - t
        run = {"pass_seconds": total, "check_seconds": spent[0], "rows": rows,
               "nnz": nnz}  # fmt: skip
        if best is None or total < best["pass_seconds"]:
            best = run
    best["check_share_of_rest"] = best["check_seconds"] / (
        best["pass_seconds"] - best["check_seconds"]
    )
    return best


def checkpoints(path: str, epochs: int) -> dict:
    from bigrate import NeymanPearsonSGD
    from bigrate.engines import open_engine
    from bigrate.linear.distributed import fit_distributed, save_snapshot

    out = {}
    for label, rounds in (("default", 20), ("every_round", 1)):
        times = []
        where = Path(tempfile.mkdtemp()) / "checkpoint"

        def save(snap, times=times, where=where):
            t = time.perf_counter()
            save_snapshot(snap, where)
            times.append(time.perf_counter() - t)

        with open_engine("local") as eng:
            t = time.perf_counter()
            m = fit_distributed(
                NeymanPearsonSGD(rho=0.05, epochs=epochs, random_state=0), path, eng,
                progress=False, checkpoint=save, checkpoint_rounds=rounds,
            )  # fmt: skip
            fit = time.perf_counter() - t
        out[label] = {
            "checkpoint_rounds": rounds,
            "rounds": m.engine_["rounds"],
            "checkpoints": len(times),
            "checkpoint_seconds_total": sum(times),
            "checkpoint_seconds_each": (sum(times) / len(times)) if times else 0.0,
            "fit_seconds": fit,
            "share_of_training": sum(times) / fit,
            "model_floats": int(m.coef_.size),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=804_414)
    ap.add_argument("--data", help="an existing shard dataset (default: make synth)")
    ap.add_argument("--epochs", type=int, default=4)
    a = ap.parse_args()
    from bigrate import ShardedDataset
    from bigrate.data.prep import prep_synth

    path = a.data
    if path is None:
        path = str(Path(tempfile.mkdtemp()) / "rcv1s")
        prep_synth(path, rows=a.rows, progress=False)
    ds = ShardedDataset(path)
    res = {
        "dataset": {"rows": ds.n_rows("train"), "features": ds.n_features},
        "data_checks": data_checks(ds),
        "checkpoints": checkpoints(path, a.epochs),
        "command": f"python benchmarks/bench_overnight.py --rows {a.rows}",
    }
    print(json.dumps(res, indent=2))
    from bigrate.files import atomic_write_text

    (HERE / "out").mkdir(exist_ok=True)
    atomic_write_text(HERE / "out" / "overnight.json", json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
