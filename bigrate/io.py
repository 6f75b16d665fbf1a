"""One persistence protocol for every estimator: plain data, never pickle.

A saved model is a directory::

    model.json    format, class, constructor parameters and fitted attributes as JSON
    arrays.npz    every NumPy array they hold (``np.load(..., allow_pickle=False)``)

written to a temporary directory and renamed into place (:func:`bigrate.files.replace_dir`),
so a crash leaves the previous model or the new one, never half of one.

What is saved is what scikit-learn calls the estimator's state: ``get_params(deep=False)``
and every public fitted attribute (a name ending in ``_``), plus the private attributes a
class lists in ``_persist_private`` (state that methods other than ``predict`` need, such
as the quantile path's kinks). Values are encoded recursively:

- ``None``, booleans, numbers and strings as themselves; lists and tuples as lists;
  dicts with string keys as objects, other dicts as ``{"__items__": [[key, value]...]}``;
- NumPy arrays (numbers or strings) as ``{"__array__": name}`` entries of ``arrays.npz``,
  SciPy sparse matrices as their CSR arrays;
- an estimator (a parameter such as ``NPSearchCV.estimator``, a fitted attribute such as
  ``best_estimator_``, a churn baseline) as a nested record of the same form, for classes
  of bigrate and scikit-learn only;
- bigrate's frozen dataclasses (the vocabulary of :mod:`bigrate.constrained`) field by
  field.

Anything else is refused when saving, with the attribute's name. Loading imports only
classes from the ``bigrate`` and ``sklearn`` packages named in the file.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from bigrate.files import current_umask, replace_dir

FORMAT = "bigrate-model"
VERSION = 2
_TRUSTED = ("bigrate.", "sklearn.")

__all__ = ["load_model", "save_model"]


def _qualname(obj) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _import(qualname: str, where: str):
    mod, _, name = qualname.rpartition(".")
    if not mod.startswith(_TRUSTED):
        raise ValueError(
            f"{where}: class {qualname!r} is not from bigrate or scikit-learn; "
            "refusing to import it"
        )
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            f"{where}: class {qualname!r} cannot be imported: {e}"
        ) from None


def fitted_state(est) -> dict:
    """The public fitted attributes of ``est`` (names ending in ``_``) and the private
    ones its class lists in ``_persist_private``."""
    out = {
        k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")
    }
    for k in getattr(type(est), "_persist_private", ()):
        if hasattr(est, k):
            out[k] = getattr(est, k)
    return out


class _Encoder:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, a: np.ndarray, where: str) -> dict:
        if a.dtype == object:
            if all(isinstance(v, str) for v in a.ravel()):
                a = a.astype(str)
            else:
                raise TypeError(
                    f"{where}: an object array cannot be saved as plain data"
                )
        key = f"a{len(self.arrays)}"
        self.arrays[key] = a
        return {"__array__": key}

    def __call__(self, x, where: str):
        from sklearn.base import BaseEstimator

        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, (int, float)):
            return x
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray):
            return self.array(x, where)
        if sp.issparse(x):
            x = sp.csr_matrix(x)
            return {
                "__sparse__": "csr",
                "shape": list(x.shape),
                "data": self.array(x.data, where),
                "indices": self.array(x.indices, where),
                "indptr": self.array(x.indptr, where),
            }
        if isinstance(x, (list, tuple)):
            return [self(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: self(v, f"{where}.{k}") for k, v in x.items()}
            return {
                "__items__": [
                    [self(k, f"{where} key"), self(v, f"{where}[{k!r}]")]
                    for k, v in x.items()
                ]
            }
        if isinstance(x, BaseEstimator) and _qualname(x).startswith(_TRUSTED):
            return {"__estimator__": self.estimator(x, where)}
        if dataclasses.is_dataclass(x) and _qualname(x).startswith("bigrate."):
            return {
                "__dataclass__": _qualname(x),
                "fields": {
                    f.name: self(getattr(x, f.name), f"{where}.{f.name}")
                    for f in dataclasses.fields(x)
                },
            }
        raise TypeError(
            f"{where}: a {type(x).__name__} cannot be saved as plain data (numbers, "
            "strings, arrays, lists, dicts and bigrate / scikit-learn estimators can)"
        )

    def estimator(self, est, where: str) -> dict:
        return {
            "class": _qualname(est),
            "params": {
                k: self(v, f"{where}.{k}")
                for k, v in est.get_params(deep=False).items()
            },
            "fitted": {
                k: self(v, f"{where}.{k}") for k, v in fitted_state(est).items()
            },
        }


class _Decoder:
    def __init__(self, arrays: dict, where: str):
        self.arrays = arrays
        self.where = where

    def __call__(self, x):
        if isinstance(x, list):
            return [self(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__array__" in x:
            key = x["__array__"]
            if key not in self.arrays:
                raise ValueError(f"{self.where}: array {key!r} missing from arrays.npz")
            return self.arrays[key]
        if "__sparse__" in x:
            return sp.csr_matrix(
                (self(x["data"]), self(x["indices"]), self(x["indptr"])),
                shape=tuple(x["shape"]),
            )
        if "__items__" in x:
            return {_hashable(self(k)): self(v) for k, v in x["__items__"]}
        if "__estimator__" in x:
            return self.estimator(x["__estimator__"])
        if "__dataclass__" in x:
            cls = _import(x["__dataclass__"], self.where)
            return cls(**{k: self(v) for k, v in x["fields"].items()})
        return {k: self(v) for k, v in x.items()}

    def estimator(self, rec: dict):
        cls = _import(rec["class"], self.where)
        est = cls(**{k: self(v) for k, v in rec["params"].items()})
        for k, v in rec["fitted"].items():
            setattr(est, k, self(v))
        restored = getattr(est, "_after_load", None)
        if restored is not None:
            restored()
        return est


def _hashable(k):
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def save_model(estimator, path: str | os.PathLike, inputs: dict | None = None) -> Path:
    """Save a fitted (or unfitted) estimator as plain data in directory ``path``,
    replacing a model saved there before; refuses a directory that is not a model.
    ``inputs`` (plain JSON data) describes the features the model expects, e.g. the
    standardisation of the dataset it was trained on; :func:`model_inputs` reads it."""
    path = Path(path).absolute()
    if path.exists() and not (path / "model.json").exists():
        raise FileExistsError(f"{path}: exists and is not a saved bigrate model")
    enc = _Encoder()
    meta = {
        "format": FORMAT,
        "format_version": VERSION,
        **enc.estimator(estimator, type(estimator).__name__),
    }
    if inputs is not None:
        meta["inputs"] = inputs
    text = json.dumps(meta, indent=1, allow_nan=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())
        with open(tmp / "arrays.npz", "wb") as f:
            np.savez(f, **enc.arrays)
        (tmp / "model.json").write_text(text, encoding="utf-8")
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def model_inputs(path: str | os.PathLike) -> dict:
    """The ``inputs`` record saved with the model in ``path`` ({} if none)."""
    return _read_meta(Path(path)).get("inputs") or {}


def load_model(path: str | os.PathLike):
    """Rebuild an estimator saved by :func:`save_model` (or ``est.save``)."""
    path = Path(path)
    meta = _read_meta(path)
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return _Decoder(arrays, str(path / "model.json")).estimator(meta)


def _read_meta(path: Path) -> dict:
    mfile = path / "model.json"
    if not mfile.exists():
        raise FileNotFoundError(
            f"{path}: no model.json here; not a saved bigrate model"
        )
    try:
        meta = json.loads(mfile.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{mfile}: not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{mfile}: format {meta.get('format')!r} is not {FORMAT!r}")
    if meta.get("format_version") != VERSION:
        raise ValueError(
            f"{mfile}: format_version {meta.get('format_version')!r}; this bigrate "
            f"reads version {VERSION} (save the model again with this version)"
        )
    return meta
