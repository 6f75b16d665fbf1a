"""``bigrate train``: a train job written from the command line and run by the job
runner, like any job file (the same validation, run directory, events, checkpoints,
results table; ``bigrate resume``, ``status``, ``report`` and ``predict`` work on it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bigrate.rundir import RunDir


def train_spec(dataset, estimator: str, params: dict, *, engine: str = "local",
               address: str | None = None, workers: int | None = None,
               memory_limit: str | None = None, output: str = "runs"):  # fmt: skip
    """The train job these arguments describe, validated as a job file is (problems
    reported with their key paths, e.g. ``model.params.rho``)."""
    from bigrate.runner.spec import validate

    raw = {
        "job": {"kind": "train", "name": "train"},
        "data": {"path": str(dataset)},
        "model": {"estimator": estimator, "params": dict(params)},
        "engine": {"name": engine, "address": address or ""},
        "output": {"dir": str(output)},
    }
    if workers is not None:
        raw["engine"]["workers"] = int(workers)
    if memory_limit is not None:
        raw["engine"]["memory_limit"] = memory_limit
    spec = validate(raw, "bigrate train", {}, what="its arguments")
    spec.source = None  # no job file: config.json holds the job
    return spec


def train(dataset, estimator: str, params: dict, *, engine: str = "local",
          address: str | None = None, workers: int | None = None,
          memory_limit: str | None = None, out=None, overwrite: bool = False,
          progress: bool = True):  # fmt: skip
    """Fit ``estimator`` on the train split of ``dataset``, evaluate it on every split
    and save the run: into ``out`` (a new directory; an earlier run there is replaced
    only with ``overwrite``), else ``runs/train-<time>``. Returns ``(run, metrics)``."""
    from bigrate.runner.job import start

    spec = train_spec(dataset, estimator, params, engine=engine, address=address,
                      workers=workers, memory_limit=memory_limit)  # fmt: skip
    if out is not None:
        out = Path(out)
        if out.exists():
            ours = (out / "config.json").is_file() or (out / "model").is_dir()
            if not overwrite or not ours:
                raise FileExistsError(
                    f"{out}: already exists"
                    + (
                        "; pass --overwrite to replace the run in it"
                        if ours
                        else " and is not a bigrate run directory; choose another --out"
                    )
                )
            if (out / "config.json").is_file():
                RunDir.open(out).lock()  # refused while a live process runs it
            shutil.rmtree(out)
    return start(spec, progress, run_path=out)
