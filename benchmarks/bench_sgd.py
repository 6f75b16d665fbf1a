"""Stochastic NP / q-value benchmarks against peers, measured in one run.

    python benchmarks/bench_sgd.py speed    [--rows 804414]
    python benchmarks/bench_sgd.py pairs    (300,000 rows: one epoch vs the sklearn loss)
    python benchmarks/bench_sgd.py blockq   (rates with block-shuffled vs permuted rows)
    python benchmarks/bench_sgd.py scale    [--rows 804414] [--repeats 3] [--engine ray]
    python benchmarks/bench_sgd.py ooc      [--rows 4022070]
    python benchmarks/bench_sgd.py job      [--rows 4022070]
    python benchmarks/bench_sgd.py quality
    python benchmarks/bench_sgd.py qvalue
    python benchmarks/bench_sgd.py all

speed:   seconds per epoch in memory on RCV1-scale synthetic CSR, NeymanPearsonSGD vs
         scikit-learn SGDClassifier(loss="hinge", max_iter=1, tol=None) on the same matrix,
         and vs the floor: one numba pass of sum_k data[k] * w[indices[k]] per row.
scale:   the same epochs on the shards with 2 Dask workers vs 1 (LocalCluster, 127.0.0.1;
         one cluster at a time; --engine ray: an embedded Ray runtime of 2 CPUs vs 1).
ooc:     5x RCV1-scale shards (about 4M rows), 2 workers with memory_limit 1 GiB each:
         completes? throughput (steps/s) of the second epoch as a ratio to the
         in-memory run, the first epoch's apart, and where a round's time goes.
job:     the same 2 epochs as a whole job (`bigrate run`) submitted by address to a
         scheduler and 2 fresh workers of 1 GiB started with cluster/dask's scripts
         (numba's cache filled first by `bigrate warm`): time from the job reaching the
         cluster to its first finished round, each epoch, and the job's training time
         against the in-memory one-process fit of the same steps.
quality: a9a and spambase, rho in {0.01, 0.05, 0.1}: test Pfa, Pnd and fit time (with
         model selection) for NeymanPearsonSGD (defaults, and with the umbrella
         calibration) vs (a) AC-SVM: LinearSVC with class weights over a 15x15 (C+, C-)
         grid chosen by J_val on validation, (b) logistic regression thresholded on the
         validation negatives, (c) the NP umbrella threshold on logistic-regression scores.
qvalue:  accepted targets at q in {0.0025, 0.01, 0.1} on the mokapot pin file (3-fold
         cross-fitting) for QValueSGD vs logistic-regression ranking and mokapot, run in
         its own venv: python -m venv .mkenv && .mkenv/bin/pip install mokapot "numpy<2"
         "pandas<2.2" "scikit-learn<1.6"; then --mokapot-python .mkenv/bin/python

Writes one JSON per section into --out (default benchmarks/out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))


def _synth(out: Path, rows: int) -> Path:
    from bigrate.data.prep import prep_synth

    path = out / f"rcv1s-np-{rows}"
    if not (path / "manifest.json").exists():
        prep_synth(path, rows=rows, progress=True, overwrite=True)
    return path


def _save(out: Path, name: str, res: dict) -> None:
    print(json.dumps(res, indent=2))
    from bigrate.files import atomic_write_text

    atomic_write_text(
        out / f"{name}.json", json.dumps(res, indent=2, default=float) + "\n"
    )


def bench_speed(out: Path, rows: int) -> dict:
    from numba import njit
    from sklearn.linear_model import SGDClassifier

    from bigrate import NeymanPearsonSGD, ShardedDataset

    ds = ShardedDataset(_synth(out, rows))
    tr = ds.to_csr("train")
    X, y = tr.X, tr.y
    X64 = X.astype(np.float64)  # sklearn's SGD works in float64; give it that once

    @njit(cache=True)
    def floor_pass(indptr, indices, data, w):
        s = 0.0
        for i in range(indptr.shape[0] - 1):
            for k in range(indptr[i], indptr[i + 1]):
                s += data[k] * w[indices[k]]
        return s

    w = np.random.default_rng(0).standard_normal(X.shape[1])
    floor_pass(X.indptr, X.indices, X.data, w)
    t = time.perf_counter()
    for _ in range(3):
        floor_pass(X.indptr, X.indices, X.data, w)
    floor_s = (time.perf_counter() - t) / 3

    sk_times = []
    for _ in range(3):
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            SGDClassifier(loss="hinge", max_iter=1, tol=None, random_state=0).fit(
                X64, y
            )
        sk_times.append(time.perf_counter() - t)
    sk_s = min(sk_times)

    NeymanPearsonSGD(epochs=1, random_state=0).fit(X[:1000], y[:1000])  # compile
    ours = []
    for _ in range(3):
        m = NeymanPearsonSGD(epochs=2, random_state=0).fit(X, y)
        ours.append(min(h["seconds"] for h in m.history_))
    ours_s = min(ours)
    steps = m.history_[0]["steps"]
    res = {
        "rows": int(X.shape[0]),
        "nnz": int(X.nnz),
        "ours_epoch_s": ours_s,
        "ours_steps_per_epoch": steps,
        "sklearn_sgd_epoch_s": sk_s,
        "sklearn_steps_per_epoch": int(X.shape[0]),
        "floor_pass_s": floor_s,
        "epoch_ratio_vs_sklearn": ours_s / sk_s,
        "per_step_ratio_vs_sklearn": (ours_s / steps) / (sk_s / X.shape[0]),
        "per_step_ratio_vs_floor": (ours_s / steps) / (floor_s / X.shape[0]),
        "note": "our epoch is 2*max(n+,n-) balanced steps; sklearn's is n uniform steps",
    }
    _save(out, "sgd_speed", res)
    return res


def bench_pairs(out: Path, rows: int = 300_000, reps: int = 3) -> dict:
    """One epoch of NeymanPearsonSGD with uniform sampling (n steps, as scikit-learn's
    SGDClassifier(max_iter=1) takes) against the scikit-learn loss of the same cost:
    sigmoid vs log_loss, ramp vs hinge; our rows visited in a plain permutation
    (shuffle_block=1) and by blocks of 1024 (the default); medians of ``reps``
    interleaved runs, on a float64 copy of the CSR for scikit-learn."""
    from sklearn.linear_model import SGDClassifier

    from bigrate import NeymanPearsonSGD, ShardedDataset

    ds = ShardedDataset(_synth(out, rows))
    tr = ds.to_csr("train")
    X, y = tr.X, tr.y
    X64 = X.astype(np.float64)
    NeymanPearsonSGD(epochs=1, random_state=0).fit(X[:1000], y[:1000])  # compile
    res = {"rows": int(X.shape[0]), "nnz": int(X.nnz), "reps": reps}
    for ours_loss, sk_loss in (("sigmoid", "log_loss"), ("ramp", "hinge")):
        t_sk, t_ours = [], {1: [], 1024: []}
        for _ in range(reps):
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                SGDClassifier(loss=sk_loss, max_iter=1, tol=None,
                              random_state=0).fit(X64, y)  # fmt: skip
            t_sk.append(time.perf_counter() - t)
            for block in (1, 1024):
                m = NeymanPearsonSGD(loss=ours_loss, epochs=1, balanced=False,
                                     shuffle_block=block, random_state=0)  # fmt: skip
                t = time.perf_counter()
                m.fit(X, y)
                t_ours[block].append(time.perf_counter() - t)
        sk = float(np.median(t_sk))
        res[f"{ours_loss}_vs_{sk_loss}"] = {
            "sklearn_s": sk,
            "ours_block1_s": float(np.median(t_ours[1])),
            "ours_block1024_s": float(np.median(t_ours[1024])),
            "ratio_block1": float(np.median(t_ours[1])) / sk,
            "ratio_block1024": float(np.median(t_ours[1024])) / sk,
        }
        print(ours_loss, sk_loss, res[f"{ours_loss}_vs_{sk_loss}"], flush=True)
    _save(out, "sgd_pairs", res)
    return res


def bench_blockq(out: Path, seeds: int = 3) -> dict:
    """Rates with rows visited by blocks of 1024 (the default) and in a plain
    permutation (shuffle_block=1): NeymanPearsonSGD's test Pfa / Pnd at rho 0.05 on
    a9a, spambase and the RCV1-shaped synthetic set (300,000 rows), mean over seeds."""
    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.metrics import pfa_pnd

    sets = {name: _dataset_arrays(name, out) for name in ("a9a", "spambase")}
    ds = ShardedDataset(_synth(out, 300_000))
    sets["synthetic"] = {
        s: (lambda c: (c.X, c.y))(ds.to_csr(s)) for s in ("train", "test")
    }
    res = {"rho": 0.05, "seeds": seeds}
    for name, d in sets.items():
        (Xtr, ytr), (Xte, yte) = d["train"], d["test"]
        for block in (1, 1024):
            rates, secs = [], []
            for seed in range(seeds):
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    m = NeymanPearsonSGD(rho=0.05, shuffle_block=block,
                                         random_state=seed).fit(Xtr, ytr)  # fmt: skip
                secs.append(time.perf_counter() - t)
                rates.append(pfa_pnd(yte, m.decision_function(Xte)))
            r = np.array(rates)
            res[f"{name}_block{block}"] = {
                "test_pfa": float(r[:, 0].mean()), "test_pfa_sd": float(r[:, 0].std()),
                "test_pnd": float(r[:, 1].mean()), "test_pnd_sd": float(r[:, 1].std()),
                "fit_s": float(np.median(secs)),
            }  # fmt: skip
            print(name, block, res[f"{name}_block{block}"], flush=True)
    _save(out, "sgd_blockq", res)
    return res


def bench_rounds(out: Path, rows: int, seeds: int = 3) -> dict:
    """The rates with the rounds of ``rounds_per_epoch="auto"`` against 4 rounds an
    epoch, at 2, 8 and 32 shares of the RCV1-scale shards (the distributed rounds on
    the local engine, the same bits as on a cluster of that many workers):
    NeymanPearsonSGD at rho 0.05, defaults, 2 epochs, test Pfa / Pnd mean and sd over
    ``seeds``, the guarantee its calibration got and the rounds an epoch."""
    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.engines.local import LocalEngine
    from bigrate.linear import fit_distributed

    ds = ShardedDataset(_synth(out, rows))
    res = {"rows": rows, "rho": 0.05, "seeds": seeds, "epochs": 2}
    for w in (2, 8, 32):
        for per_epoch in ("auto", 4):
            got, kinds = [], set()
            for seed in range(seeds):
                m = fit_distributed(
                    NeymanPearsonSGD(rho=0.05, epochs=2, random_state=seed), ds,
                    LocalEngine(), workers=w, rounds_per_epoch=per_epoch,
                    progress=False,
                )  # fmt: skip
                c = m.score_confusion(ds, split="test")
                got.append((c.pfa, c.pnd, m.engine_["rounds"] / 2))
                kinds.add(m.guarantee_["kind"])
            r = np.array(got)
            res[f"w{w}_{per_epoch}"] = {
                "rounds_per_epoch": float(r[0, 2]), "guarantee": sorted(kinds),
                "test_pfa": float(r[:, 0].mean()), "test_pfa_sd": float(r[:, 0].std()),
                "test_pnd": float(r[:, 1].mean()), "test_pnd_sd": float(r[:, 1].std()),
            }  # fmt: skip
            print(w, per_epoch, res[f"w{w}_{per_epoch}"], flush=True)
    _save(out, "sgd_rounds", res)
    return res


def _hop_leaf(start, d, k):
    """A round task with no steps: a state of ``d`` floats from the start."""
    from bigrate.linear.distributed import RoundSum
    from bigrate.linear.steps import StateSum

    w = start.start().w if isinstance(start, RoundSum) else start
    return RoundSum(StateSum(1, w + k, 0.0, 0.0, 0.0), np.zeros(6), 1, 0.0, 0.0,
                    np.zeros(4))  # fmt: skip


def _bump(x):
    return x + 1.0


def _round_overheads(engine: str, d: int, sizes=(1, 2, 4, 8, 16), rounds=25) -> dict:
    """Measured on real worker processes on 127.0.0.1: a round of tasks with no steps
    (a state of ``d`` float64 out and back), combined in the driver and on the
    workers, at each worker count (medians of ``rounds`` rounds after 5), and one
    worker-to-worker hop of that state (a chain of 20 tasks alternating between two
    workers; 8 bytes too)."""
    from bigrate.engines import open_engine
    from bigrate.linear.distributed import combine_rounds

    kw = {"dashboard": False} if engine == "dask" else {}
    out: dict = {"rounds": {}}
    for w in sizes:
        eng = open_engine(engine, n_workers=w, **kw)
        try:
            row = {}
            with eng.pinned() as pool:
                for on in ("driver", "workers", "direct"):
                    shared, ts, fan = np.zeros(d), [], []
                    for _ in range(rounds + 5):
                        t = time.perf_counter()
                        red = pool.allreduce(_hop_leaf, [(d, k) for k in range(w)],
                                             combine_rounds, shared=shared, on=on)  # fmt: skip
                        ts.append(time.perf_counter() - t)
                        shared = red
                        if on == "direct" and w > 1:
                            # the root's slot pickling the other slots' parts
                            fan.append(pool.mesh_seconds[0][3] / (w - 1))
                    row[on] = float(np.median(ts[5:]))
                    if fan:
                        row["direct_part_s"] = float(np.median(fan[5:]))
                assert pool.fallbacks == pool.direct_failures == 0, "a round ran again"
                if w == 2:
                    for size in (1, d):
                        hops = []
                        for _ in range(5):
                            x, t = _chain(eng, pool, size)
                            hops.append(t)
                        out[f"hop_{size * 8}_bytes_s"] = float(np.median(hops))
            out["rounds"][w] = row
            print(engine, w, "workers: a round's overhead", row, flush=True)
        finally:
            eng.close()
    return out


def _chain(eng, pool, size: int, n: int = 20):
    """Seconds a hop of ``size`` floats between the pool's two workers takes."""
    slots = pool._slots
    if eng.name == "dask":
        c = eng.client
        x = c.scatter(np.zeros(size), workers=[slots[0].worker])
        t = time.perf_counter()
        for i in range(n):
            x = c.submit(_bump, x, workers=[slots[(i + 1) % 2].worker],
                         allow_other_workers=False, pure=False)  # fmt: skip
        x.result()
    else:
        import ray

        x = ray.put(np.zeros(size))
        t = time.perf_counter()
        for i in range(n):
            x = slots[(i + 1) % 2][0].apply.remote(_bump, x)
        ray.get(x)
    return x, (time.perf_counter() - t) / n


