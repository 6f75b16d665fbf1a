"""Checks of Engine.map_batched and the sweep's batching, run on real engines by the
test modules that already start them (Dask: tests/linear/test_distributed.py, Ray:
tests/runner/test_clusters.py) and on the local engine here."""

import time

import numpy as np

from bigrate.engines.base import TaskError
from bigrate.model_selection.sweep import run_sweep
from bigrate.rundir import MemoryStore


def scaled_sum(data, k):
    if k == 3:
        raise ValueError("task 3 fails")
    return float(np.sum(data) * k)


def check_map_batched(eng):
    """Every task's own result (a handle nested in a batch resolved), a failing task
    failing alone, whatever the batch size."""
    data = eng.put(np.arange(10.0))
    args = [(data, k) for k in range(7)]
    for size in (1, 3, 7, 20):
        got = dict(eng.map_batched(scaled_sum, args, size))
        assert sorted(got) == list(range(7))
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
    """40 tasks of 20 ms on a multi-worker engine: after a probe wave they go out in
    batches (about 1 s of work each, at least two a worker), every task recorded."""
    store = MemoryStore()
    points = [{"k": k} for k in range(20)]
    table = run_sweep(eng, store, points, 2, short_task, lambda p, f: (p,),
                      progress=False, batch_seconds=1.0)  # fmt: skip
    assert len(store.results()) == 40 and all(r["n_ok"] == 2 for r in table)
    waves = [e for e in store.log if e["event"] == "sweep_wave"]
    assert waves[0]["batch"] == 1 and waves[0]["tasks"] == eng.n_workers
    assert max(w["batch"] for w in waves) > 1
    assert sum(w["tasks"] for w in waves) == 40
