"""Running a job: train, sweep or evaluate, on the local, Dask or Ray engine, into a run
directory that can be resumed after any interruption."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.metrics import evaluate_stream
from bigrate.progress import Progress
from bigrate.runner import interrupt, tasks
from bigrate.runner.rundir import RunDir
from bigrate.runner.spec import ESTIMATORS, SELECT, JobSpec


def _say(msg: str) -> None:
    print(f"[bigrate] {msg}", file=sys.stderr, flush=True)


@contextmanager
def open_engine(spec: JobSpec, run: RunDir | None = None, progress: bool = True):
    """The job's engine: embedded on 127.0.0.1, or connected to ``spec.address``."""
    t = time.perf_counter()
    if spec.engine == "dask":
        from bigrate.engines.dask import DaskEngine

        eng = DaskEngine(spec.address or None, n_workers=spec.workers)
    elif spec.engine == "ray":
        from bigrate.engines.ray import RayEngine

        eng = RayEngine(spec.address or None, n_workers=spec.workers)
    else:
        from bigrate.engines.local import LocalEngine

        eng = LocalEngine()
    startup = time.perf_counter() - t
    link = eng.dashboard_link
    if progress and spec.engine != "local":
        where = spec.address or "embedded, 127.0.0.1"
        _say(
            f"{spec.engine} engine ({where}) ready in {startup:.1f}s"
            + (f"; dashboard {link}" if link else "")
        )
    if run is not None:
        run.event(
            "engine_started",
            engine=spec.engine,
            address=spec.address,
            seconds=startup,
            dashboard=link,
        )
    try:
        yield eng
    finally:
        eng.close()


def _evaluate_model(est, ds: ShardedDataset, splits, estimator_name: str) -> dict:
    out = {}
    target = ESTIMATORS[estimator_name][2]
    value = est.get_params()[target]
    for split in splits:
        if split not in ds.splits:
            continue
        c = evaluate_stream(est.decision_function, ds, split)
        ev = {"pfa": c.pfa, "pnd": c.pnd, "n_pos": c.n_pos, "n_neg": c.n_neg}
        if target == "rho":
            ev["J_val"] = c.j_val(value)
            ev["pfa_within_rho"] = c.pfa <= value
        else:
            ys, fs = [], []
            for b in ds.iter_batches(split):
                ys.append(b.y)
                fs.append(est.decision_function(b.X))
            from bigrate.metrics import positives_at_q

            ev["accepted"] = positives_at_q(
                np.concatenate(ys), np.concatenate(fs), value
            )
        out[split] = ev
    return out


def _fit(spec: JobSpec, params: dict, ds: ShardedDataset, eng, progress: bool):
    """Fit ``spec.estimator`` with ``params`` on the train split with the job's engine."""
    est = tasks.make_estimator(spec.estimator, params)
    if spec.engine == "dask":
        from bigrate.engines.dask import fit_dask

        return fit_dask(est, ds, eng, progress=progress)
    if spec.engine == "ray":  # the whole streaming fit as one task on the cluster
        for _, res in eng.map(tasks.fit_full, [(spec.estimator, params, ds.path)]):
            if isinstance(res, Exception):
                raise RuntimeError(f"training failed on the Ray cluster: {res}")
            return res
    est.set_params(verbose=1 if progress else 0)
    return est.fit(ds)


def _finish_model(spec: JobSpec, run: RunDir, est, ds: ShardedDataset, extra: dict):
    est.save(run.path / "model")
    ev = _evaluate_model(est, ds, ds.splits, spec.estimator)
    metrics = {"evaluation": ev, "history": getattr(est, "history_", []), **extra}
    run.write_json("metrics.json", metrics)
    run.event("model_saved", path="model", evaluation=ev)
    return metrics


