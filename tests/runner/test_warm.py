"""`bigrate warm` fills numba's on-disk cache that a fresh process (a new container or
cluster node) then loads instead of compiling."""

import os

from tests.conftest import run_cli


def test_warm_writes_the_compiled_kernels_where_numba_caches(tmp_path):
    cache = tmp_path / "numba-cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    p = run_cli("warm", "--estimator", "NeymanPearsonSGD", "--estimator", "QValueSGD",
                env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "NeymanPearsonSGD" in p.stdout and "QValueSGD" in p.stdout
    assert f"numba cache: {cache}" in p.stdout
    written = {f.name for f in cache.rglob("*.nbi")}
    assert any("np_sgd_steps" in n for n in written), written
    assert any("qvalue_sgd_steps" in n for n in written), written
    # and what a cluster worker's rounds run: the shard reader's kernels, the lists
    # of decoded row groups and the steps on rows where they lie
    for kernel in ("np_sgd_steps_seq", "qvalue_sgd_steps_seq", "block_lists",
                   "copy_indices_checked"):  # fmt: skip
        assert any(kernel in n for n in written), (kernel, written)
    # a second process finds them: nothing new is compiled
    before = {f: f.stat().st_mtime_ns for f in cache.rglob("*.nbc")}
    p = run_cli("warm", "--estimator", "NeymanPearsonSGD", env=env)
    assert p.returncode == 0, p.stderr
    after = {f: f.stat().st_mtime_ns for f in cache.rglob("*.nbc")}
    assert after == before


def test_warm_refuses_what_it_cannot_warm_in_one_line():
    p = run_cli("warm", "--estimator", "NoSuchSVC")
    assert p.returncode == 2 and "estimator must be one of" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = run_cli("warm", "--estimator", "NPSearchCV")
    assert p.returncode == 2 and "warm that one" in p.stderr
