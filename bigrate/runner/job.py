"""Running a job: train, sweep or evaluate, on the local, Dask or Ray engine, into a run
directory that can be resumed after any interruption."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager, nullcontext

import numpy as np

from bigrate.data.reader import ShardedDataset
from bigrate.engines import ClusterLost
from bigrate.engines import open_engine as _open
from bigrate.model_selection.sweep import (
    SharedFolds,
    c_chains,
    fit_fold,
    fit_fold_path,
    fit_val,
    rank_points,
    select_best,
    warm_task,
    write_summary,
)
from bigrate.model_selection.sweep import run_sweep as _sweep
from bigrate.progress import Progress
from bigrate.rundir import RunDir
from bigrate.runner import interrupt
from bigrate.runner.evaluate import constraint_table, evaluate
from bigrate.runner.fit import (
    bpsp_summary,
    fit_bpsp,
    fit_on_engine,
    job_estimator,
    select_tau,
)
from bigrate.runner.modelio import TrainedModel, save_trained
from bigrate.runner.registry import entry
from bigrate.runner.spec import JobSpec


def _say(msg: str) -> None:
    print(f"[bigrate] {msg}", file=sys.stderr, flush=True)


@contextmanager
def open_engine(spec: JobSpec, run: RunDir | None = None, progress: bool = True):
    """The job's engine, embedded on 127.0.0.1 or connected to ``spec.address``, and
    the number of workers it starts with (at the address: waited for, up to
    ``spec.workers`` or at least one, for ``spec.worker_wait`` seconds). The engine's
    notices (a stall, waiting for workers) are console lines and ``notice`` events."""
    t = time.perf_counter()
    extra = {} if spec.memory_limit is None else {"memory_limit": spec.memory_limit}
    eng = _open(
        spec.engine, spec.address or None, n_workers=spec.workers,
        timeout=spec.timeout, worker_wait=spec.worker_wait, **extra,
    )  # fmt: skip
    try:
        eng.on_notice = _notices(run, progress)
        eng.should_stop = interrupt.requested  # a signal ends a wait that is idle
        workers = (
            eng.wait_for_workers(spec.workers or 1) if spec.address else eng.n_workers
        )
        startup = time.perf_counter() - t
        link = eng.dashboard_link
        if progress and spec.engine != "local":
            where = spec.address or "embedded, 127.0.0.1"
            _say(
                f"{spec.engine} engine ({where}) ready in {startup:.1f}s with "
                f"{workers} worker{'s' * (workers != 1)}"
                + (f"; dashboard {link}" if link else "")
            )
        if run is not None:
            run.event(
                "engine_started",
                engine=spec.engine,
                address=spec.address,
                workers=workers,
                seconds=startup,
                dashboard=link,
            )
        yield eng, workers
    finally:
        eng.close()


def _notices(run: RunDir | None, progress: bool):
    """Where an engine's notices go: a console line and a ``notice`` event."""

    def notice(message: str) -> None:
        if run is not None:
            run.event("notice", message=message)
        if progress:
            _say(message)

    return notice


def _cluster_events(eng, run: RunDir | None, progress: bool):
    """A callback recording what the engine noticed (a lost or joined worker) as an
    event of the run and one console line each."""

    last = [time.monotonic()]

    def poll(*_, force: bool = False):
        # a round trip to the scheduler: at most once a second between short tasks
        if not force and time.monotonic() - last[0] < 1.0:
            return
        last[0] = time.monotonic()
        for e in eng.poll_events():
            if run is not None:
                run.event(e["event"], worker=e["worker"], engine=eng.name)
            if progress or e["event"] == "worker_lost":
                what = "lost" if e["event"] == "worker_lost" else "joined"
                _say(
                    f"{eng.name}: worker {e['worker']} {what}"
                    + ("; its tasks run again on the others" if what == "lost" else "")
                )

    eng.poll_events()  # the starting set
    return poll


def evaluate_model(est, ds: ShardedDataset, splits, score=None, engine=None,
                   cost=None) -> dict:  # fmt: skip
    """The rate metrics of a fitted model on each split of ``ds`` that exists, against
    the rate the model promises (:meth:`rate_target`), with ``cost = (cost_fn,
    cost_fp)`` if given (:mod:`bigrate.runner.evaluate`: on ``engine``'s workers, or in
    this process). ``score`` (default: the model's decision_function) maps a block of
    rows of ``ds`` to scores."""
    target = {**est.rate_target(), **({"cost": cost} if cost else {})}
    score = est.decision_function if score is None else score
    return evaluate(score, ds, splits, target, engine)


