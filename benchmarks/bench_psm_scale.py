"""q-value rescoring at proteome scale against mokapot (issue 48, item 3).

    python benchmarks/bench_psm_scale.py --mokapot-python /path/to/mokapot-venv/bin/python
        [--train-psms 20000000] [--eval-psms 1000000,5000000] [--epochs 10]
        [--memory-limit 1.5GiB] [--lambda0 1,3,5,10,20,30]
        [--select-psms 2000000] [--val-psms 500000]
        [--work DIR] [--out benchmarks/out]

Synthetic pin files (``bigrate prep synth-pin``, drawn from the shared 10k-PSM file): a
training file of --train-psms PSMs (seed 1) and an evaluation file of the largest
--eval-psms (seed 2), whose first PSMs are the smaller evaluation files (written too, for
mokapot). Then, each a real ``bigrate`` command, timed, with the peak memory of its whole
process tree (the Dask workers included) sampled every 0.1 s:

0. QValueSGD's ``lambda0`` (the multiplier's start) chosen among --lambda0 on a
   validation file (seed 3, --val-psms PSMs), each value trained as in step 2 on the
   first --select-psms PSMs of the training file (seed 1); the value accepting the most
   validation PSMs at q = 0.01 is used below (not counted in the pipeline's time: a
   user chooses it once; its time is reported). One value skips the choice;
1. ``prep pin`` of the training file (standardised) and of the evaluation file
   (``--spectra``: ScanNr kept for target-decoy competition);
2. ``train`` QValueSGD (q = 0.01) out of core on an embedded Dask cluster of 2 workers
   (each limited to --memory-limit; a quarter of it caches decoded row groups);
3. ``predict --q 0.01`` of every evaluation PSM; the accepted targets (best PSM per
   spectrum, (decoys + 1) / targets) are counted on the whole file and on each smaller
   evaluation prefix;
4. ``predict --q 0.01`` of every PSM of the training file too (the model's own data, as
   Percolator scores it; a size mokapot cannot hold in memory here).

mokapot (its own venv: ``pip install mokapot "numpy<2" "pandas<2.2" "scikit-learn<1.6"``)
runs ``brew`` on each evaluation file with its own protocol (3-fold cross-validated
scores, best PSM per spectrum, target-decoy competition), timed and sampled the same way.
Both count accepted PSMs among the same evaluation PSMs; bigrate's model is trained on
the separate training file, mokapot's on two thirds of the evaluation file itself.
Prints a table and saves ``psm_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measured(cmd: list, *, cwd=None, timeout: float | None = None) -> dict:
    """Run ``cmd``; its wall time, the peak summed RSS of its process tree and output.
    A run past ``timeout`` seconds is stopped (its process tree, by PID)."""
    import psutil

    t = time.perf_counter()
    p = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak = [0]
    stop = threading.Event()

    def sample():
        root = psutil.Process(p.pid)
        while not stop.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                rss = 0
                for q in procs:
                    try:
                        rss += q.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                pass
            stop.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, _ = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        for q in psutil.Process(p.pid).children(recursive=True):
            q.kill()
        p.kill()
        out, _ = p.communicate()
        timed_out = True
    stop.set()
    th.join()
    return {
        "seconds": time.perf_counter() - t,
        "peak_gib": peak[0] / 2**30,
        "returncode": p.returncode,
        "timed_out": timed_out,
        "output": out,
    }


def bigrate(*args, cwd) -> dict:
    r = measured([sys.executable, "-m", "bigrate.cli", *args], cwd=cwd)
    if r["returncode"] != 0:
        raise RuntimeError(f"bigrate {args[:2]} failed:\n{r['output'][-3000:]}")
    print(f"  bigrate {' '.join(map(str, args[:2]))}: {r['seconds']:.1f} s, "
          f"peak {r['peak_gib']:.2f} GiB", flush=True)  # fmt: skip
    return r


def accepted_in(r: dict) -> int:
    """The accepted count ``bigrate predict --q 0.01`` printed."""
    m = re.search(r"accepted at q = 0.01: ([\d,]+) targets", r["output"])
    return int(m.group(1).replace(",", ""))


def choose_lambda0(a, work: Path, grid: list) -> dict:
    """Step 0: every lambda0 of ``grid`` trained on the first --select-psms PSMs of the
    training file and scored on a validation file of another seed; the best one."""
    sel, val = work / f"select{a.select_psms}.pin", work / f"val{a.val_psms}.pin"
    for path, n, seed in ((sel, a.select_psms, 1), (val, a.val_psms, 3)):
        if not path.exists():
            bigrate("prep", "synth-pin", "--psms", n, "--seed", seed, "--out", path,
                    "--quiet", cwd=work)  # fmt: skip
    t = time.perf_counter()
    bigrate("prep", "pin", sel, "--out", work / "ds_select", "--split", "train=1",
            "--standardize", "--spectra", "--overwrite", "--quiet", cwd=work)  # fmt: skip
    bigrate("prep", "pin", val, "--out", work / "ds_val", "--split", "train=1",
            "--spectra", "--overwrite", "--quiet", cwd=work)  # fmt: skip
    scores = {}
    for lam0 in grid:
        bigrate("train", work / "ds_select", "--estimator", "QValueSGD", "--q", "0.01",
                "--epochs", a.epochs, "--engine", "dask", "--workers", a.workers,
                "--memory-limit", a.memory_limit, "--param", f"lambda0={lam0:g}",
                "--out", work / "run_select", "--overwrite", "--quiet", cwd=work)  # fmt: skip
        r = bigrate("predict", work / "run_select", work / "ds_val", "--out",
                    work / "preds_val.parquet", "--q", "0.01", cwd=work)  # fmt: skip
        scores[f"{lam0:g}"] = accepted_in(r)
        print(f"  lambda0 {lam0:g}: {scores[f'{lam0:g}']:,} validation PSMs accepted",
              flush=True)  # fmt: skip
    best = max(grid, key=lambda v: (scores[f"{v:g}"], -v))  # ties: the smaller
    return {"grid": scores, "chosen": best, "select_psms": a.select_psms,
            "val_psms": a.val_psms, "seconds": time.perf_counter() - t}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--train-psms", type=int, default=20_000_000)
    ap.add_argument("--eval-psms", default="1000000,5000000")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--memory-limit", default="1.5GiB", help="each Dask worker's (train)"
    )
    ap.add_argument(
        "--lambda0",
        default="1,3,5,10,20,30",
        help="QValueSGD lambda0 values to choose from on a validation file",
    )
    ap.add_argument("--select-psms", type=int, default=2_000_000)
    ap.add_argument("--val-psms", type=int, default=500_000)
    ap.add_argument("--mokapot-python", help="python of a venv with mokapot")
    ap.add_argument("--mokapot-timeout", type=float, default=3600.0)
    ap.add_argument("--work", help="working directory (default: a new temp dir)")
    ap.add_argument("--out", default=str(HERE / "out"))
    a = ap.parse_args()
    import pyarrow.parquet as pq

    from bigrate.metrics import best_per_group, positives_at_q

    sizes = sorted(int(s) for s in a.eval_psms.split(","))
    work = Path(a.work or tempfile.mkdtemp(prefix="psmscale-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"train_psms": a.train_psms, "epochs": a.epochs, "workers": a.workers,
                 "memory_limit": a.memory_limit}  # fmt: skip

    print("synthetic pin files (input, not part of the pipeline):", flush=True)
    gen = {}
    files = {"train": (work / "train.pin", a.train_psms, 1)}
    for n in sizes:
        files[f"eval{n}"] = (work / f"eval{n}.pin", n, 2)
    for name, (path, n, seed) in files.items():
        if not path.exists():
            r = bigrate("prep", "synth-pin", "--psms", n, "--seed", seed, "--out", path,
                        "--quiet", cwd=work)  # fmt: skip
            gen[name] = {"seconds": r["seconds"], "line": r["output"].strip()}
        gen[name] = {**gen.get(name, {}), "bytes": path.stat().st_size}
    res["files"] = gen

    grid = [float(v) for v in a.lambda0.split(",")]
    if len(grid) > 1:
        print("choosing lambda0 on a validation file (seed 3):", flush=True)
        res["lambda0"] = choose_lambda0(a, work, grid)
        lambda0 = res["lambda0"]["chosen"]
        print(f"  chosen: lambda0 = {lambda0:g}", flush=True)
    else:
        lambda0 = grid[0]
        res["lambda0"] = {"chosen": lambda0}

    print("bigrate pipeline:", flush=True)
    big = sizes[-1]
    steps = {}
    steps["prep_train"] = bigrate(
        "prep", "pin", files["train"][0], "--out", work / "ds_train", "--split",
        "train=1", "--standardize", "--spectra", "--overwrite", "--quiet", cwd=work,
    )  # fmt: skip
    steps["prep_eval"] = bigrate(
        "prep", "pin", files[f"eval{big}"][0], "--out", work / "ds_eval", "--split",
        "train=1", "--spectra", "--overwrite", "--quiet", cwd=work,
    )  # fmt: skip
    steps["train"] = bigrate(
        "train", work / "ds_train", "--estimator", "QValueSGD", "--q", "0.01",
        "--epochs", a.epochs, "--engine", "dask", "--workers", a.workers,
        "--memory-limit", a.memory_limit, "--param", f"lambda0={lambda0:g}",
        "--out", work / "run", "--overwrite", "--quiet", cwd=work,
    )  # fmt: skip
    steps["predict"] = bigrate(
        "predict", work / "run", work / "ds_eval", "--out", work / "preds.parquet",
        "--q", "0.01", cwd=work,
    )  # fmt: skip
    steps["predict_train"] = bigrate(
        "predict", work / "run", work / "ds_train", "--out",
        work / "preds_train.parquet", "--q", "0.01", cwd=work,
    )  # fmt: skip

    def accepted(step):
        return accepted_in(steps[step])

    accepted_cli = accepted("predict")
    t = pq.read_table(
        work / "preds.parquet", columns=["row_id", "label", "score", "group"]
    )
    row_id = t.column("row_id").to_numpy()
    y = t.column("label").to_numpy()
    f = t.column("score").to_numpy()
    g = t.column("group").combine_chunks().dictionary_encode().indices.to_numpy()
    ours = {}
    for n in sizes:
        sel = row_id < n  # the first n PSMs of the evaluation file: the smaller file
        keep = best_per_group(f[sel], g[sel])
        ours[n] = positives_at_q(y[sel][keep], f[sel][keep], 0.01, plus_one=True)
    assert ours[big] == accepted_cli, (ours[big], accepted_cli)
    res["bigrate"] = {
        "steps": {
            k: {"seconds": v["seconds"], "peak_gib": v["peak_gib"]}
            for k, v in steps.items()
        },
        "seconds": sum(v["seconds"] for v in steps.values()),
        "peak_gib": max(v["peak_gib"] for v in steps.values()),
        "accepted": {str(n): int(c) for n, c in ours.items()},
        # every PSM of the training file scored by the model fitted on it
        "accepted_train_file": accepted("predict_train"),
    }
    b = res["bigrate"]
    print(f"  whole pipeline: {b['seconds']:.0f} s, peak {b['peak_gib']:.2f} GiB; "
          f"accepted at q = 0.01: {b['accepted']}; on the training file itself: "
          f"{b['accepted_train_file']:,}", flush=True)  # fmt: skip

    res["mokapot"] = {}
    if a.mokapot_python:
        print("mokapot:", flush=True)
        for n in sizes:
            r = measured(
                [a.mokapot_python, HERE / "_mokapot_run.py", files[f"eval{n}"][0],
                 "0.01"], cwd=work, timeout=a.mokapot_timeout,
            )  # fmt: skip
            rec = {"seconds": r["seconds"], "peak_gib": r["peak_gib"]}
            if r["timed_out"]:
                rec["error"] = f"stopped after {a.mokapot_timeout:g} s"
            elif r["returncode"] != 0:
                rec["error"] = r["output"][-1500:]
            else:
                mk = json.loads(r["output"].strip().splitlines()[-1])
                rec["accepted"] = mk["accepted"]["0.01"]
                rec["version"] = mk["mokapot_version"]
            res["mokapot"][str(n)] = rec
            print(f"  {n:,} PSMs: {rec}", flush=True)
            if "error" in rec:
                break  # a larger file will not do better
    else:
        res["mokapot"] = "not run: pass --mokapot-python"

    print("\n| evaluation PSMs | bigrate accepted | mokapot accepted | mokapot time | "
          "mokapot peak |")  # fmt: skip
    for n in sizes:
        mk = res["mokapot"].get(str(n), {}) if isinstance(res["mokapot"], dict) else {}
        print(f"| {n:,} | {ours[n]:,} | {mk.get('accepted', mk.get('error', '-'))} | "
              f"{mk.get('seconds', float('nan')):.0f} s | "
              f"{mk.get('peak_gib', float('nan')):.2f} GiB |")  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "psm_scale.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    print(f"saved {out / 'psm_scale.json'}")


if __name__ == "__main__":
    main()
