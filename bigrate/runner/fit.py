"""How a job fits each estimator family on its engine (what the class declares as
``_job_fit``, :class:`bigrate.base.RateClassifierMixin`):

- "rounds": the SGD learners, by the checkpointed distributed rounds of
  :func:`bigrate.linear.fit_distributed` (each worker reads its own shards);
- "task": one engine task on the train split, read where it runs, as the estimator
  takes it (shards, CSR or dense: :func:`bigrate.model_selection.sweep.fit_split`);
  a quantile path then chooses its tau on a held-out split (``[path]``);
- "search": BPSP, whose (gamma, space, fold) tasks run on the engine and are saved in
  the run directory one by one as they finish, so that a resumed run redoes none; the
  best pair is then refitted.

A job's estimator is built from its parameters here too: constraints and objectives
from their text, a ``init`` or churn ``baseline`` from a saved model's path.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.files import atomic_write_text, jsonable
from bigrate.model_selection.sweep import fit_split
from bigrate.rundir import RunDir
from bigrate.runner.registry import make_estimator
from bigrate.runner.spec import JobSpec, load_baseline


def job_estimator(spec: JobSpec, params: dict):
    """The job's estimator with ``params``: constraints and objective parsed from
    their text, an ``init`` given as a saved model's path loaded."""
    params = dict(params)
    if spec.estimator == "RateConstrainedClassifier":
        from bigrate.constrained.parse import parse_constraint, parse_expression

        params["constraints"] = [
            parse_constraint(t, load_baseline).constraint for t in spec.constraints
        ]
        if spec.objective is not None:
            params["objective"] = parse_expression(spec.objective, load_baseline)
        if isinstance(params.get("init"), str):
            params["init"] = load_baseline(params["init"])
    return make_estimator(spec.estimator, params)


def fit_on_engine(est, ds: ShardedDataset, eng, progress: bool = True, **ckpt):
    """Fit ``est`` on the train split of ``ds`` with engine ``eng``: the SGD learners
    by their distributed rounds on every engine (``ckpt``: the checkpoint arguments
    and ``workers``, the shares of the data), the others as one task on a cluster or
    in this process. Returns the fitted estimator."""
    if est._job_fit == "rounds":
        from bigrate.linear.distributed import fit_distributed

        return fit_distributed(est, ds, eng, progress=progress, **ckpt)
    if eng.name == "local":
        return fit_split(est, ds.ref, est._job_data)
    return eng.run(fit_split, [(est, ds.ref, est._job_data)], what="the fit")[0]


def select_tau(spec: JobSpec, est, ds: ShardedDataset, progress: bool, say) -> None:
    """A quantile path's tau chosen on the split ``spec.path["split"]`` for the
    false-alarm target ``spec.path["rho"]`` (:meth:`QuantilePathSVC.select_tau`)."""
    sel = spec.path
    if sel["split"] not in ds.splits:
        raise ValueError(
            f"path.split: {ds.path} has no split {sel['split']!r} (has "
            f"{', '.join(ds.splits)})"
        )
    held = ds.to_csr(sel["split"])
    table = est.select_tau(held.X, held.y, rho=sel["rho"], by=sel["select"])
    if progress:
        j = int(np.argmin(np.abs(table["tau"] - table["tau_chosen"])))
        say(
            f"quantile path: tau {table['tau_chosen']:.3f} chosen on the "
            f"{sel['split']} split ({sel['select']}, rho {sel['rho']:g}): Pfa "
            f"{table['pfa'][j]:.4f}, Pnd {table['pnd'][j]:.4f}"
        )


# --------------------------------------------------------------------- BPSP search


def _task_file(run: RunDir, key: tuple):
    g, sp, k = key
    return run.path / "tasks" / f"bpsp-g{g}-{sp}-f{k}.npz"


def _save_task(run: RunDir, key: tuple, res: dict) -> None:
    """One finished task's cells (arrays) and diagnostics, written atomically."""
    import io

    path = _task_file(run, key)
    path.parent.mkdir(exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(res[k]) for k in ("vert", "off", "fn", "fp")},
             diagnostics=np.array(json.dumps(jsonable(res["diagnostics"]))))  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def _load_task(run: RunDir, key: tuple) -> dict | None:
    path = _task_file(run, key)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in ("vert", "off", "fn", "fp")}
            out["diagnostics"] = json.loads(str(z["diagnostics"]))
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a readable BPSP task result ({e})") from None
    return out


