"""Recorded hashes of long computations, for rewrites that must keep them bit for bit:
the quantile path of all of a9a and a fixed set of BPSP partitions, hashed: the
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
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).with_name("paths.json")


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
