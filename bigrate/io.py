"""Saving and loading models as plain data: a directory with ``model.json`` (class,
parameters, fitted scalars, history) and ``arrays.npz`` (fitted arrays), written to a
temporary directory and renamed into place. Never pickle."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

FORMAT = "bigrate-model"
VERSION = 1


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def save_model(
    estimator, path: str | os.PathLike, *, arrays: dict, fitted: dict
) -> Path:
    """Write ``estimator`` (its get_params, ``fitted`` scalars and ``arrays``)."""
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        params = {k: v for k, v in estimator.get_params(deep=False).items()}
        meta = {
            "format": FORMAT,
            "format_version": VERSION,
            "class": f"{type(estimator).__module__}.{type(estimator).__qualname__}",
            "params": _jsonable(params),
            "fitted": _jsonable(fitted),
        }
        np.savez(tmp / "arrays.npz", **arrays)
        (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
        old = None
        if path.exists():
            if not (path / "model.json").exists():
                raise FileExistsError(
                    f"{path}: exists and is not a bigrate model directory"
                )
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.rename(path, old)
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_model(path: str | os.PathLike):
    """Rebuild an estimator saved by :func:`save_model`."""
    path = Path(path)
    mfile = path / "model.json"
    if not mfile.exists():
        raise FileNotFoundError(
            f"{path}: no model.json here; not a saved bigrate model"
        )
    meta = json.loads(mfile.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{mfile}: format {meta.get('format')!r} is not {FORMAT!r}")
    modname, _, clsname = meta["class"].rpartition(".")
    if not modname.startswith("bigrate."):
        raise ValueError(f"{mfile}: class {meta['class']!r} is not a bigrate estimator")
    cls = getattr(importlib.import_module(modname), clsname)
    est = cls(**meta["params"])
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    est._restore(arrays, meta["fitted"])
    return est
