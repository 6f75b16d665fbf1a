"""Job files: TOML, read with the standard library, validated before anything runs.

A job file is data: nothing in it is evaluated. Validation collects every problem, each
with its key path (``model.params.rho: must be in (0, 1), got 1.5``), and raises them
together as a :class:`JobSpecError`.

    [job]
    kind = "train"                 # train | sweep | crossfit | evaluate
    name = "a9a-np"
    [data]
    path = "data/a9a"              # shard directory or fsspec URL (relative paths: to the
                                   # working directory, like the command line's)
    [model]
    estimator = "NeymanPearsonSGD"
    params = { rho = 0.05, epochs = 10 }
    constraints = ["recall() >= 0.6"]   # RateConstrainedClassifier only: constraints
    objective = "error_rate()"          # and objective as text (bigrate.constrained.parse)
    [path]                         # QuantilePathSVC only: choose tau on a split
    rho = 0.05                     # for this false-alarm target,
    select = "J_val"               # by J_val, or "pfa" (least Pnd with Pfa <= rho)
    split = "val"
    [engine]
    name = "dask"                  # local | dask | ray
    address = ""                   # empty: embedded cluster on 127.0.0.1
    workers = 2                    # embedded cluster size; with an address, the
                                   # workers to wait for before starting (default 1)
    timeout = 30                   # seconds to reach the cluster at address
    memory_limit = "4GiB"          # embedded Dask cluster: each worker's limit (its
                                   # row-group cache is a quarter of it; default:
                                   # the machine's memory shared among the workers)
    worker_wait = 120              # seconds a cluster may be without a worker (at the
                                   # start, or after losing them all) before the job
                                   # gives up
    rounds_per_epoch = "auto"      # SGD learners: how often an epoch the workers
                                   # average their models (at least; "auto": 4, fewer
                                   # where the rounds' fixed cost would dominate)
    merge = "auto"                 # SGD learners: where the workers' models are
                                   # combined: "auto"/"direct" (worker to worker over
                                   # TCP), "workers" (engine tasks) or "driver"; the
                                   # same bits
    [sweep]                        # kind = "sweep" only
    grid = { alpha = [1e-4, 1e-3], eta = [2.0, 5.0] }
    cv = 3                         # folds of the train split, or "val" (the val split)
    select = "J_val"               # J_val (NP) | accepted (q-value) | pnd | error_rate |
                                   # cost | auc (default: the estimator's own)
    cost_fn = 1.0                  # the "cost" metric: (cost_fn FN + cost_fp FP) / n
    cost_fp = 1.0
    batch_seconds = 1              # short fits batched into engine tasks of ~that
                                   # many seconds (guided; 0 turns batching off)
    warm_start = false             # true: points differing only in C run as one task
                                   # per fold, each fit warm-started from the previous
    [crossfit]                     # kind = "crossfit" only: every row scored by the
                                   # model of the fold that did not hold it
    folds = 3                      # folds of the pooled rows (grouped folds where the
                                   # dataset has a group column, e.g. spectra)
    splits = ["train", "val", "test"]  # the splits pooled (default: all of them)
    scale = "negatives"            # each fold's scores divided by the spread of its
                                   # model's scores on its training negatives, or "none"
    seed = 0                       # the folds' shuffle
    [evaluate]                     # kind = "evaluate" only
    model = "runs/a9a-np-.../model"
    splits = ["test"]
    [output]
    dir = "runs"
    checkpoint_rounds = 20         # training: checkpoint every 20 rounds ...
    checkpoint_minutes = 5         # ... or every 5 minutes, whichever comes first
"""

from __future__ import annotations

import copy
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bigrate.engines import ENGINES
from bigrate.metrics import SELECT
from bigrate.runner.registry import ESTIMATORS, estimator_class

KINDS = ("train", "sweep", "crossfit", "evaluate")
#: where the SGD learners' rounds combine the workers' models (fit_distributed's merge)
MERGES = ("auto", "direct", "workers", "driver")

