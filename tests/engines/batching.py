"""Checks of Engine.map_dynamic, Engine.map_guided and the sweep's batching, run on
real engines by the test modules that already start them (Dask:
tests/linear/test_distributed.py, Ray: tests/runner/test_clusters.py) and on the local
engine here."""

import time

import numpy as np

from bigrate.engines.base import TaskError
from bigrate.model_selection.sweep import run_sweep
from bigrate.rundir import MemoryStore


def scaled_sum(data, k):
    if k == 3:
        raise ValueError("task 3 fails")
    return float(np.sum(data) * k)


def check_map_dynamic(eng, in_flight=3):
    """Tasks made as slots free up: never more than ``in_flight`` submitted and
    unfinished, every key back once with its own result, a failing task failing
    alone."""
    data = eng.put(np.arange(10.0))
    issued, yielded = [], []

    def next_task():
        # called only while fewer than in_flight are out, the finished ones
        # handed back first
        assert len(issued) - len(yielded) < in_flight
        if len(issued) == 8:
            return None
        k = len(issued)
        issued.append(k)
        return f"key{k}", (data, k)

    got = {}
    for key, res in eng.map_dynamic(scaled_sum, next_task, in_flight=in_flight):
        yielded.append(key)
        got[key] = res
    assert sorted(got) == sorted(f"key{k}" for k in range(8)) and len(yielded) == 8
    for k in range(8):
        r = got[f"key{k}"]
        if k == 3:
            assert isinstance(r, TaskError) and "task 3 fails" in str(r)
            assert "ValueError" in r.tb
        else:
            assert r == 45.0 * k


def check_map_guided(eng):
    """Every task's own result (a handle nested in a batch resolved), a failing task
    failing alone, whatever the batches; the first task of each worker goes alone."""
    data = eng.put(np.arange(10.0))
    args = [(data, k) for k in range(7)]
    for target in (0.0, 1e-3, 10.0):
        sizes: list = []
        got = dict(eng.map_guided(scaled_sum, args, target, sizes=sizes))
        assert sorted(got) == list(range(7)) and sum(sizes) == 7
        assert sizes[0] == 1
        for k in range(7):
            if k == 3:
                assert isinstance(got[k], TaskError) and "task 3 fails" in str(got[k])
                assert "ValueError" in got[k].tb
            else:
                assert got[k] == 45.0 * k


def short_task(k):
    t = time.perf_counter()
    time.sleep(0.02)
    return {"metrics": {"J_val": k / 100.0}, "seconds": time.perf_counter() - t}


