"""The quantile path of all of a9a and a fixed set of BPSP partitions, hashed: the
kinks, the multipliers recorded at each kink, the set changes and checkpoint states of
the path, and the cells (vertices, offsets, error counts) of every BPSP partition. A
change of the code that is meant to be a rewrite (the same maths, named parts) keeps
them bit for bit.

The hashes in ``tests/golden/paths.json`` were recorded before the kernels were split
into named parts. LAPACK and BLAS (least squares, eigendecompositions) pick their
kernels by CPU and library, so the bits are compared where the machine's fingerprint
(the libraries' versions and the BLAS's architecture) is the recorded one; elsewhere
the counts must still be equal and the values equal to 1e-9. ``BIGRATE_WRITE_GOLDEN=1``
records them anew (only after a change that is meant to change them, saying why)."""

import hashlib
import json
import os

import numpy as np
import pytest

from tests.conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "paths.json"


def fingerprint() -> dict:
    import numba
    import scipy
    from threadpoolctl import threadpool_info

    blas = sorted(
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    )
    return {"numpy": np.__version__, "scipy": scipy.__version__,
            "numba": numba.__version__, "blas": blas}  # fmt: skip


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def summary(*arrays) -> list:
    """Sizes and sums, for machines whose BLAS differs from the recording one."""
    return [[int(a.size), float(np.sum(a, dtype=np.float64))] for a in arrays]


def check(key: str, arrays: tuple) -> None:
    got = {"sha256": digest(*arrays), "summary": summary(*arrays)}
    data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("BIGRATE_WRITE_GOLDEN") == "1":
        data.setdefault("fingerprint", fingerprint())
        data[key] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return
    assert key in data, (
        f"{GOLDEN} has no {key!r}: record it with BIGRATE_WRITE_GOLDEN=1"
    )
    want = data[key]
    if data["fingerprint"] == fingerprint():
        assert got["sha256"] == want["sha256"], f"{key}: not the recorded bits"
    else:
        for (n, s), (wn, ws) in zip(got["summary"], want["summary"], strict=True):
            assert n == wn and s == pytest.approx(ws, rel=1e-9, abs=1e-9), key


def test_the_whole_a9a_quantile_path_is_the_recorded_one(shared_data):
    from sklearn.datasets import load_svmlight_file

    from bigrate import QuantilePathSVC

    X, y = load_svmlight_file(str(shared_data / "a9a" / "a9a.bz2"), n_features=123)
    m = QuantilePathSVC(alpha=1e-3).fit(X, y)
    assert m.n_kinks_ > 90_000
    check("quantile_a9a", (m.kinks_, m._kink_bptr, m._bstore, m._kink_cptr,
                           m._cidx, m._cto, m._ck_kink, m._ck_cpos, m._ck_state))  # fmt: skip
    taus = np.linspace(0.0, 1.0, 11)
    check("quantile_a9a_coef", tuple(np.r_[m.coef_at(t)[0].ravel(), m.coef_at(t)[1]]
                                      for t in taus))  # fmt: skip


def test_a_fixed_set_of_bpsp_partitions_is_the_recorded_one():
    from sklearn.model_selection import StratifiedKFold

    from bigrate import BPSPSearchCV

    rng = np.random.default_rng(7)
    X = rng.standard_normal((50, 3))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] + 0.7 * rng.standard_normal(50) > 0, 1.0, -1.0)
    folds = list(StratifiedKFold(3, shuffle=True, random_state=2).split(X, y))
    for method in ("neighbours", "theorem2"):
        s = BPSPSearchCV(gamma=[0.5, 2.0], cv=folds, cost_fn=2.0, engine="local",
                         lambda_min=0.05, progress=False, method=method).fit(X, y)  # fmt: skip
        arrays = []
        for gamma in sorted(s.cells_):
            for sp in sorted(s.cells_[gamma]):
                for fold in s.cells_[gamma][sp]:
                    arrays += [fold[k] for k in ("vert", "off", "fn", "fp")]
        check(f"bpsp_{method}", tuple(arrays))