_SCHEMA = {
    "job": {"kind": str, "name": str},
    "data": {"path": str, "storage_options": dict},
    "model": {"estimator": str, "params": dict, "constraints": list, "objective": str},
    "path": {"rho": (int, float), "select": str, "split": str},
    "engine": {
        "name": str,
        "address": str,
        "workers": int,
        "timeout": (int, float),
        "worker_wait": (int, float),
        "memory_limit": (int, str),
        "rounds_per_epoch": (int, str),
        "merge": str,
    },
    "sweep": {
        "grid": dict,
        "cv": (int, str),
        "select": str,
        "seed": int,
        "batch_seconds": (int, float),
        "warm_start": bool,
        "cost_fn": (int, float),
        "cost_fp": (int, float),
    },
    "crossfit": {"folds": int, "splits": list, "scale": str, "seed": int},
    "evaluate": {"model": str, "splits": list},
    "output": {
        "dir": str,
        "checkpoint_rounds": int,
        "checkpoint_minutes": (int, float),
    },
}
_REQUIRED = {"job": ["kind", "name"], "data": ["path"]}


class JobSpecError(ValueError):
    """One or more problems in a job file; ``problems`` lists them with key paths."""

    def __init__(self, path, problems: list[str], what: str = "the job file"):
        self.path = str(path)
        self.problems = problems
        body = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} problem(s) in {what}:\n{body}")


# a sweep's default batches of short fits, seconds of work an engine task (0: off)
BATCH_SECONDS = 1.0


@dataclass
class JobSpec:
    """A validated job (see the module docstring for the file format)."""

    kind: str
    name: str
    data: str
    storage_options: dict = field(default_factory=dict)  # credentials as "${NAME}"
    estimator: str | None = None
    params: dict = field(default_factory=dict)
    constraints: list = field(default_factory=list)  # as text
    objective: str | None = None
    path: dict | None = None  # QuantilePathSVC: {"rho", "select", "split"}
    engine: str = "local"
    address: str = ""
    workers: int | None = None
    timeout: float = 30.0
    worker_wait: float = 120.0
    memory_limit: int | str | None = None  # embedded Dask workers' limit
    rounds_per_epoch: int | str = "auto"
    merge: str = "auto"
    grid: dict = field(default_factory=dict)
    cv: int | str = "val"
    select: str = "J_val"
    seed: int = 0
    batch_seconds: float = BATCH_SECONDS
    warm_start: bool = False
    cost_fn: float = 1.0
    cost_fp: float = 1.0
    folds: int = 3  # crossfit
    crossfit_splits: list | None = None  # crossfit: None = every split
    scale: str = "negatives"  # crossfit
    model: str | None = None
    splits: list = field(default_factory=lambda: ["test"])
    output: str = "runs"
    checkpoint_rounds: int = 20
    checkpoint_minutes: float = 5.0
    source: str | None = None  # the job file's path

    def dataset(self):
        """The job's :class:`~bigrate.data.ShardedDataset` (opened now)."""
        from bigrate.data.reader import ShardedDataset

        return ShardedDataset(self.data, storage_options=self.storage_options)

    def to_json(self) -> dict:
        d = copy.deepcopy(self.__dict__)
        return d

    @classmethod
    def from_json(cls, d: dict) -> JobSpec:
        return cls(**d)

    def cost(self) -> tuple[float, float]:
        return (float(self.cost_fn), float(self.cost_fp))

    def points(self) -> list[dict]:
        """The sweep's grid points in a fixed order (row-major over sorted keys)."""
        import itertools

        keys = sorted(self.grid)
        return [
            dict(zip(keys, vals, strict=True))
            for vals in itertools.product(*(self.grid[k] for k in keys))
        ]


def _type_name(t) -> str:
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return {
        str: "a string",
        int: "an integer",
        dict: "a table",
        list: "an array",
        float: "a number",
        bool: "true or false",
    }.get(t, t.__name__)


