"""The kernel tests once more with numba's bounds checking on (every array access of
every compiled kernel checked: an index out of range raises IndexError instead of
reading or writing past the array). Slow (every kernel is compiled again, into a
temporary cache): ``pytest -m slow tests/test_boundscheck.py``."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

KERNEL_TESTS = [
    "tests/linear/test_sgd_reference.py",
    "tests/kernel/test_smo_svc.py",
    "tests/aum/test_aum.py",
    "tests/quantile/test_quantile_path.py",
    "tests/data/test_corrupt_shards.py",
    "tests/data/test_pages.py",
    "tests/data/test_svmlight_roundtrip.py",
]


@pytest.mark.slow
def test_kernel_tests_pass_with_numba_bounds_checking(tmp_path):
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path))
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-m", "not slow", *KERNEL_TESTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-3000:]