def fit_bpsp(spec: JobSpec, params: dict, ds: ShardedDataset, eng, run: RunDir,
             progress: bool, after_task=None):  # fmt: skip
    """BPSPSearchCV as a job: its (gamma, space, fold) tasks on the job's engine, each
    saved under ``tasks/`` as it finishes (a resumed run loads those and runs the
    rest), then the best pair refitted on the train split, the partition and the
    CV-error map written into the run directory. ``after_task()`` runs after each
    (Ctrl-C). Returns the fitted search."""
    import os

    from threadpoolctl import threadpool_limits

    from bigrate.engines.local import LocalEngine
    from bigrate.model_selection.bpsp.search import (
        EarlyBest,
        fold_cells,
        release_rings,
    )
    from bigrate.progress import Progress

    est = job_estimator(spec, params)
    whole = ds.to_csr("train")
    plan = est.plan(whole.X.toarray(), whole.y)
    results = {}
    for key in plan.tasks:
        got = _load_task(run, key)
        if got is not None:
            results[key] = got
    todo = [j for j, key in enumerate(plan.tasks) if key not in results]
    run.event("bpsp_started", tasks=len(plan.tasks), todo=len(todo),
              done=len(plan.tasks) - len(todo))  # fmt: skip
    bar = Progress("BPSP tasks", total=len(plan.tasks), done=len(results),
                   enabled=progress)  # fmt: skip
    # the local engine runs the tasks on a thread per worker ([engine] workers, default
    # one per core), as BPSPSearchCV does: the partitions are compiled code that
    # releases the GIL; one BLAS thread in this process meanwhile
    runner = eng
    if eng.name == "local":
        runner = LocalEngine(threads=spec.workers or os.cpu_count() or 1)
    # the local engine's threads keep their rings' memory from task to task
    plan.base["reuse_rings"] = runner.name == "local"
    # each space's best point, found while the other tasks run (of a resumed run:
    # at once where its folds were saved)
    early = EarlyBest(plan, est.cost_fn, est.cost_fp, est.lambda_min)
    for key in list(results):
        early.add(key, results)
    with threadpool_limits(1, user_api="blas"):
        handle = eng.put(plan.data) if todo else None
        args = [plan.task_args(handle, j) for j in todo]
        try:
            for i, res in runner.map(fold_cells, args, what="BPSP tasks"):
                j = todo[i]
                key = plan.tasks[j]
                if isinstance(res, Exception):
                    raise RuntimeError(
                        f"BPSP task {plan.describe(j)} failed: {res}"
                    ) from None
                _save_task(run, key, res)
                results[key] = res
                early.add(key, results)
                g, sp, k = key
                run.event("task_done", gamma=plan.gammas[g], space=sp, fold=k,
                          seconds=res["diagnostics"].get("seconds"))  # fmt: skip
                bar.update(1)
                if after_task is not None:
                    after_task()
            known = early.results()
        finally:
            release_rings()  # one thread: the tasks ran on this one
            early.shutdown()
    bar.close()
    t = time.perf_counter()
    est.set_params(run_dir=str(run.path))  # the partition and its map, saved
    est.assemble(plan, results, known)
    run.event("bpsp_selected", params=est.best_params_, cv_error=est.cv_error_,
              area=est.best_region_area_, seconds=time.perf_counter() - t)  # fmt: skip
    est.set_params(run_dir=None)
    return est


def bpsp_summary(est) -> dict:
    """What metrics.json records of a fitted search."""
    return {"best_params": est.best_params_, "cv_error": est.cv_error_,
            "best_region_area": est.best_region_area_,
            "cost_fn": est.cost_fn, "cost_fp": est.cost_fp}  # fmt: skip


def write_json(path, obj) -> None:
    atomic_write_text(path, json.dumps(jsonable(obj), indent=2) + "\n")