def _check_params(
    est_name: str,
    params: dict,
    where: str,
    problems: list[str],
    allow_lists: bool = False,
) -> None:
    """Each parameter exists and passes the estimator's own constraints."""
    from sklearn.utils._param_validation import (
        InvalidParameterError,
        validate_parameter_constraints,
    )

    cls = estimator_class(est_name)
    valid = cls().get_params()
    constraints = getattr(cls, "_parameter_constraints", {})
    for k, v in params.items():
        if k not in valid:
            problems.append(
                f"{where}.{k}: {est_name} has no parameter {k!r} "
                f"(valid: {', '.join(sorted(valid))})"
            )
            continue
        values = v if (allow_lists and isinstance(v, list)) else [v]
        if allow_lists and not isinstance(v, list):
            problems.append(f"{where}.{k}: must be an array of values, got {v!r}")
            continue
        if allow_lists and not values:
            problems.append(f"{where}.{k}: must not be empty")
        for val in values:
            if k in constraints:
                try:
                    validate_parameter_constraints(
                        {k: constraints[k]}, {k: val}, caller_name=est_name
                    )
                except InvalidParameterError as e:
                    msg = str(e).split(" parameter of ")[-1]
                    problems.append(f"{where}.{k}: {_short(msg, k, val)}")


#: estimator parameters a job sets itself (its engine, its output)
JOB_OWNED = {"engine", "address", "n_workers", "run_dir", "progress"}
#: selection metrics that need a rate target
NEEDS = {"J_val": "rho", "accepted": "q"}


def load_baseline(path: str, base: Path | None = None):
    """A saved model named in a job (``churn(baseline=...)``): a model directory or a
    run's (``runs/NAME-LATEST`` for the newest complete run of NAME), relative paths
    from ``base`` (the working directory)."""
    from bigrate.io import load_model
    from bigrate.rundir import resolve_latest

    p = Path(path)
    p = p if p.is_absolute() else (base or Path.cwd()) / p
    if "-LATEST" in str(p):
        p = resolve_latest(p)
    if (p / "model" / "model.json").is_file():
        p = p / "model"
    if not (p / "model.json").is_file():
        raise ValueError(f"no saved model at {p}")
    return load_model(p)


def _check_constraints(constraints, objective, base, problems) -> None:
    from bigrate.constrained.parse import parse_constraint, parse_expression

    def load(path):
        return load_baseline(path, base)

    for i, text in enumerate(constraints):
        where = f"model.constraints[{i}]"
        try:
            parsed = parse_constraint(text, load)
        except (ValueError, FileNotFoundError) as e:
            problems.append(f"{where}: {e}")
            continue
        others = {t.subset.dataset for t in parsed.constraint.expr.terms} - {"train"}
        if others:
            problems.append(
                f"{where}: a job's constraints hold on its own data (dataset='train'); "
                f"got dataset {sorted(others)}"
            )
    if objective is not None:
        try:
            parse_expression(objective, load)
        except (ValueError, FileNotFoundError) as e:
            problems.append(f"model.objective: {e}")


def _short(msg: str, k: str, val) -> str:
    """sklearn's message, shortened: 'must be a float in the range (0.0, 1.0), got 1.5'."""
    if " must be " in msg:
        body = msg.split(" must be ", 1)[1]
        body = body.split(". Got ")[0]
        return f"must be {body}, got {val!r}"
    return msg


