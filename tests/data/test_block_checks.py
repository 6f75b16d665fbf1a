"""The vectorised checks a decoded block passes before any kernel indexes with it."""

import numpy as np
import pytest

from bigrate.data import _kernels as K


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_finite_agrees_with_isfinite_on_every_kind_of_float(dtype):
    info = np.finfo(dtype)
    extremes = [
        info.max,
        -info.max,
        info.tiny,
        info.smallest_subnormal,
        -0.0,
        0.0,
        -1.0,
    ]
    bits = np.dtype(np.int32 if dtype == np.float32 else np.int64)
    quiet_neg_nan = np.array([np.nan], dtype).view(bits) | bits.type(np.iinfo(bits).min)
    payload_nan = np.array([np.inf], dtype).view(bits) | bits.type(1)
    odd = [
        np.nan,
        np.inf,
        -np.inf,
        quiet_neg_nan.view(dtype)[0],
        payload_nan.view(dtype)[0],
    ]
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 33, 1000):
        base = np.concatenate([rng.standard_normal(n), extremes]).astype(dtype)
        assert K.values_finite(base)
        for bad in odd:
            for at in (0, len(base) // 2, len(base) - 1):
                v = base.copy()
                v[at] = bad
                assert not np.isfinite(v).all()
                assert not K.values_finite(v), (n, bad, at)


def test_check_rows_names_the_first_offending_entry():
    indptr = np.array([0, 3, 3, 6], np.int32)
    indices = np.array([0, 4, 9, 1, 2, 3], np.int32)
    values = np.ones(6, np.float32)
    assert K.check_rows(indptr, indices, values, 10) == (K.ROWS_OK, -1)
    v = values.copy()
    v[4] = -np.inf
    assert K.check_rows(indptr, indices, v, 10) == (K.VALUE_NOT_FINITE, 4)
    assert K.check_rows(indptr, indices, values, 9) == (K.INDEX_OUT_OF_RANGE, 2)
    i = indices.copy()
    i[4] = 1
    assert K.check_rows(indptr, i, values, 10) == (K.INDEX_NOT_INCREASING, 4)
    # a step down at a row start is allowed, anywhere else it is not
    assert K.indices_ok(indptr, np.array([5, 6, 9, 0, 1, 2], np.int32), 10)
    assert not K.indices_ok(indptr, np.array([5, 6, 6, 0, 1, 2], np.int32), 10)
