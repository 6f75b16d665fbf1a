"""Train one estimator on a shard dataset with an engine, evaluate it, save the run.

Used by ``bigrate train``; the job files of ``bigrate run`` build on the same function.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bigrate.data.reader import ShardedDataset
from bigrate.io import _jsonable
from bigrate.metrics import evaluate_stream

ESTIMATORS = {
    "NeymanPearsonSGD": ("bigrate.linear", "NeymanPearsonSGD", "rho"),
    "QValueSGD": ("bigrate.linear", "QValueSGD", "q"),
}
ENGINES = ("local", "dask")


def make_estimator(name: str, params: dict):
    import importlib

    if name not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {name!r}")
    mod, cls, _ = ESTIMATORS[name]
    est_cls = getattr(importlib.import_module(mod), cls)
    valid = set(est_cls().get_params())
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"{name} has no parameter(s) {unknown}; valid: {sorted(valid)}"
        )
    return est_cls(**params)


def train(
    dataset,
    estimator: str,
    params: dict,
    *,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
    out=None,
    progress: bool = True,
) -> dict:
    """Fit ``estimator`` on the train split, evaluate on val/test (streaming), save the
    model and a ``result.json`` in ``out``; returns the result."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    ds = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
    est = make_estimator(estimator, params)
    t0 = time.perf_counter()
    if engine == "dask":
        from bigrate.engines.dask import DaskEngine, fit_dask

        with DaskEngine(address, n_workers=workers) as eng:
            fit_dask(est, ds, eng, progress=progress)
    else:
        est.set_params(verbose=1 if progress else 0)
        est.fit(ds)
    fit_s = time.perf_counter() - t0
    target_name = ESTIMATORS[estimator][2]
    target = est.get_params()[target_name]
    result = {
        "dataset": ds.path,
        "estimator": estimator,
        "params": _jsonable(est.get_params()),
        "engine": engine,
        "fit_seconds": fit_s,
        target_name: target,
        "multiplier": est.multiplier_,
        "evaluation": {},
    }
    for split in ds.splits:
        c = evaluate_stream(est.decision_function, ds, split)
        ev = {"pfa": c.pfa, "pnd": c.pnd, "n_pos": c.n_pos, "n_neg": c.n_neg}
        if target_name == "rho":
            ev["j_val"] = c.j_val(target)
        result["evaluation"][split] = ev
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        est.save(out / "model")
        from bigrate.data.writer import atomic_write_text

        atomic_write_text(
            out / "result.json", json.dumps(_jsonable(result), indent=2) + "\n"
        )
        result["out"] = str(out)
    return result


def report(result: dict, file=sys.stdout) -> None:
    name = "rho" if "rho" in result else "q"
    target = result[name]
    print(
        f"{result['estimator']} on {result['dataset']} ({result['engine']} engine), "
        f"{name} = {target}, fit {result['fit_seconds']:.1f}s, lambda = "
        f"{result['multiplier']:.4g}",
        file=file,
    )
    print(f"{'split':<8}{'Pfa':>9}{'Pnd':>9}   Pfa <= {name}?", file=file)
    for split, ev in result["evaluation"].items():
        ok = "yes" if ev["pfa"] <= target else f"no (+{ev['pfa'] - target:.4f})"
        print(f"{split:<8}{ev['pfa']:>9.4f}{ev['pnd']:>9.4f}   {ok}", file=file)
    if result.get("out"):
        print(f"model and result.json saved in {result['out']}", file=file)
