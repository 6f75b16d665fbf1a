"""Waits on a cluster have an end, on a real Dask scheduler on 127.0.0.1: a cluster
without workers is waited for (saying so) and then given up on in one line, one that
gains a worker goes on, and a call whose results stop coming says so while the
workers are alive."""

import time

import pytest

from bigrate.engines import ClusterLost
from tests.runner.test_worker_loss import start_dask, start_dask_worker, stop_group


@pytest.fixture
def empty_scheduler(tmp_path):
    address, sched, _ = start_dask(tmp_path / "nofault", n_workers=0)
    procs = [sched]
    yield address, procs
    for p in procs:
        stop_group(p)


def test_a_cluster_without_workers_is_given_up_on_in_one_line(empty_scheduler):
    from bigrate.engines import open_engine

    address, _ = empty_scheduler
    notices = []
    with open_engine("dask", address, worker_wait=3) as eng:
        eng.on_notice = notices.append
        t = time.monotonic()
        with pytest.raises(ClusterLost) as e:
            eng.wait_for_workers(1)
        took = time.monotonic() - t
    assert 3 <= took < 10
    assert str(e.value) == f"the cluster at {address} has had no worker for 3 s"
    assert "\n" not in str(e.value) and e.value.address == address
    assert notices == [
        f"dask: no worker in the cluster at {address}; waiting up to 3 s for one "
        "to join"
    ]


def test_a_cluster_that_gains_a_worker_goes_on(empty_scheduler, tmp_path):
    from bigrate.engines import open_engine

    address, procs = empty_scheduler
    with open_engine("dask", address, worker_wait=60) as eng:
        notices = []
        eng.on_notice = notices.append
        procs.append(start_dask_worker(tmp_path / "nofault", address))
        t = time.monotonic()
        assert eng.wait_for_workers(1) == 1
        assert time.monotonic() - t < 60
        # (tasks run time.sleep: the workers cannot import the tests package)
        assert eng.run(time.sleep, [(0.0,)]) == [None]
    assert notices == [
        f"dask: no worker in the cluster at {address}; waiting up to 60 s for one "
        "to join"
    ]


def test_a_call_without_results_says_so_while_workers_are_alive(
    empty_scheduler, tmp_path
):
    from bigrate.engines import open_engine

    address, procs = empty_scheduler
    procs.append(start_dask_worker(tmp_path / "nofault", address))
    with open_engine("dask", address) as eng:
        eng.wait_for_workers(1)
        eng.stall_after = 1.0
        notices = []
        eng.on_notice = notices.append
        with eng.pinned() as pool:
            assert pool.run(time.sleep, [(5.5,)], what="round 7") == [None]
        assert eng.run(time.sleep, [(3.0,)], what="the fit") == [None]
    stalls = [n for n in notices if "no result" in n and "slots" not in n]
    # after 1 s, then 2 s, then 4 s of the 5.5 s call; after 1 and 2 s of the 3 s one
    assert [n.split(":")[1].strip() for n in stalls] == ["round 7"] * 3 + [
        "the fit"
    ] * 2
    assert (
        stalls[0]
        == "dask: round 7: no result for 1 task in 1 s; 1 worker alive, still waiting"
    )
