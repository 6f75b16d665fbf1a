"""Train one estimator on a shard dataset with an engine, evaluate it, save the run.

Used by ``bigrate train``; the job files of ``bigrate run`` build on the same function.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bigrate.data.reader import ShardedDataset
from bigrate.engines import ENGINES, open_engine
from bigrate.files import jsonable
from bigrate.runner.job import evaluate_model, fit_on_engine
from bigrate.runner.registry import entry, make_estimator


def train(
    dataset,
    estimator: str,
    params: dict,
    *,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
    out=None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Fit ``estimator`` on the train split, evaluate on val/test (streaming), save the
    model and a ``result.json`` in ``out`` (an earlier result there is replaced only
    with ``overwrite``); returns the result."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if out is not None and not overwrite:
        held = [n for n in ("model", "result.json") if (Path(out) / n).exists()]
        if held:
            raise FileExistsError(
                f"{out}: already holds a trained model ({', '.join(held)}); pass "
                "--overwrite to replace it, or choose another --out"
            )
    ds = dataset if isinstance(dataset, ShardedDataset) else ShardedDataset(dataset)
    est = make_estimator(estimator, params)
    t0 = time.perf_counter()
    with open_engine(engine, address, n_workers=workers) as eng:
        est = fit_on_engine(est, ds, eng, progress)
    fit_s = time.perf_counter() - t0
    target_name = entry(estimator).target
    result = {
        "dataset": ds.path,
        "estimator": estimator,
        "params": jsonable(est.get_params()),
        "engine": engine,
        "fit_seconds": fit_s,
        target_name: est.get_params()[target_name],
        "multiplier": est.multiplier_,
        "evaluation": evaluate_model(est, ds, ds.splits),
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        from bigrate.runner.modelio import save_trained

        save_trained(est, out / "model", ds)
        from bigrate.files import atomic_write_text

        atomic_write_text(
            out / "result.json", json.dumps(jsonable(result), indent=2) + "\n"
        )
        result["out"] = str(out)
    return result


def report(result: dict, file=sys.stdout) -> None:
    from bigrate.runner.status import results_table

    name = "rho" if "rho" in result else "q"
    target = result[name]
    print(
        f"{result['estimator']} on {result['dataset']} ({result['engine']} engine), "
        f"{name} = {target}, fit {result['fit_seconds']:.1f}s, lambda = "
        f"{result['multiplier']:.4g}",
        file=file,
    )
    print(results_table(result["evaluation"], {name: target}), file=file)
    if result.get("out"):
        print(f"model and result.json saved in {result['out']}", file=file)