def _checkpoints(spec: JobSpec, run: RunDir) -> dict:
    """Checkpoint arguments of a training fit in ``run``: snapshots every
    ``checkpoint_rounds`` rounds or ``checkpoint_minutes``, each recorded as a
    ``checkpoint`` event; a snapshot left by an earlier attempt is resumed from."""
    from bigrate.linear.distributed import load_snapshot, save_snapshot

    where = run.path / "checkpoint"

    def save(snap):
        t = time.perf_counter()
        save_snapshot(snap, where)
        run.event("checkpoint", round=snap.round, seconds=time.perf_counter() - t)

    resume = load_snapshot(where) if (where / "snapshot.json").exists() else None
    return {
        "checkpoint": save,
        "checkpoint_rounds": spec.checkpoint_rounds,
        "checkpoint_seconds": 60.0 * spec.checkpoint_minutes,
        "resume": resume,
    }


def checkpoint_round(run: RunDir) -> int | None:
    """The round of the run's last checkpoint, or None."""
    f = run.path / "checkpoint" / "snapshot.json"
    if not f.exists():
        return None
    import json

    try:
        return int(json.loads(f.read_text())["round"])
    except (ValueError, KeyError, OSError):
        return None


def _fit(spec: JobSpec, params: dict, ds: ShardedDataset, eng, progress: bool,
         run: RunDir | None = None, on_round=None, workers: int | None = None):  # fmt: skip
    """Fit the job's estimator with ``params``; streaming learners deal the data into
    ``workers`` shares (a resumed fit: its checkpoint's) and checkpoint into ``run``;
    a quantile path chooses its tau (``[path]``) after."""
    est = job_estimator(spec, params)
    ckpt = {}
    if entry(spec.estimator).streams:
        if run is not None:
            ckpt = {**_checkpoints(spec, run), "on_round": on_round}
        if ckpt.get("resume") is None:
            ckpt["workers"] = workers
        ckpt["rounds_per_epoch"] = spec.rounds_per_epoch
        ckpt["merge"] = spec.merge
    est = fit_on_engine(est, ds, eng, progress, **ckpt)
    if spec.path is not None:
        select_tau(spec, est, ds, progress, _say)
    return est


def _save_model(run: RunDir, est, ds: ShardedDataset, **info) -> None:
    """The fitted model into ``run/model`` (a ``model_saved`` event with ``info``)."""
    save_trained(est, run.path / "model", ds)
    run.event("model_saved", path="model", **info)


def _evaluate_into(spec: JobSpec, run: RunDir, est, ds: ShardedDataset, eng,
                   extra: dict) -> dict:  # fmt: skip
    """The model's metrics on every split (on ``eng``'s workers), with ``extra``, into
    ``metrics.json`` (an ``evaluated`` event): the rates against what it promises,
    a search's costs, and each of a job's constraints."""
    cost = (est.cost_fn, est.cost_fp) if spec.estimator == "BPSPSearchCV" else None
    ev = evaluate_model(est, ds, ds.splits, engine=eng, cost=cost)
    metrics = {"evaluation": ev, "target": est.rate_target(),
               "history": getattr(est, "history_", []), **extra}  # fmt: skip
    if getattr(est, "engine_", None):  # the rounds: where their time went, the merge
        metrics["engine"] = est.engine_
    promise = getattr(getattr(est, "best_estimator_", est), "guarantee_", None)
    if promise is not None:
        metrics["guarantee"] = promise
    if spec.constraints:
        metrics["constraints"] = constraint_table(est, ds, ds.splits, spec.constraints)
    if spec.estimator == "BPSPSearchCV":
        metrics["bpsp"] = bpsp_summary(est)
    if getattr(est, "tau_selection_", None):
        metrics["tau"] = {**est.tau_selection_, "split": spec.path["split"]}
    run.write_json("metrics.json", metrics)
    run.event("evaluated", evaluation=ev)
    return metrics


