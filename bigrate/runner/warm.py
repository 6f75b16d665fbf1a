"""``bigrate warm``: compile every kernel a fit uses into numba's on-disk cache, so
that the first fit of each estimator in a new process (a fresh container, a new cluster
node, a Ray worker) loads compiled code instead of compiling it.

Run it where the cache will be read: in a container image's build (``RUN bigrate
warm``), or on each node with ``NUMBA_CACHE_DIR`` pointing at a directory the workers
share. The cache is keyed by the source files and the CPU, so a node of another CPU
model compiles again (and caches that too).
"""

from __future__ import annotations

import os

#: what keeps each warm-up fit short and on the machine it runs on
_OVERRIDES = {"engine": "local", "progress": False}
_ROWS = {"BPSPSearchCV": 40}  # its cost grows fast with the rows; 40 compile it all


def cache_dir() -> str:
    """Where numba writes compiled kernels here: ``NUMBA_CACHE_DIR``, or the
    ``__pycache__`` folders beside bigrate's modules."""
    from numba.core.config import CACHE_DIR

    import bigrate

    return CACHE_DIR or os.path.dirname(bigrate.__file__) + "/**/__pycache__"


def warm(names=None, n_features: int = 20) -> list[dict]:
    """Fit each named estimator (default: every one jobs can run) once on a small
    random problem, in this process; returns per estimator its ``seconds`` and the
    ``error`` if the fit failed."""
    from bigrate.model_selection.sweep import warm_task
    from bigrate.runner.registry import ESTIMATORS, entry

    names = list(names or [n for n, e in ESTIMATORS.items() if e.fit != "sweep"])
    out = []
    for name in names:
        e = entry(name)
        if e.fit == "sweep":
            raise ValueError(
                f"{name} fits another estimator: warm that one (e.g. NeymanPearsonSVC)"
            )
        cls = e.load()
        valid = cls().get_params()
        params = {k: v for k, v in _OVERRIDES.items() if k in valid}
        r = warm_task(cls, params, n_features, rows=_ROWS.get(name, 400),
                      dense=e.data == "dense")  # fmt: skip
        if r["error"] is None and hasattr(cls, "start_stream"):
            s = _warm_streaming(cls, params)
            r = {"seconds": r["seconds"] + s["seconds"], "error": s["error"]}
        out.append({"estimator": name, "seconds": r["seconds"], "error": r["error"]})
    return out


def _warm_streaming(cls, params: dict) -> dict:
    """An SGD learner's fit out of core too, on 512 random rows written as shards to a
    temporary directory: the shard reader's kernels and the step kernels that read
    rows where they lie in the decoded row groups (a cluster worker's rounds) compiled
    as well as the in-memory ones."""
    import shutil
    import tempfile
    import time
    import warnings

    import numpy as np
    import scipy.sparse as sp

    from bigrate.data.format import RowBlock
    from bigrate.data.writer import DatasetWriter

    t = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="bigrate-warm-")
    try:
        X = sp.random(512, 20, density=0.3, format="csr", dtype=np.float32,
                      random_state=0)  # fmt: skip
        y = np.where(np.arange(512) % 2 == 0, 1, -1).astype(np.int8)
        with DatasetWriter(tmp + "/ds", splits=("train",), row_group_size=128) as w:
            w.append("train", RowBlock(X=X.tocsr(), y=y, row_id=np.arange(512)))
            w.commit(n_features=20, label_mapping={}, preprocessing={}, sources=[])
        with warnings.catch_warnings():  # a short fit on random rows may not converge
            warnings.simplefilter("ignore")
            cls(**params, epochs=1).fit(tmp + "/ds")
        error = None
    except Exception as e:  # noqa: BLE001 - reported, as warm_task's
        error = f"{type(e).__name__}: {e}"[:500]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"seconds": time.perf_counter() - t, "error": error}