def run_train(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    ds = ShardedDataset(spec.data)
    params = {"random_state": 0, **spec.params}
    with open_engine(spec, run, progress) as eng:
        t = time.perf_counter()
        run.event("train_started", params=params)
        est = _fit(spec, params, ds, eng, progress)
        fit_s = time.perf_counter() - t
    run.event("train_finished", seconds=fit_s)
    return _finish_model(spec, run, est, ds, {"fit_seconds": fit_s, "params": params})


def run_sweep(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    """Every (grid point, fold) as an engine task; finished tasks are skipped on resume;
    a failing task is recorded with its traceback and the sweep goes on."""
    ds = ShardedDataset(spec.data)
    points = spec.points()
    base = {"random_state": 0, **spec.params}
    folds = ["val"] if spec.cv == "val" else list(range(int(spec.cv)))
    done = run.results()
    todo = [
        (p, k)
        for p in range(len(points))
        for k in range(len(folds))
        if (p, k) not in done
    ]
    total = len(points) * len(folds)
    run.event(
        "sweep_started",
        points=len(points),
        folds=len(folds),
        todo=len(todo),
        done=len(done),
    )
    if spec.cv == "val" and "val" not in ds.splits:
        raise ValueError(f'sweep.cv = "val" but {ds.path} has no val split')
    bar = Progress("sweep", total=total, done=len(done), enabled=progress)
    with open_engine(spec, run, progress) as eng:
        if todo:
            if spec.cv == "val":
                args = [
                    (spec.estimator, {**base, **points[p]}, ds.path) for p, _ in todo
                ]
                fn = tasks.fit_val
            else:
                from sklearn.model_selection import StratifiedKFold

                whole = ds.to_csr("train")
                X, y = whole.X, whole.y
                splits = list(
                    StratifiedKFold(
                        int(spec.cv), shuffle=True, random_state=spec.seed
                    ).split(X, y)
                )
                handle = eng.put((X, y))
                args = [
                    (
                        spec.estimator,
                        {**base, **points[p]},
                        handle,
                        splits[k][0],
                        splits[k][1],
                    )
                    for p, k in todo
                ]
                fn = tasks.fit_fold
            for i, res in eng.map(fn, args):
                p, k = todo[i]
                rec = {"point": p, "fold": k, "params": points[p]}
                if isinstance(res, Exception):
                    rec.update(
                        status="failed",
                        error=str(res)[:2000],
                        traceback=getattr(res, "tb", ""),
                    )
                    run.event("task_failed", point=p, fold=k, error=str(res)[:500])
                else:
                    rec.update(status="ok", **res)
                    run.event("task_done", point=p, fold=k, seconds=res["seconds"])
                run.save_result(p, k, rec)
                run.write_results_table()
                bar.update(1, _best_text(spec, run.results(), len(folds)))
                interrupt.check()
        bar.close()
        table = _aggregate(spec, run.results(), points, len(folds))
        ok = [r for r in table if r["complete"]]
        if not ok:
            raise RuntimeError(
                f"every sweep point failed; see {run.path}/results/ for the tracebacks"
            )
        sign = 1 if SELECT[spec.select] == "min" else -1
        best = min(ok, key=lambda r: sign * r[spec.select])
        run.event(
            "sweep_selected",
            point=best["point"],
            params=best["params"],
            score=best[spec.select],
        )
        if progress:
            _say(
                f"best point {best['point']}: {best['params']} ({spec.select} = "
                f"{best[spec.select]:.4g}); refitting on the whole train split"
            )
        params = {**base, **best["params"]}
        t = time.perf_counter()
        est = _fit(spec, params, ds, eng, progress)
        fit_s = time.perf_counter() - t
    return _finish_model(
        spec,
        run,
        est,
        ds,
        {
            "fit_seconds": fit_s,
            "params": params,
            "sweep": {
                "select": spec.select,
                "best": best,
                "points": table,
                "failed_tasks": sum(
                    1 for r in run.results().values() if r["status"] != "ok"
                ),
            },
        },
    )


def _aggregate(spec: JobSpec, results: dict, points: list, n_folds: int) -> list[dict]:
    table = []
    for p, params in enumerate(points):
        recs = [results.get((p, k)) for k in range(n_folds)]
        good = [r for r in recs if r is not None and r["status"] == "ok"]
        row = {"point": p, "params": params, "complete": len(good) == n_folds}
        if good:
            for key in good[0]["metrics"]:
                row[key] = float(np.mean([r["metrics"][key] for r in good]))
        table.append(row)
    return table


def _best_text(spec: JobSpec, results: dict, n_folds: int) -> str:
    vals = [r["metrics"][spec.select] for r in results.values() if r["status"] == "ok"]
    if not vals:
        return ""
    best = min(vals) if SELECT[spec.select] == "min" else max(vals)
    return f"best fold {spec.select} {best:.4g}"


def run_evaluate(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    from bigrate.io import load_model

    est = load_model(spec.model)
    ds = ShardedDataset(spec.data)
    name = next((n for n, v in ESTIMATORS.items() if v[1] == type(est).__name__), None)
    bad = [s for s in spec.splits if s not in ds.splits]
    if bad:
        raise ValueError(
            f"evaluate.splits: {bad} not in {ds.path} (has {list(ds.splits)})"
        )
    ev = _evaluate_model(est, ds, spec.splits, name)
    metrics = {"evaluation": ev, "model": spec.model}
    run.write_json("metrics.json", metrics)
    run.event("evaluated", evaluation=ev)
    return metrics


def execute(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    """Run (or resume) ``spec`` in ``run``; the caller holds the run's lock."""
    run.event("run_started", kind=spec.kind, engine=spec.engine, address=spec.address)
    t = time.perf_counter()
    if spec.kind == "train":
        out = run_train(spec, run, progress)
    elif spec.kind == "sweep":
        out = run_sweep(spec, run, progress)
    else:
        out = run_evaluate(spec, run, progress)
    run.event("run_finished", seconds=time.perf_counter() - t)
    return out


def start(spec: JobSpec, progress: bool = True) -> tuple[RunDir, dict]:
    """Create a run directory for ``spec`` and run it."""
    run = RunDir.create(spec.output, spec.name, spec.source, {"job": spec.to_json()})
    if progress:
        _say(f"run directory {run.path}")
    try:
        return run, execute(spec, run, progress)
    finally:
        run.unlock()


def resume(
    path, progress: bool = True, overrides: dict | None = None
) -> tuple[RunDir, dict]:
    """Continue an interrupted run: finished sweep tasks are not redone."""
    run = RunDir.open(path)
    run.lock()
    try:
        spec = JobSpec.from_json(run.read_json("config.json")["job"])
        for k, v in (overrides or {}).items():
            if v:
                setattr(spec, k, v)
        if (run.path / "metrics.json").exists() and any(
            e["event"] == "run_finished" for e in run.events()
        ):
            if progress:
                _say(f"{run.path} is already complete")
            return run, run.read_json("metrics.json")
        run.event("resumed")
        return run, execute(spec, run, progress)
    finally:
        run.unlock()