def _seeded(spec: JobSpec) -> dict:
    """The job's parameters, with ``random_state = 0`` unless it sets one (for the
    estimators that take one): a job's result is reproducible."""
    if "random_state" in entry(spec.estimator).load()().get_params():
        return {"random_state": 0, **spec.params}
    return dict(spec.params)


def _trained(run: RunDir) -> tuple | None:
    """``(model, seconds)`` of a model this run finished training before it stopped
    (saved, then its ``train_finished`` event), or None."""
    done = next(
        (e for e in reversed(run.events()) if e["event"] == "train_finished"), None
    )
    if done is None or not (run.path / "model" / "model.json").exists():
        return None
    from bigrate.io import load_model

    return load_model(run.path / "model"), done["seconds"]


def check_data(spec: JobSpec) -> None:
    """The job's dataset checked against its manifest before any cluster starts or run
    directory is made (file sizes, Parquet footers and row counts on a local disk; the
    row counts alone on object storage, where each footer is a request)."""
    ds = spec.dataset()
    ds.check(files=ds.is_local)


def run_train(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    """Fit the job's estimator on the train split (a streaming learner by checkpointed
    rounds), save the model, evaluate it on every split; a run resumed after the model
    was saved only evaluates it."""
    ds = spec.dataset()
    params = _seeded(spec)
    with open_engine(spec, run, progress) as (eng, workers):
        events = _cluster_events(eng, run, progress)
        trained = _trained(run)
        if trained is not None:
            est, fit_s = trained
            if progress:
                _say("the model was trained and saved before; evaluating it")
        else:
            t = time.perf_counter()
            run.event("train_started", params=params)

            def on_round(*_):
                events()
                interrupt.check()  # a Ctrl-C during the round stops here

            # streaming fits stop between rounds on Ctrl-C (interrupt.deferred); a
            # search between tasks; any other fit is one long call and stops at once
            rounds = entry(spec.estimator).streams
            with interrupt.deferred() if rounds else nullcontext():
                if entry(spec.estimator).fit == "search":
                    est = fit_bpsp(spec, params, ds, eng, run, progress,
                                   after_task=on_round)  # fmt: skip
                else:
                    est = _fit(spec, params, ds, eng, progress, run, on_round, workers)
            events(force=True)  # a worker lost in the last round
            fit_s = time.perf_counter() - t
            _save_model(run, est, ds)
            run.event("train_finished", seconds=fit_s)
        metrics = _evaluate_into(
            spec, run, est, ds, eng, {"fit_seconds": fit_s, "params": params}
        )
        events(force=True)  # a worker lost during the evaluation
    return metrics


def run_sweep(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    """Every (grid point, fold) as an engine task (:func:`bigrate.model_selection.sweep.
    run_sweep`); finished tasks are skipped on resume, a failing task is recorded with
    its traceback and the sweep goes on; the best point is refitted on the train split."""
    ds = spec.dataset()
    points = spec.points()
    base = _seeded(spec)
    n_folds = 1 if spec.cv == "val" else int(spec.cv)
    if spec.cv == "val" and "val" not in ds.splits:
        raise ValueError(f'sweep.cv = "val" but {ds.path} has no val split')
    e = entry(spec.estimator)
    cls = e.load()
    defaults = cls().get_params()
    with open_engine(spec, run, progress) as (eng, workers):
        events = _cluster_events(eng, run, progress)
        t = time.perf_counter()
        # imports and compiled kernels loaded on every worker before the sweep; the
        # warm task never raises (a failure is recorded: the sweep's tasks say why)
        warm = eng.warm_up(warm_task, cls, {**base, **points[0]}, ds.n_features)
        run.event("engine_warm", seconds=time.perf_counter() - t,
                  task_seconds=[w["seconds"] for w in warm],
                  errors=sorted({w["error"] for w in warm if w["error"]}))  # fmt: skip

        def load_train():  # the train split and its folds, read once
            from sklearn.model_selection import StratifiedKFold

            whole = ds.to_csr("train")
            kfold = StratifiedKFold(n_folds, shuffle=True, random_state=spec.seed)
            return whole.X, whole.y, list(kfold.split(whole.X, whole.y))

        folds = SharedFolds(eng, load_train)
        if spec.cv != "val":
            # the train split read and its folds put on the workers before the sweep
            # (reported apart, as the engine's start-up and warm-up are)
            t = time.perf_counter()
            folds(0)
            run.event("data_loaded", seconds=time.perf_counter() - t)

        # a learner fitted by rounds is fitted on the val protocol by the same rounds
        # as the refit of the best point below (the same shares and schedule: the
        # same bits on any engine), so the model the job delivers is the one chosen
        rounds = (
            {"workers": workers, "rounds_per_epoch": spec.rounds_per_epoch}
            if e.streams else None
        )  # fmt: skip

        def task_args(p, k):
            params = {**base, **points[p]}
            target = {**cls(**params).rate_target(), "cost": spec.cost()}
            if spec.cv == "val":
                return (cls, params, ds.ref, target, e.data, rounds)
            return (cls, params, *folds(k), target)

        def chain_args(ps, k):  # warm starts along C: one task a chain and fold
            *_, data, tr, te, target = task_args(ps[0], k)
            return (cls, [{**base, **points[p]} for p in ps], data, tr, te, target)

        table = _sweep(
            eng, run, points, n_folds, fit_val if spec.cv == "val" else fit_fold,
            task_args, select=spec.select, progress=progress,
            after_task=lambda: (events(), interrupt.check()),
            batch_seconds=spec.batch_seconds,
            chains=c_chains(points, defaults.get("C")) if spec.warm_start else None,
            chain_task=fit_fold_path, chain_args=chain_args,
        )  # fmt: skip
        events(force=True)  # a worker lost during the last tasks
        rank_points(table, spec.select)
        write_summary(table, run.path / "summary.parquet")
        best = select_best(table, spec.select)
        score = best[f"mean_{spec.select}"]
        run.event("sweep_selected", point=best["point"], params=best["params"],
                  score=score)  # fmt: skip
        if progress:
            _say(
                f"best point {best['point']}: {best['params']} ({spec.select} = "
                f"{score:.4g}); refitting on the whole train split"
            )
        params = {**base, **best["params"]}
        t = time.perf_counter()
        est = _fit(spec, params, ds, eng, progress, workers=workers)
        fit_s = time.perf_counter() - t
        _save_model(run, est, ds)
        failed = sum(1 for r in run.results().values() if r["status"] != "ok")
        sweep = {"select": spec.select, "best": best, "points": table,
                 "failed_tasks": failed}  # fmt: skip
        return _evaluate_into(
            spec, run, est, ds, eng,
            {"fit_seconds": fit_s, "params": params, "sweep": sweep},
        )  # fmt: skip


def run_crossfit(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    """Every row of ``spec.crossfit_splits`` scored by the model of the fold that did
    not hold it (:mod:`bigrate.runner.crossfit`): one engine task a fold, each saved as
    it finishes (a resumed run fits the missing folds only), then the pooled scores
    into ``scores.parquet`` and their metrics into ``metrics.json``."""
    from bigrate.runner import crossfit as cf

    ds = spec.dataset()
    splits = list(spec.crossfit_splits or ds.splits)
    bad = [s for s in splits if s not in ds.splits]
    if bad:
        raise ValueError(
            f"crossfit.splits: {bad} not in {ds.path} (has {list(ds.splits)})"
        )
    params = _seeded(spec)
    est = job_estimator(spec, params)
    target = est.rate_target()
    t0 = time.perf_counter()
    rows = cf.pooled_rows(ds, splits)
    n = len(rows["y"])
    folds = cf.crossfit_folds(rows["y"], rows["group"], spec.folds, spec.seed)
    run.event("data_loaded", seconds=time.perf_counter() - t0, rows=n,
              splits=splits, grouped=rows["group"] is not None)  # fmt: skip
    f = np.full(n, np.nan)
    fold_of = np.full(n, -1, np.int16)
    done = run.results()
    todo = []
    for k, (_, te) in enumerate(folds):
        got = cf.load_fold(run.path, k, n) if (0, k) in done else None
        if got is not None and np.array_equal(np.sort(got[0]), np.sort(te)):
            f[got[0]], fold_of[got[0]] = got[1], k
        else:
            todo.append(k)
    run.event("crossfit_started", folds=spec.folds, rows=n, todo=todo,
              scale=spec.scale, params=params)  # fmt: skip
    with open_engine(spec, run, progress) as (eng, _):
        events = _cluster_events(eng, run, progress)
        if todo:
            data = eng.put((rows["X"], rows["y"]))
            args = [(est, data, eng.put(folds[k][0]), eng.put(folds[k][1]), spec.scale)
                    for k in todo]  # fmt: skip
            bar = Progress("crossfit", total=spec.folds, done=spec.folds - len(todo),
                           enabled=progress)  # fmt: skip
            for i, res in eng.map(cf.fit_fold_scores, args, what="the fold fits"):
                k = todo[i]
                if isinstance(res, Exception):
                    run.event("task_failed", point=0, fold=k, error=str(res)[:500])
                    raise RuntimeError(f"crossfit fold {k} failed: {res}") from res
                te = folds[k][1]
                _save_fold_model(run, res["model"], ds, k, res["scale"])
                cf.save_fold(run.path, k, te, res["scores"])
                rec = {key: res[key] for key in ("scale", "fit_seconds", "seconds",
                                                 "pid", "host")}  # fmt: skip
                rec.update(point=0, fold=k, status="ok", n_train=len(folds[k][0]),
                           n_scored=len(te))  # fmt: skip
                run.save_result(0, k, rec)
                run.event("task_done", point=0, fold=k, seconds=res["seconds"])
                f[te], fold_of[te] = res["scores"], k
                bar.update(1, f"fold {k}: {res['seconds']:.1f}s")
                events()
                interrupt.check()
            bar.close()
        events(force=True)
    cf.write_scores(run.path / "scores.parquet", rows, splits, f, fold_of)
    pooled = cf.pooled_metrics(rows, splits, f, fold_of, target, spec.folds)
    recs = run.results()
    metrics = {
        "evaluation": pooled["evaluation"],
        "target": target,
        "params": params,
        "crossfit": {
            "folds": spec.folds,
            "splits": splits,
            "rows": n,
            "grouped": rows["group"] is not None,
            "scale": spec.scale,
            "seed": spec.seed,
            "per_fold": [
                {
                    **pooled["per_fold"][k],
                    "scale": recs[(0, k)]["scale"],
                    "n_train": recs[(0, k)]["n_train"],
                    "seconds": recs[(0, k)]["seconds"],
                }
                for k in range(spec.folds)
            ],  # fmt: skip
            **(
                {"accepted_competed": pooled["accepted_competed"]}
                if "accepted_competed" in pooled
                else {}
            ),
        },
        "fit_seconds": sum(recs[(0, k)]["seconds"] for k in range(spec.folds)),
    }
    run.write_json("metrics.json", metrics)
    run.event("evaluated", evaluation=pooled["evaluation"])
    return metrics


def _save_fold_model(run: RunDir, est, ds: ShardedDataset, k: int, scale: float):
    """Fold k's model into ``run/models/fold-K`` (a ``model_saved`` event)."""
    save_trained(est, run.path / "models" / f"fold-{k}", ds)
    run.event("model_saved", path=f"models/fold-{k}", fold=k, scale=scale)


def run_evaluate(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    model = TrainedModel(spec.model)
    est = model.estimator
    ds = spec.dataset()
    bad = [s for s in spec.splits if s not in ds.splits]
    if bad:
        raise ValueError(
            f"evaluate.splits: {bad} not in {ds.path} (has {list(ds.splits)})"
        )
    with open_engine(spec, run, progress) as (eng, _):
        ev = evaluate_model(est, ds, spec.splits, score=model.scorer(ds), engine=eng)
    metrics = {"evaluation": ev, "target": est.rate_target(),
               "model": spec.model}  # fmt: skip
    run.write_json("metrics.json", metrics)
    run.event("evaluated", evaluation=ev)
    return metrics


def lost_message(e: ClusterLost) -> str:
    """One line for a run whose cluster was lost (``e`` as :func:`execute` raises it):
    what was lost and when, what is saved, and the command that continues."""
    import shlex

    at = f" {e.at}" if e.at else ""
    if getattr(e, "trained", False):
        saved = "the trained model is saved"
    elif e.checkpoint is not None:
        saved = f"the checkpoint after round {e.checkpoint} is saved"
    elif getattr(e, "tasks_done", 0):
        saved = f"{e.tasks_done} finished task(s) are saved"
    else:
        saved = "nothing was finished yet"
    cmd = f"bigrate resume {shlex.quote(e.run_path)}"
    if e.resume_address:
        cmd += f" --address {shlex.quote(e.resume_address)}"
    return f"{e}{at}; {saved}. Continue with: {cmd}"


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a job: what is finished (sweep tasks, the training checkpoint) is
    saved in ``run_path``; ``bigrate resume run_path`` continues."""

    def __init__(self, run_path, checkpoint: int | None = None):
        super().__init__(str(run_path))
        self.run_path = str(run_path)
        self.checkpoint = checkpoint


def _resumable(e: BaseException) -> bool:
    """Can ``bigrate resume`` help after this error? Not when the input is at fault
    (data, parameters, job file, an address that cannot be reached)."""
    from bigrate.engines import EngineConnectError
    from bigrate.errors import DataError

    return not isinstance(
        e, (DataError, ValueError, FileNotFoundError, EngineConnectError, TypeError)
    )


def execute(spec: JobSpec, run: RunDir, progress: bool = True) -> dict:
    """Run (or resume) ``spec`` in ``run``; the caller holds the run's lock. A failure
    is recorded as a ``run_failed`` event (with whether resuming can help), Ctrl-C as
    ``interrupted`` and raised as :class:`RunInterrupted`."""
    run.event("run_started", kind=spec.kind, engine=spec.engine, address=spec.address)
    t = time.perf_counter()
    try:
        if spec.kind == "train":
            out = run_train(spec, run, progress)
        elif spec.kind == "sweep":
            out = run_sweep(spec, run, progress)
        elif spec.kind == "crossfit":
            out = run_crossfit(spec, run, progress)
        else:
            out = run_evaluate(spec, run, progress)
    except KeyboardInterrupt:
        ck = checkpoint_round(run)
        run.event("interrupted", checkpoint_round=ck, tasks_done=len(run.results()))
        raise RunInterrupted(run.path, ck) from None
    except ClusterLost as e:
        e.trained = any(x["event"] == "train_finished" for x in run.events())
        if e.at is None:  # where the work stood, if the fit did not say
            done = len(run.results())
            e.at = ("during the final evaluation" if e.trained
                    else f"after {done} finished sweep tasks" if done else None)  # fmt: skip
        e.run_path, e.checkpoint = str(run.path), checkpoint_round(run)
        e.tasks_done, e.resume_address = len(run.results()), spec.address
        run.event(
            "run_failed",
            error=lost_message(e),
            cluster_lost=True,
            at=e.at,
            checkpoint_round=e.checkpoint,
            resumable=True,
        )
        raise
    except BaseException as e:
        import traceback

        run.event(
            "run_failed",
            error=f"{type(e).__name__}: {e}"[:2000],
            resumable=_resumable(e),
            traceback="".join(traceback.format_exception(e))[-20000:],
        )
        e.run_path = str(run.path)
        raise
    run.event("run_finished", seconds=time.perf_counter() - t)
    return out


def start(spec: JobSpec, progress: bool = True, run_path=None) -> tuple[RunDir, dict]:
    """Create a run directory for ``spec`` (``spec.output/NAME-<time>``, or exactly
    ``run_path``) and run it. An address that cannot be reached fails before the run
    directory is made."""
    from bigrate.engines import check_reachable

    check_data(spec)
    check_reachable(spec.engine, spec.address or None, spec.timeout)
    config = {"job": spec.to_json()}
    run = (
        RunDir.create_at(run_path, spec.source, config)
        if run_path is not None
        else RunDir.create(spec.output, spec.name, spec.source, config)
    )
    if progress:
        _say(f"run directory {run.path}")
    try:
        return run, execute(spec, run, progress)
    finally:
        run.unlock()


def resume(
    path, progress: bool = True, overrides: dict | None = None
) -> tuple[RunDir, dict]:
    """Continue an interrupted run: finished sweep tasks are not redone, training goes
    on from its last checkpoint."""
    from bigrate.engines import check_reachable

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
        check_data(spec)
        check_reachable(spec.engine, spec.address or None, spec.timeout)
        ck = checkpoint_round(run)
        run.event("resumed", from_round=ck, tasks_done=len(run.results()))
        if progress and ck is not None:
            _say(f"training continues from the checkpoint after round {ck}")
        return run, execute(spec, run, progress)
    finally:
        run.unlock()