def load_job(path: str | os.PathLike, overrides: dict | None = None) -> JobSpec:
    """Read and validate a job file; ``overrides`` (engine, address, output) come from the
    command line. Raises :class:`JobSpecError` listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: job file not found")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise JobSpecError(path, [f"not valid TOML: {e}"]) from None
    return validate(raw, path, overrides or {})


def validate(raw: dict, path, overrides: dict, what: str = "the job file") -> JobSpec:
    """The job ``raw`` (a job file's tables) checked, every problem collected with its
    key path (``what`` says where they come from in the message)."""
    problems: list[str] = []
    for sect, val in raw.items():
        if sect not in _SCHEMA:
            problems.append(f"{sect}: unknown section (expected {', '.join(_SCHEMA)})")
            continue
        if not isinstance(val, dict):
            problems.append(f"{sect}: must be a table ([{sect}])")
            continue
        for k, v in val.items():
            if k not in _SCHEMA[sect]:
                problems.append(
                    f"{sect}.{k}: unknown key (expected one of "
                    f"{', '.join(_SCHEMA[sect])})"
                )
                continue
            t = _SCHEMA[sect][k]
            if (t is bool) != isinstance(v, bool) or not isinstance(v, t):
                problems.append(f"{sect}.{k}: must be {_type_name(t)}, got {v!r}")
    for sect, keys in _REQUIRED.items():
        for k in keys:
            if k not in raw.get(sect, {}) if isinstance(raw.get(sect), dict) else True:
                problems.append(f"{sect}.{k}: required")

    def table(name):  # a section, keeping only the keys of the right type
        val = raw.get(name, {})
        if not isinstance(val, dict):
            return {}
        return {
            k: v
            for k, v in val.items()
            if k in _SCHEMA.get(name, {})
            and (_SCHEMA[name][k] is bool) == isinstance(v, bool)
            and isinstance(v, _SCHEMA[name][k])
        }

    job, data, model = table("job"), table("data"), table("model")
    engine, sweep, evaluate, output, path_sel, crossfit = (
        table("engine"),
        table("sweep"),
        table("evaluate"),
        table("output"),
        table("path"),
        table("crossfit"),
    )
    base = Path.cwd()  # relative paths in a job file are relative to where it is run

    kind = job.get("kind")
    if kind is not None and kind not in KINDS:
        problems.append(f"job.kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    name = job.get("name", "job")
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        problems.append(
            f"job.name: must be a plain name (no '/', not starting with '.'), "
            f"got {name!r}"
        )

    data_path = data.get("path", "")
    if data_path and "://" not in data_path:
        p = Path(data_path)
        data_path = str(p if p.is_absolute() else (base / p))
        if not (Path(data_path) / "manifest.json").is_file():
            problems.append(
                f"data.path: no dataset at {data_path} (no manifest.json; make "
                "one with `bigrate prep ...`)"
            )

    storage_options = dict(data.get("storage_options", {}))
    from bigrate.data.reader import check_storage_options

    problems += check_storage_options(storage_options, "data.storage_options")

    est = model.get("estimator")
    params = dict(model.get("params", {}))
    if est is not None and est not in ESTIMATORS:
        problems.append(
            f"model.estimator: unknown estimator {est!r} (known: "
            f"{', '.join(sorted(ESTIMATORS))})"
        )
        est = None
    elif est is not None and ESTIMATORS[est].fit == "sweep":
        problems.append(
            f"model.estimator: {est} is the Python form of a sweep job: write "
            'kind = "sweep" with the estimator it searches (e.g. "NeymanPearsonSVC") '
            "and [sweep] grid"
        )
        est = None
    elif est is not None:
        if kind in KINDS and kind != "evaluate" and kind not in ESTIMATORS[est].kinds:
            problems.append(
                f"job.kind: {est} runs as "
                f"{' or '.join(k for k in ESTIMATORS[est].kinds if k != 'evaluate')} "
                f"jobs, not {kind!r}"
            )
        _check_params(est, params, "model.params", problems)
        for k in sorted(set(params) & JOB_OWNED):
            problems.append(
                f"model.params.{k}: set by the job ([engine], [output]), not here"
            )
    elif kind in ("train", "sweep", "crossfit"):
        problems.append(f"model.estimator: required for a {kind} job")
    constraints = model.get("constraints", [])
    objective = model.get("objective")
    if (constraints or objective is not None) and est != "RateConstrainedClassifier":
        problems.append(
            "model.constraints: only RateConstrainedClassifier takes constraints "
            "and an objective"
        )
    elif est == "RateConstrainedClassifier":
        _check_constraints(constraints, objective, base, problems)
    tau_choice = None
    if path_sel and est != "QuantilePathSVC":
        problems.append("path: only QuantilePathSVC takes a [path] table")
    elif path_sel:
        rho = float(path_sel.get("rho", 0.0))
        if not 0 < rho < 1:
            problems.append("path.rho: required, a false-alarm target in (0, 1)")
        by = path_sel.get("select", "J_val")
        if by not in ("J_val", "pfa"):
            problems.append(f'path.select: must be "J_val" or "pfa", got {by!r}')
        tau_choice = {"rho": rho, "select": by, "split": path_sel.get("split", "val")}

    eng = overrides.get("engine") or engine.get("name", "local")
    if eng not in ENGINES:
        problems.append(
            f"engine.name: must be one of {', '.join(ENGINES)}, got {eng!r}"
        )
    address = overrides.get("address") or engine.get("address", "")
    if address and eng == "local":
        problems.append(
            "engine.address: the local engine takes no address (use dask or ray)"
        )
    if address and eng == "dask" and not address.startswith(("tcp://", "tls://")):
        problems.append(
            f"engine.address: a Dask scheduler address looks like "
            f"tcp://host:8786, got {address!r}"
        )
    workers = engine.get("workers")
    if workers is not None and workers < 1:
        problems.append(f"engine.workers: must be >= 1, got {workers}")
    timeout = float(engine.get("timeout", 30.0))
    if not timeout > 0:
        problems.append(f"engine.timeout: must be > 0 seconds, got {timeout:g}")
    worker_wait = float(engine.get("worker_wait", 120.0))
    if not worker_wait > 0:
        problems.append(f"engine.worker_wait: must be > 0 seconds, got {worker_wait:g}")
    memory_limit = engine.get("memory_limit")
    if memory_limit is not None:
        if eng != "dask" or address:
            problems.append(
                "engine.memory_limit: sets the workers' limit of an embedded Dask "
                f"cluster only (engine {eng!r}"
                + (f", address {address!r})" if address else ")")
            )
        else:
            from dask.utils import parse_bytes

            try:
                ok = parse_bytes(memory_limit) > 0
            except (ValueError, TypeError):
                ok = False
            if not ok:
                problems.append(
                    f'engine.memory_limit: a size such as "4GiB" or a number of '
                    f"bytes, got {memory_limit!r}"
                )
    per_epoch = engine.get("rounds_per_epoch", "auto")
    if per_epoch != "auto" and not (isinstance(per_epoch, int) and per_epoch >= 1):
        problems.append(
            f'engine.rounds_per_epoch: must be "auto" or an integer >= 1, got '
            f"{per_epoch!r}"
        )
    merge = engine.get("merge", "auto")
    if merge not in MERGES:
        problems.append(
            f"engine.merge: one of {', '.join(repr(m) for m in MERGES)}, got {merge!r}"
        )
    ck_rounds = output.get("checkpoint_rounds", 20)
    if ck_rounds < 1:
        problems.append(f"output.checkpoint_rounds: must be >= 1, got {ck_rounds}")
    ck_minutes = float(output.get("checkpoint_minutes", 5.0))
    if not ck_minutes > 0:
        problems.append(f"output.checkpoint_minutes: must be > 0, got {ck_minutes:g}")

    grid = dict(sweep.get("grid", {}))
    cv = sweep.get("cv", "val")
    select = sweep.get("select")
    if kind == "sweep":
        if not grid:
            problems.append(
                "sweep.grid: required for a sweep job (a table of parameter "
                "name = [values])"
            )
        elif est in ESTIMATORS:
            _check_params(est, grid, "sweep.grid", problems, allow_lists=True)
            for k in grid:
                if k in params:
                    problems.append(
                        f"sweep.grid.{k}: also set in model.params; "
                        "give it in one place"
                    )
        if isinstance(cv, str) and cv != "val":
            problems.append(f'sweep.cv: must be a fold count >= 2 or "val", got {cv!r}')
        if isinstance(cv, int) and cv < 2:
            problems.append(f'sweep.cv: must be a fold count >= 2 or "val", got {cv}')
        if sweep.get("warm_start"):
            if cv == "val":
                problems.append(
                    'sweep.warm_start: needs k-fold cross-validation (cv = K), not "val"'
                )
        if not float(sweep.get("batch_seconds", BATCH_SECONDS)) >= 0:
            problems.append(
                f"sweep.batch_seconds: must be >= 0 (0 turns batching off), got "
                f"{sweep.get('batch_seconds')}"
            )
        if select is None and est in ESTIMATORS:
            select = ESTIMATORS[est].select
        if select is not None and select not in SELECT:
            problems.append(
                f"sweep.select: must be one of {', '.join(SELECT)}, got {select!r}"
            )
        elif est in ESTIMATORS and select in NEEDS:
            need = NEEDS[select]
            if ESTIMATORS[est].target != need:
                problems.append(
                    f"sweep.select: {select} needs a {need} target, which {est} does "
                    f"not have; use one of "
                    f"{', '.join(s for s in SELECT if s not in NEEDS)}"
                )
        for k in ("cost_fn", "cost_fp"):
            if k in sweep and not float(sweep[k]) > 0:
                problems.append(f"sweep.{k}: must be > 0, got {sweep[k]}")
    elif sweep:
        problems.append(
            f"sweep: only a sweep job takes a [sweep] table (job.kind is {kind!r})"
        )

    folds = crossfit.get("folds", 3)
    cf_splits = crossfit.get("splits")
    scale = crossfit.get("scale", "negatives")
    if kind == "crossfit":
        from bigrate.runner.crossfit import SCALES

        if folds < 2:
            problems.append(f"crossfit.folds: must be >= 2, got {folds}")
        if cf_splits is not None and (
            not cf_splits or not all(isinstance(x, str) for x in cf_splits)
        ):
            problems.append(
                f"crossfit.splits: must be a non-empty array of split names, got "
                f"{cf_splits!r}"
            )
        if scale not in SCALES:
            problems.append(
                f"crossfit.scale: one of {', '.join(map(repr, SCALES))}, got {scale!r}"
            )
        if path_sel:
            problems.append("path: a crossfit job takes no [path] table")
    elif crossfit:
        problems.append(
            f"crossfit: only a crossfit job takes a [crossfit] table (job.kind is "
            f"{kind!r})"
        )

    model_dir = evaluate.get("model")
    splits = evaluate.get("splits", ["test"])
    if kind == "evaluate":
        if not model_dir:
            problems.append(
                "evaluate.model: required for an evaluate job (a saved model directory)"
            )
        else:
            mp = Path(model_dir)
            model_dir = str(mp if mp.is_absolute() else base / mp)
            if "-LATEST" in model_dir:  # runs/NAME-LATEST/model: the newest complete
                from bigrate.rundir import resolve_latest

                try:
                    model_dir = str(resolve_latest(model_dir))
                except FileNotFoundError as e:
                    problems.append(f"evaluate.model: {e}")
                    model_dir = None
            if model_dir and not (Path(model_dir) / "model.json").is_file():
                problems.append(f"evaluate.model: no saved model at {model_dir}")
        if not all(isinstance(s, str) for s in splits):
            problems.append(
                f"evaluate.splits: must be an array of split names, got {splits!r}"
            )

    out = overrides.get("output") or output.get("dir", "runs")
    op = Path(out)
    out = str(op if op.is_absolute() else base / op)
    if problems:
        raise JobSpecError(path, problems, what)
    return JobSpec(
        kind=kind,
        name=name,
        data=data_path,
        storage_options=storage_options,
        estimator=est,
        params=params,
        constraints=list(constraints),
        objective=objective,
        path=tau_choice,
        engine=eng,
        address=address,
        workers=workers,
        timeout=timeout,
        worker_wait=worker_wait,
        memory_limit=memory_limit,
        rounds_per_epoch=per_epoch,
        merge=merge,
        grid=grid,
        cv=cv,
        select=select or "J_val",
        seed=crossfit.get("seed", 0) if kind == "crossfit" else sweep.get("seed", 0),
        batch_seconds=float(sweep.get("batch_seconds", BATCH_SECONDS)),
        warm_start=bool(sweep.get("warm_start", False)),
        cost_fn=float(sweep.get("cost_fn", 1.0)),
        cost_fp=float(sweep.get("cost_fp", 1.0)),
        folds=folds,
        crossfit_splits=list(cf_splits) if cf_splits else None,
        scale=scale,
        model=model_dir,
        splits=list(splits),
        output=out,
        checkpoint_rounds=ck_rounds,
        checkpoint_minutes=ck_minutes,
        source=str(Path(path).resolve()),
    )
