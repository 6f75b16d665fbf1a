"""The local engine's threads: tasks at once in this process, results as they finish,
errors per task, and no task started after the caller stops."""

import threading
import time

import pytest

from bigrate import _cancel
from bigrate.engines import TaskError, open_engine
from bigrate.engines.local import LocalEngine


def _meet(barrier, i, timeout=10):
    # every task waits for the others: one after another, this would never pass
    barrier.wait(timeout=timeout)
    return i * i


def test_threads_run_tasks_at_once_and_yield_every_result():
    barrier = threading.Barrier(3)
    with open_engine("local", threads=3) as eng:
        assert eng.n_workers == 3
        got = dict(eng.map(_meet, [(barrier, i) for i in range(3)]))
    assert got == {0: 0, 1: 1, 2: 4}
    # one thread runs them one after another: the first waits alone and fails
    with LocalEngine() as eng:
        first = next(iter(eng.map(_meet, [(threading.Barrier(2), 0, 0.5)] * 2)))
    assert isinstance(first[1], TaskError) and "BrokenBarrierError" in str(first[1])


def _maybe_fail(i):
    if i == 2:
        raise ValueError("task two is broken")
    return i


def test_a_failed_task_is_its_own_error_and_the_others_finish():
    with LocalEngine(threads=2) as eng:
        got = dict(eng.map(_maybe_fail, [(i,) for i in range(5)]))
    assert sorted(got) == [0, 1, 2, 3, 4]
    assert isinstance(got[2], TaskError) and "task two is broken" in str(got[2])
    assert [got[i] for i in (0, 1, 3, 4)] == [0, 1, 3, 4]


def test_no_task_starts_after_the_caller_stops():
    started = []

    def slow(i):
        started.append(i)
        time.sleep(0.2)
        return i

    with LocalEngine(threads=2) as eng:
        it = eng.map(slow, [(i,) for i in range(20)])
        next(it)
        it.close()  # what a caller raising out of its loop does
    time.sleep(0.3)
    assert len(started) <= 4, started  # the two running, at most two more begun


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_threads_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        LocalEngine(threads=bad)


@pytest.mark.parametrize("how", ["map", "map_dynamic"])
def test_running_tasks_stop_at_their_next_check_when_the_caller_stops(how):
    """A caller that stops (an error, Ctrl-C) does not wait for its running tasks to
    end: they raise Cancelled at their next check; with map or map_dynamic."""
    import threading

    seen, spinning = [], threading.Event()

    def spin(i):
        if i == 0:
            return i
        spinning.set()
        t = time.perf_counter()
        try:
            while time.perf_counter() - t < 30:  # until cancelled (30 s: a failure)
                _cancel.check()
                time.sleep(0.01)
        except _cancel.Cancelled:
            seen.append(i)
            raise
        return i

    with LocalEngine(threads=2) as eng:
        if how == "map":
            it = eng.map(spin, [(0,), (1,), (2,)])
        else:
            tasks = iter([(0, (0,)), (1, (1,)), (2, (2,))])
            it = eng.map_dynamic(spin, lambda: next(tasks, None), in_flight=2)
        assert next(it) == (0, 0)
        assert spinning.wait(10)  # a task running (not one cancelled unstarted)
        t = time.perf_counter()
        it.close()
        assert time.perf_counter() - t < 5
    assert seen in ([1], [2], [1, 2], [2, 1])
    _cancel.check()  # this thread was never bound: nothing to raise


def test_a_bound_partition_stops_at_its_next_check():
    import threading

    import numpy as np

    from bigrate.model_selection.bpsp.partition import Partitioner

    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 2))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    stop = threading.Event()
    stop.set()
    _cancel.bind(stop)
    try:
        with pytest.raises(_cancel.Cancelled):
            Partitioner(X, y, gamma=0.5, lambda_min=0.05).run()
    finally:
        _cancel.bind(None)
    assert len(Partitioner(X, y, gamma=0.5, lambda_min=0.05).run()) > 10
