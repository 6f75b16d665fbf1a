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
        out.append({"estimator": name, "seconds": r["seconds"], "error": r["error"]})
    return out