def bench_scale(out: Path, rows: int, repeats: int = 3, engine: str = "dask") -> dict:
    """2 Dask (or Ray) workers vs 1 (median of ``repeats`` fits each, interleaved, one
    cluster at a time), where a round's time goes (``engine_``), the rounds' overhead
    measured on 1-16 real worker processes (combined in the driver and on the
    workers) and a worker-to-worker hop, and a model of an epoch at 2-128 workers
    built from those measurements, checked against the measured 2-worker speed-up."""
    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.engines import open_engine
    from bigrate.engines.base import tree_children
    from bigrate.linear import fit_distributed
    from bigrate.linear.distributed import (
        RoundSum,
        auto_rounds_per_epoch,
        combine_rounds,
    )
    from bigrate.linear.steps import StateSum

    path = _synth(out, rows)
    ds = ShardedDataset(path)
    res = {"rows": rows, "cores": os.cpu_count(), "repeats": repeats, "engine": engine}
    kw = {"dashboard": False} if engine == "dask" else {}
    # One cluster at a time, as a user runs one: a second, idle cluster alive beside
    # the measured one takes CPU from a 2-worker fit, which keeps both cores busy.
    # Each repeat starts the cluster, warms it with the very fit it then times
    # (kernels loaded, the row groups in the workers' caches), fits, closes it.
    fits: dict = {1: [], 2: []}
    for _ in range(repeats):
        for n in (1, 2):
            eng = open_engine(engine, n_workers=n, **kw)
            try:
                fit_distributed(
                    NeymanPearsonSGD(epochs=2, random_state=0), ds, eng, progress=False
                )
                t = time.perf_counter()
                m = fit_distributed(
                    NeymanPearsonSGD(epochs=2, random_state=0), ds, eng, progress=False
                )
                fits[n].append((time.perf_counter() - t, m))
            finally:
                eng.close()
    for n, runs in fits.items():
        secs = [s for s, _ in runs]
        m = runs[int(np.argsort(secs)[len(secs) // 2])][1]
        res[f"workers_{n}_s"] = float(np.median(secs))
        res[f"workers_{n}_s_each"] = secs
        res[f"workers_{n}_test_pfa"] = m.score_confusion(ds, split="test").pfa
        res[f"workers_{n}_round"] = {k: v for k, v in m.engine_.items() if k != "name"}
    res["speedup_2_vs_1"] = res["workers_1_s"] / res["workers_2_s"]
    r1, r2 = res["workers_1_round"], res["workers_2_round"]
    d = r2["state_bytes"] // 8 - 3
    # the merge of two states, in one process (a node of the tree, or one more state
    # for the driver), and the round overheads on real processes
    a = RoundSum(StateSum(1, np.ones(d), 0, 0, 0), np.zeros(6), 1, 0, 0, np.zeros(4))
    t = time.perf_counter()
    for _ in range(50):
        combine_rounds(a, a)
    res["combine_s"] = (time.perf_counter() - t) / 50
    meas = _round_overheads(engine, d)
    res["measured_overheads"] = meas
    # The model of an epoch at W workers. Compute: steps of a task (the schedule of
    # fit_distributed, rounds_per_epoch "auto") times the cost of a step measured in
    # the 2-worker fits (1-worker fit for W = 1), times the slowest task over the
    # mean (2-worker fits). Overhead a round, from the measurements on 1 and 2 worker
    # processes (more processes than the 2 cores here measure the cores' contention,
    # not a cluster's, and are shown beside the model, not fitted):
    #   in the driver: the 1-worker round + (W - 1) x (the 2-worker round - the
    #     1-worker round: one more state out, back and merged);
    #   on the workers: the 1-worker round + 2 (depth - 1) hops (up and down the
    #     tree) + (W - 1) x the tasks' cost to whoever places them (the 2-worker
    #     tree round less the 1-worker round and two hops, per worker).
    # The engine's rule picks where (tree_min_workers); "best" takes the cheaper.
    #   direct (merge="direct", the default): the driver makes one call a round, to
    #     the root's slot, which sends each other slot its part (pickled and sent in
    #     turn: f a slot, measured there), then the state goes down and up the tree.
    #     The 1-worker direct round + (W - 1) f + 2 (depth - 1) hops, a hop being
    #     half of what the second worker adds (the 2-worker direct round less the
    #     1-worker one and f: the state down to it and its state back, each
    #     pickled, sent and read). That is a cluster with a core a worker; on C
    #     cores the W - 1 other workers' parts (2 hops + f of CPU each) share them:
    #     the round is at least o1 + (W - 1)(2 hop + f) / C, which the rows measured
    #     here on 4-16 processes (on 2 cores) check.
    o1 = meas["rounds"][1]["driver"]
    o2d = meas["rounds"][2]["driver"]
    o2t = meas["rounds"][2]["workers"]
    o1x, o2x = meas["rounds"][1]["direct"], meas["rounds"][2]["direct"]
    hop = meas[f"hop_{d * 8}_bytes_s"]
    per_part = float(np.median([r["direct_part_s"] for w, r in
                                meas["rounds"].items() if w > 1]))  # fmt: skip
    hop_x = max(o2x - o1x - per_part, 0.0) / 2
    per_state = max(o2d - o1, 0.0)
    per_task = max(o2t - o1 - 2 * hop, 0.0)

    def direct_overhead(w, cores=None):
        path = o1x + (w - 1) * per_part + 2 * (depth(w) - 1) * hop_x
        if cores is None:  # a core a worker
            return path
        return max(path, o1x + (w - 1) * (2 * hop_x + per_part) / cores)

    step = {1: r1["round_mean_task_s"] / r1["steps_per_round"],
            2: r2["round_mean_task_s"] / r2["steps_per_round"]}  # fmt: skip
    imbalance = r2["round_slowest_task_s"] / r2["round_mean_task_s"]
    cap = 2 * NeymanPearsonSGD().buffer_rows
    per_epoch = r1["steps_per_round"] * r1["rounds"] // 2  # 2 epochs were fitted

    def depth(w):
        lv, frontier = 1, [0]
        while True:
            frontier = [c for i in frontier for c in tree_children(i, w)]
            if not frontier:
                return lv
            lv += 1

    def model(w, epoch_steps):
        rounds = max(auto_rounds_per_epoch(epoch_steps, w),
                     math.ceil(epoch_steps / (w * cap)))  # fmt: skip
        steps = math.ceil(epoch_steps / (w * rounds))
        task = step[1 if w == 1 else 2] * steps * (imbalance if w > 1 else 1.0)
        drv = o1 + (w - 1) * per_state
        tree = o1 + 2 * (depth(w) - 1) * hop + (w - 1) * per_task
        direct = direct_overhead(w)
        out = {"rounds_per_epoch": rounds, "steps_per_task": steps, "task_s": task,
               "overhead_driver_s": drv, "overhead_tree_s": tree,
               "overhead_direct_s": direct, "merge": "direct"}  # fmt: skip
        for name, o in (("rule", direct), ("best", min(drv, tree, direct))):
            out[f"epoch_{name}_s"] = rounds * (task + o)
            out[f"comm_share_{name}"] = o / (task + o)
        return out

    for label, scale in (("rcv1", 1), ("x100", 100)):
        tab = {w: model(w, per_epoch * scale) for w in (1, 2, 4, 8, 16, 32, 128)}
        for w in tab:
            for name in ("rule", "best"):
                tab[w][f"speedup_{name}"] = (
                    tab[1][f"epoch_{name}_s"] / tab[w][f"epoch_{name}_s"]
                )
        res[f"model_{label}"] = tab
    pred2 = res["model_rcv1"][2]["speedup_rule"]
    res["model_2_vs_measured"] = pred2 / res["speedup_2_vs_1"]
    # the direct rounds' model on this machine's 2 cores, against the measurements
    res["direct_model_vs_measured"] = {
        w: {"model_s": direct_overhead(w, os.cpu_count()),
            "measured_s": meas["rounds"][w]["direct"]}
        for w in meas["rounds"]
    }  # fmt: skip
    res.update(per_step_s=step, imbalance=imbalance, hop_s=hop, hop_direct_s=hop_x,
               per_state_s=per_state, per_task_s=per_task, per_part_s=per_part,
               round_1_s=o1, round_1_direct_s=o1x)  # fmt: skip
    print(json.dumps({k: v for k, v in res.items() if k.startswith(("model_2",
          "speedup", "hop", "per_", "round_1", "direct_model"))}, indent=1,
          default=str), flush=True)  # fmt: skip
    for label in ("rcv1", "x100"):
        for w, row in res[f"model_{label}"].items():
            print(label, w, {k: round(v, 4) if isinstance(v, float) else v
                             for k, v in row.items()}, flush=True)  # fmt: skip
    _save(out, "sgd_scale" if engine == "dask" else f"sgd_scale_{engine}", res)
    return res


def bench_ooc(out: Path, rows: int) -> dict:
    """Two epochs out of core on 2 Dask workers of 1 GiB; the throughput ratio is the
    second epoch's (the first includes the workers importing bigrate and loading the
    compiled kernels: reported apart) against one in-memory epoch, with where a round's
    time goes (medians over the rounds: reading + decoding + checking row groups,
    copying the drawn rows into chunks, the steps, communication + scheduling)."""
    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.engines.dask import DaskEngine
    from bigrate.linear import fit_distributed

    big = ShardedDataset(_synth(out, rows))
    mem_rate = _in_memory_rate(out)
    with DaskEngine(n_workers=2, memory_limit="1GiB", dashboard=False) as eng:
        t = time.perf_counter()
        mb = fit_distributed(
            NeymanPearsonSGD(epochs=2, random_state=0), big, eng, progress=True
        )
        wall = time.perf_counter() - t
    h = mb.history_
    rates = [e["steps"] / e["seconds"] for e in h]
    res = {
        "rows": rows,
        "shards_gib": sum(f.bytes for f in big.files()) / 2**30,
        "worker_memory_limit": "1GiB",
        "completed": True,
        "epochs": len(h),
        "steps_per_epoch": h[0]["steps"],
        "epoch_seconds": [e["seconds"] for e in h],
        "wall_s": wall,
        "ooc_steps_per_s_by_epoch": rates,
        "in_memory_steps_per_s": mem_rate,
        "throughput_ratio": rates[-1] / mem_rate,
        "throughput_ratio_first_epoch": rates[0] / mem_rate,
        "round": {k: v for k, v in mb.engine_.items() if k.startswith("round")},
        "test_pfa": mb.score_confusion(big, split="test").pfa,
        "test_pnd": mb.score_confusion(big, split="test").pnd,
    }
    _save(out, "sgd_ooc", res)
    return res


def _in_memory_rate(out: Path) -> float:
    """Steps a second of one in-memory epoch of NeymanPearsonSGD in this process (the
    RCV1-scale synthetic set, 804,414 rows): the rate an out-of-core fit is compared
    with."""
    from bigrate import NeymanPearsonSGD, ShardedDataset

    tr = ShardedDataset(_synth(out, 804_414)).to_csr("train")
    # the kernels loaded (or compiled, with an empty cache) outside the timed epoch
    NeymanPearsonSGD(epochs=1, random_state=0).fit(tr.X[:2000], tr.y[:2000])
    m = NeymanPearsonSGD(epochs=1, random_state=0).fit(tr.X, tr.y)
    return m.history_[0]["steps"] / m.history_[0]["seconds"]


def _start_dask(n_workers: int, memory_limit: str, workdir: Path):
    """A scheduler and ``n_workers`` worker processes on 127.0.0.1 from cluster/dask's
    scripts, each in its own process group (stopped by :func:`_stop`); returns
    (address, processes) once every worker has joined."""
    import os
    import socket
    import subprocess

    from dask.distributed import Client

    repo = HERE.parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    procs = [subprocess.Popen(
        [str(repo / "cluster/dask/start-scheduler.sh")],
        env={**env, "PORT": str(port), "DASHBOARD": "none"}, cwd=workdir,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )]  # fmt: skip
    address = f"tcp://127.0.0.1:{port}"
    procs += [subprocess.Popen(
        [str(repo / "cluster/dask/start-worker.sh")],
        env={**env, "SCHEDULER": address, "MEMORY_LIMIT": memory_limit}, cwd=workdir,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    ) for _ in range(n_workers)]  # fmt: skip
    with Client(address, timeout="60s") as c:
        c.wait_for_workers(n_workers, timeout=120)
    return address, procs


def _stop(procs) -> None:
    """Stop the process groups this benchmark started (SIGTERM, then SIGKILL)."""
    import os
    import signal
    import subprocess

    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _t(event: dict) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(event["time"]).timestamp()


def _job_figures(run: Path, mem_rate: float, wall: float) -> dict:
    """What a train run's events and metrics say of its time: engine ready, first
    finished round (from the first checkpoint, less its own write), epochs, training
    time with and without the checkpoints' writes, against the in-memory rate, then
    the final evaluation and the whole run."""
    ev = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    first = {}
    for e in ev:
        first.setdefault(e["event"], e)
    ckpts = [e for e in ev if e["event"] == "checkpoint"]
    metrics = json.loads((run / "metrics.json").read_text())
    hist = metrics["history"]
    steps = sum(h["steps"] for h in hist)
    train_s = first["train_finished"]["seconds"]
    ckpt_s = sum(c["seconds"] for c in ckpts)
    r1 = _t(ckpts[0]) - ckpts[0]["seconds"]
    return {
        "job_wall_s": wall,
        "engine_ready_s": first["engine_started"]["seconds"],
        "first_round_after_cluster_s": r1 - _t(first["engine_started"]),
        "epoch_seconds": [h["seconds"] for h in hist],
        "rounds": len(ckpts),
        "checkpoint_s_total": ckpt_s,
        "train_s": train_s,
        "train_s_without_checkpoints": train_s - ckpt_s,
        "steps": steps,
        "in_memory_fit_s_same_steps": steps / mem_rate,
        "job_time_ratio": steps / mem_rate / (train_s - ckpt_s),
        "job_time_ratio_with_checkpoints": steps / mem_rate / train_s,
        "test": metrics["evaluation"]["test"],
        # the final evaluation on the workers (every split's files scored), after
        # the model is saved: outside the ratio, but part of the job's wall time
        "evaluation_s": _t(first["evaluated"]) - _t(first["train_finished"]),
        "run_s": first["run_finished"]["seconds"],
    }


def bench_job(out: Path, rows: int) -> dict:
    """The whole 2-epoch job by address, twice on the same cluster: on its fresh 1 GiB
    workers, then on the same workers warm (bigrate imported, kernels loaded). Per-round
    times come from a checkpoint every round; their own cost is recorded and taken out
    of the figures it would inflate."""
    import shutil
    import subprocess
    import tempfile

    data = _synth(out, rows).resolve()
    mem_rate = _in_memory_rate(out)
    subprocess.run([sys.executable, "-m", "bigrate.cli", "warm", "--estimator",
                    "NeymanPearsonSGD"], check=True, capture_output=True)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bigrate-job-bench-"))
    job = work / "job.toml"
    job.write_text(f"""[job]
kind = "train"
name = "ooc-job"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ epochs = 2, random_state = 0 }}
[engine]
name = "dask"
workers = 2
[output]
dir = "{work / "runs"}"
checkpoint_rounds = 1
""")
    res = {"rows": rows, "workers": 2, "worker_memory_limit": "1GiB",
           "in_memory_steps_per_s": mem_rate}  # fmt: skip
    address, procs = _start_dask(2, "1GiB", work)
    try:
        for which in ("fresh_workers", "warm_workers"):
            before = (
                set((work / "runs").glob("*")) if (work / "runs").exists() else set()
            )
            t0 = time.time()
            p = subprocess.run(
                [sys.executable, "-m", "bigrate.cli", "run", str(job), "--address",
                 address], capture_output=True, text=True, cwd=work,
            )  # fmt: skip
            wall = time.time() - t0
            if p.returncode != 0:
                raise RuntimeError(
                    f"the job failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
                )
            (run,) = set((work / "runs").glob("*")) - before
            res[which] = _job_figures(run, mem_rate, wall)
    finally:
        _stop(procs)
        shutil.rmtree(work, ignore_errors=True)  # run directories and checkpoints
    _save(out, "sgd_ooc_job", res)
    return res


def _dataset_arrays(name: str, out: Path):
    from sklearn.preprocessing import StandardScaler

    from bigrate import ShardedDataset
    from bigrate.data.prep import run_recipe

    path = out / "shared" / name
    if not (path / "manifest.json").exists():
        run_recipe(name, path, progress=False, overwrite=True)
    ds = ShardedDataset(path)
    parts = {s: ds.to_csr(s) for s in ("train", "val", "test")}
    if name == "spambase":  # dense: standardise on train
        sc = StandardScaler().fit(parts["train"].X.toarray())
        return {s: (sc.transform(p.X.toarray()), p.y) for s, p in parts.items()}
    return {s: (p.X, p.y) for s, p in parts.items()}


def bench_quality(out: Path) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    from bigrate import NeymanPearsonSGD
    from bigrate.metrics import j_val, np_umbrella_threshold, pfa_pnd

    res = {}
    for name in ("a9a", "spambase"):
        d = _dataset_arrays(name, out)
        (Xtr, ytr), (Xva, yva), (Xte, yte) = d["train"], d["val"], d["test"]
        # LR is fitted once and reused by (b) and (c): its time counts for both
        t = time.perf_counter()
        lr = LogisticRegression(max_iter=2000).fit(Xtr, ytr)
        lr_s = time.perf_counter() - t
        # AC-SVM grid: 15x15 (C+, C-) in [0.01, 100]^2
        grid = np.logspace(-2, 2, 15)
        t = time.perf_counter()
        svms = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for cp in grid:
                for cn in grid:
                    m = LinearSVC(
                        C=1.0, class_weight={1: cp, -1: cn}, max_iter=2000, dual="auto"
                    ).fit(Xtr, ytr)
                    svms.append((m, m.decision_function(Xva)))
        acsvm_s = time.perf_counter() - t
        for rho in (0.01, 0.05, 0.1):
            row = {}
            # ours, defaults
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ours = NeymanPearsonSGD(rho=rho, random_state=0).fit(Xtr, ytr)
            row["np_sgd"] = dict(
                zip(("pfa", "pnd"), pfa_pnd(yte, ours.decision_function(Xte))),
                fit_s=time.perf_counter() - t,
            )
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cal = NeymanPearsonSGD(rho=rho, calibrate="umbrella", random_state=0)
                try:
                    cal.fit(Xtr, ytr)
                    row["np_sgd_umbrella"] = dict(
                        zip(("pfa", "pnd"), pfa_pnd(yte, cal.decision_function(Xte))),
                        fit_s=time.perf_counter() - t,
                    )
                except ValueError as e:
                    row["np_sgd_umbrella"] = {"error": str(e)}
            # (a) AC-SVM chosen by J_val on validation
            best = min(svms, key=lambda ms: j_val(*pfa_pnd(yva, ms[1]), rho))
            row["acsvm_grid"] = dict(
                zip(("pfa", "pnd"), pfa_pnd(yte, best[0].decision_function(Xte))),
                fit_s=acsvm_s,
            )
            # (b) LR thresholded on validation negatives
            sva = lr.decision_function(Xva)
            thr = np.quantile(sva[yva < 0], 1 - rho)
            row["lr_val_threshold"] = dict(
                zip(("pfa", "pnd"), pfa_pnd(yte, lr.decision_function(Xte) - thr)),
                fit_s=lr_s,
            )
            # (c) umbrella threshold on LR scores of validation negatives
            try:
                thr_u = np_umbrella_threshold(sva[yva < 0], rho, 0.05)
                f = lr.decision_function(Xte) - np.nextafter(thr_u, np.inf)
                row["lr_umbrella"] = dict(
                    zip(("pfa", "pnd"), pfa_pnd(yte, f)), fit_s=lr_s
                )
            except ValueError as e:
                row["lr_umbrella"] = {"error": str(e)}
            best_pnd = min(
                v["pnd"] for k, v in row.items() if k != "np_sgd" and "pnd" in v
            )
            row["goal"] = {
                "pfa_within_rho_plus_1pt": row["np_sgd"]["pfa"] <= rho + 0.01,
                "pnd_within_1pt_of_best_peer": row["np_sgd"]["pnd"] <= best_pnd + 0.01,
                "time_under_fifth_of_acsvm": row["np_sgd"]["fit_s"] < acsvm_s / 5,
            }
            res[f"{name}_rho{rho}"] = row
            print(name, rho, json.dumps(row, default=float), flush=True)
    _save(out, "sgd_quality", res)
    return res


def bench_qvalue(out: Path, mokapot_python: str | None = None, seeds: int = 1) -> dict:
    """3-fold cross-fitting on the whole pin file, as mokapot does: every PSM is scored by
    a model that did not see it; scores are put on a common scale per fold (z-scores
    of that fold's decoys, like mokapot's calibration), then ranked jointly and targets
    accepted at q counted with the (decoys + 1) / targets estimate mokapot reports.
    ``seeds`` > 1 repeats the cross-fitting with the folds and the SGD seeded by 0, 1,
    ... and reports each count's mean, spread and range (issue 48, item 4)."""
    import subprocess

    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    from bigrate import QValueSGD
    from bigrate.metrics import positives_at_q

    d = _dataset_arrays("psm_pin_mokapot_10k", out)
    X = np.vstack([d[s][0].toarray() for s in ("train", "val", "test")])
    y = np.concatenate([d[s][1] for s in ("train", "val", "test")])
    qs = (0.0025, 0.01, 0.1)
    res = {"n": len(y), "targets": int((y > 0).sum()), "decoys": int((y < 0).sum())}
    folds = list(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y))

    def cross_fit(make, folds=folds):
        f = np.empty(len(y))
        t = time.perf_counter()
        for tr, te in folds:
            sc = StandardScaler().fit(X[tr])
            m = make().fit(sc.transform(X[tr]), y[tr])
            s = m.decision_function(sc.transform(X[te]))
            dec = s[y[te] < 0]
            f[te] = (s - dec.mean()) / (dec.std() + 1e-12)
        return f, time.perf_counter() - t

    f_lr, lr_s = cross_fit(lambda: LogisticRegression(max_iter=2000))
    for q in qs:
        f_q, s_q = cross_fit(lambda q=q: QValueSGD(q=q, epochs=20, random_state=0))
        res[f"q{q}"] = {
            "qvalue_sgd": {
                "accepted": positives_at_q(y, f_q, q, plus_one=True),
                "fit_s": s_q,
            },
            "logistic_regression": {
                "accepted": positives_at_q(y, f_lr, q, plus_one=True),
                "fit_s": lr_s,
            },
        }
    if seeds > 1:
        counts: dict = {
            str(q): {"qvalue_sgd": [], "logistic_regression": []} for q in qs
        }
        for seed in range(seeds):
            fs = list(StratifiedKFold(3, shuffle=True, random_state=seed).split(X, y))
            f_lr, _ = cross_fit(lambda: LogisticRegression(max_iter=2000), fs)
            for q in qs:
                f_q, _ = cross_fit(
                    lambda q=q, seed=seed: QValueSGD(q=q, epochs=20, random_state=seed),
                    fs,
                )
                c = counts[str(q)]
                c["qvalue_sgd"].append(positives_at_q(y, f_q, q, plus_one=True))
                c["logistic_regression"].append(
                    positives_at_q(y, f_lr, q, plus_one=True)
                )
        res["seeds"] = {
            q: {
                k: {
                    "counts": v,
                    "mean": float(np.mean(v)),
                    "sd": float(np.std(v, ddof=1)),
                    "min": min(v),
                    "max": max(v),
                }  # fmt: skip
                for k, v in c.items()
            }
            for q, c in counts.items()
        }
        for q, c in res["seeds"].items():
            print(f"q = {q}: " + "; ".join(
                f"{k} {v['mean']:.1f} (sd {v['sd']:.1f}, {v['min']}-{v['max']})"
                for k, v in c.items()))  # fmt: skip
    if mokapot_python:
        pin = _shared_file("psm_pin_mokapot_10k", "10k_psms_test.pin.gz")
        p = subprocess.run(
            [mokapot_python, str(HERE / "_mokapot_run.py"), str(pin), *map(str, qs)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if p.returncode == 0:
            mk = json.loads(p.stdout.strip().splitlines()[-1])
            res["mokapot"] = mk
            for q in qs:
                res[f"q{q}"]["mokapot"] = {
                    "accepted": mk["accepted"][str(q)],
                    "fit_s": mk["fit_s"],
                }
        else:
            res["mokapot"] = {"error": p.stderr[-2000:]}
    else:
        res["mokapot"] = "not run: pass --mokapot-python PATH (a venv with mokapot)"
    _save(out, "sgd_qvalue", res)
    return res


def _shared_file(name: str, file: str) -> Path:
    from bigrate.data.prep import find_shared_data

    return find_shared_data() / name / file


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "what",
        choices=[
            "speed",
            "pairs",
            "blockq",
            "rounds",
            "scale",
            "ooc",
            "job",
            "quality",
            "qvalue",
            "all",
        ],
    )
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="scale: fits of each size")
    ap.add_argument("--engine", choices=["dask", "ray"], default="dask", help="scale")
    ap.add_argument("--out", default=str(HERE / "out"))
    ap.add_argument("--mokapot-python", help="python of a venv with mokapot installed")
    ap.add_argument("--seeds", type=int, default=1, help="qvalue: seeds of the folds")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = (
        ["speed", "scale", "quality", "qvalue", "ooc"] if a.what == "all" else [a.what]
    )
    for w in todo:
        if w == "speed":
            bench_speed(out, a.rows or 804_414)
        elif w == "pairs":
            bench_pairs(out, a.rows or 300_000)
        elif w == "blockq":
            bench_blockq(out)
        elif w == "rounds":
            bench_rounds(out, a.rows or 804_414)
        elif w == "scale":
            bench_scale(out, a.rows or 804_414, a.repeats, a.engine)
        elif w == "ooc":
            bench_ooc(out, a.rows or 5 * 804_414)
        elif w == "job":
            bench_job(out, a.rows or 5 * 804_414)
        elif w == "quality":
            bench_quality(out)
        elif w == "qvalue":
            bench_qvalue(out, a.mokapot_python, a.seeds)


if __name__ == "__main__":
    main()