def check_sweep_batches_short_tasks(eng):
    """40 tasks of 20 ms on a multi-worker engine: the first task of each of two slots
    per worker alone, then batches of up to 1 s of work, shrinking so that no batch
    holds more than the tasks left over twice the workers; every task recorded."""
    store = MemoryStore()
    points = [{"k": k} for k in range(20)]
    table = run_sweep(eng, store, points, 2, short_task, lambda p, f: (p,),
                      progress=False, batch_seconds=1.0)  # fmt: skip
    assert len(store.results()) == 40 and all(r["n_ok"] == 2 for r in table)
    (wave,) = [e for e in store.log if e["event"] == "sweep_wave"]
    assert wave["batch"] == "guided" and wave["tasks"] == 40
    (batches,) = [e for e in store.log if e["event"] == "sweep_batches"]
    sizes, w = batches["sizes"], eng.n_workers
    assert sum(sizes) == 40 and max(sizes) > 1
    assert sizes[: 2 * w] == [1] * (2 * w)
    left = 40 - 2 * w
    for s in sizes[2 * w :]:  # ~20 ms tasks: the cap is the tasks left, not 1 s
        assert s == -(-left // (2 * w)), sizes
        left -= s


def pid_and_calls(k):
    """This process's id and how many calls it has served (a per-process counter, as
    a worker's row-group cache is per process), with ``k`` back."""
    import os

    _CALLS[os.getpid()] = _CALLS.get(os.getpid(), 0) + 1
    if k == "boom":
        raise ValueError("slot task fails")
    return os.getpid(), _CALLS[os.getpid()], k


_CALLS: dict = {}


def check_pinned(eng, kind, kill=None, settle=None):
    """Task i lands on slot i every call (the same process, whose per-process state
    persists: its call counter grows by one a call), results come back in order, an
    exception inside a task raises its TaskError without losing the slots. With
    ``kill(pid)``: a slot's process killed between calls, the next calls still return
    every result (the lost slot's task run again as a plain task, counted in
    ``fallbacks``; then on the slots there are), and once the cluster is whole again
    (``settle()``) and a second has passed, the pool has a slot on every worker."""
    import pytest

    n = eng.n_workers
    with eng.pinned() as pool:
        assert pool.kind == kind and pool.n_slots == 0
        first = pool.run(pid_and_calls, [(k,) for k in range(n)])
        assert pool.n_slots == (n if kind == "actors" else 0)
        assert [r[2] for r in first] == list(range(n))
        pids = [r[0] for r in first]
        assert len(set(pids)) == n  # one process a slot
        again = pool.run(pid_and_calls, [(k,) for k in range(n)], slots=range(n)[::-1])
        assert [r[2] for r in again] == list(range(n))
        assert [r[0] for r in again] == pids[::-1]
        # each slot's process served one more call (with n slots, slot k twice)
        assert [r[1] for r in again] == [c + 1 for c in [r[1] for r in first][::-1]]
        with pytest.raises(TaskError, match="slot task fails") as e:
            pool.run(pid_and_calls, [("boom",)])
        assert "ValueError" in e.value.tb
        assert [r[0] for r in pool.run(pid_and_calls, [(0,)])] == pids[:1]
        assert pool.fallbacks == 0
        if kill is None:
            return
        kill(pids[0])
        out = pool.run(pid_and_calls, [(k,) for k in range(n)])
        assert [r[2] for r in out] == list(range(n))
        assert out[0][0] != pids[0] and pool.fallbacks == 1
        # at once again: slots on the workers there are (perhaps fewer), or tasks
        soon = pool.run(pid_and_calls, [(k,) for k in range(n)])
        assert [r[2] for r in soon] == list(range(n))
        if settle is not None:
            settle()
        time.sleep(1.1)
        remade = pool.run(pid_and_calls, [(k,) for k in range(n)])
        assert [r[2] for r in remade] == list(range(n))
        assert len({r[0] for r in remade}) == n and pids[0] not in {
            r[0] for r in remade
        }
        assert pool.kind == kind


def tree_task(shared, k, n, scale):
    """A leaf of an allreduce check: what it was given, where it ran, and a float
    whose sums depend on their order; task 0 finishes last, the last task first."""
    import os

    time.sleep(0.05 * (n - 1 - k))
    return {
        "keys": [k],
        "shared": [shared if not isinstance(shared, dict) else shared["x"]],
        "leaf_pids": [os.getpid()],
        "combine_pids": [],
        "x": np.array([scale * (k + 1) ** 3 / 7.0, 1e16 if k == 1 else 0.1 * k]),
    }


def tree_combine(a, b):
    """Not commutative: the keys record the order of the combinations."""
    import os

    return {
        "keys": a["keys"] + b["keys"],
        "shared": a["shared"] + b["shared"],
        "leaf_pids": a["leaf_pids"] + b["leaf_pids"],
        "combine_pids": a["combine_pids"] + b["combine_pids"] + [os.getpid()],
        "x": a["x"] + b["x"],
    }


def check_allreduce(eng, n=5, on_workers=True, on="workers"):
    """``Pinned.allreduce``: the tasks' results combined in the tree's fixed order
    (the same keys and bits as ``tree_reduce`` here, whatever order they finished
    in), on the workers (``on_workers``: no combination in this process), each task
    given the shared object, and a second call's shared object the first's result,
    broadcast from the workers. ``on``: where the tree is combined ("workers": the
    engine's own tasks, "direct": connections between the slots)."""
    import os

    from bigrate.engines.base import Reduced, tree_reduce

    args = [(k, n, 3.0) for k in range(n)]
    expect = tree_reduce([tree_task("s", *a) for a in args], tree_combine)
    with eng.pinned() as pool:
        first = pool.allreduce(tree_task, args, tree_combine, shared="s", on=on)
        assert isinstance(first, Reduced)
        got = first.value
        assert got["keys"] == expect["keys"] != sorted(expect["keys"])
        np.testing.assert_array_equal(got["x"], expect["x"])
        assert got["shared"] == ["s"] * n
        assert len(got["combine_pids"]) == n - 1
        if on_workers:
            assert os.getpid() not in got["combine_pids"] + got["leaf_pids"]
            assert first.handle is not None
        else:
            assert set(got["combine_pids"]) == {os.getpid()}
        # the next call gets the first result (from the workers where they have it)
        first.value = dict(got, x=-1.0)  # what this process holds is not what is sent
        second = pool.allreduce(tree_task, args, tree_combine, shared=first,
                                slots=range(n)[::-1], on=on)  # fmt: skip
        sent = second.value["shared"]
        assert len(sent) == n and len({repr(s) for s in sent}) == 1
        if on_workers:
            np.testing.assert_array_equal(sent[0], got["x"])
        else:
            assert sent[0] == -1.0
        with pytest_raises(TaskError, "task 3 fails"):
            pool.allreduce(_fails_at_3, args, tree_combine, shared="s", on=on)
        assert pool.fallbacks == 0
        # the failed call left nothing behind that the next one trips on
        again = pool.allreduce(tree_task, args, tree_combine, shared="t", on=on)
        assert again.value["keys"] == expect["keys"]
        assert again.value["shared"] == ["t"] * n
        np.testing.assert_array_equal(again.value["x"], expect["x"])
        assert pool.fallbacks == 0


def _fails_at_3(shared, k, n, scale):
    if k == 3:
        raise ValueError("task 3 fails")
    return tree_task(shared, k, n, scale)


def pytest_raises(exc, match):
    import pytest

    return pytest.raises(exc, match=match)
