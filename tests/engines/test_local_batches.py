import numpy as np

from bigrate.engines.local import LocalEngine
from bigrate.model_selection.sweep import run_sweep
from bigrate.rundir import MemoryStore
from tests.engines.batching import (
    check_allreduce,
    check_map_dynamic,
    check_map_guided,
    check_pinned,
    short_task,
)


def test_local_engine_map_dynamic_and_guided():
    check_map_dynamic(LocalEngine(), in_flight=1)
    check_map_guided(LocalEngine())
    check_map_dynamic(LocalEngine(threads=3), in_flight=3)
    check_map_dynamic(LocalEngine(threads=2), in_flight=3)


def test_local_engine_map_dynamic_runs_tasks_at_once_on_its_threads():
    """With threads, map_dynamic runs up to that many tasks at once (two tasks that
    each wait for the other finish; one after another they could not), and asks for
    the next task only as a thread frees up."""
    import threading

    meet = threading.Barrier(2, timeout=20)
    asked = []

    def task(k):
        meet.wait()  # both running at once, or a BrokenBarrierError
        return k

    def next_task():
        asked.append(len(asked))
        return None if len(asked) > 4 else (len(asked), (len(asked),))

    got = dict(LocalEngine(threads=2).map_dynamic(task, next_task, in_flight=2))
    assert got == {1: 1, 2: 2, 3: 3, 4: 4}


def test_local_engine_pinned_pool_runs_in_this_process():
    import os

    check_pinned(LocalEngine(), "tasks")
    check_allreduce(LocalEngine(), on_workers=False)
    with LocalEngine().pinned() as pool:
        assert pool.run(os.getpid, [()]) == [os.getpid()]


def test_one_worker_does_not_batch():
    store = MemoryStore()
    run_sweep(LocalEngine(), store, [{"k": 0}, {"k": 1}], 3, short_task,
              lambda p, f: (p,), progress=False, batch_seconds=1.0)  # fmt: skip
    waves = [e for e in store.log if e["event"] == "sweep_wave"]
    assert waves == [dict(waves[0], tasks=6, batch=1)]
    assert not [e for e in store.log if e["event"] == "sweep_batches"]


def test_a_record_saved_without_its_event_gets_it_on_resume(tmp_path):
    """A task's record is saved before its event; a sweep stopped between the two
    writes the missing event when it resumes (once), and does not redo the task."""
    from bigrate.rundir import RunDir

    run = RunDir(tmp_path)
    (tmp_path / "results").mkdir()
    points = [{"k": 0}, {"k": 1}]
    run_sweep(LocalEngine(), run, points, 2, short_task, lambda p, f: (p,),
              progress=False)  # fmt: skip
    events = (tmp_path / "events.jsonl").read_text().splitlines()
    # drop the event of (1, 1), as a kill right after its record was saved would
    kept = [
        e for e in events if not ('"task_done"' in e and '"point": 1, "fold": 1' in e)
    ]
    assert len(kept) == len(events) - 1
    (tmp_path / "events.jsonl").write_text("\n".join(kept) + "\n")
    before = (tmp_path / "results" / "point-00001-fold-001.json").read_bytes()
    for _ in range(2):  # resumed twice: the event is written once
        run_sweep(LocalEngine(), run, points, 2, short_task, lambda p, f: (p,),
                  progress=False)  # fmt: skip
    done = [e for e in run.events() if e["event"] == "task_done"]
    assert sorted((e["point"], e["fold"]) for e in done) == [(0, 0), (0, 1), (1, 0),
                                                              (1, 1)]  # fmt: skip
    assert [e.get("recovered") for e in done if (e["point"], e["fold"]) == (1, 1)] == [
        True
    ]
    assert (tmp_path / "results" / "point-00001-fold-001.json").read_bytes() == before


def test_shared_folds_load_and_send_once():
    """A sweep's data and fold rows go to the workers once: loaded on first use, the
    same handles for every task of a fold afterwards."""
    from bigrate.engines import open_engine
    from bigrate.model_selection.sweep import SharedFolds

    X, y = np.arange(12.0).reshape(6, 2), np.array([1, -1] * 3)
    splits = [(np.array([0, 1, 2]), np.array([3, 4, 5])),
              (np.array([3, 4, 5]), np.array([0, 1, 2]))]  # fmt: skip
    loads = []

    def load():
        loads.append(1)
        return X, y, splits

    with open_engine("local") as eng:
        folds = SharedFolds(eng, load)
        assert not loads  # nothing read before the first task
        a, b = folds(1), folds(1)
        data, tr, te = a
        assert len(loads) == 1 and all(p is q for p, q in zip(a, b, strict=True))
        assert data[0] is X and data[1] is y
        np.testing.assert_array_equal(tr, splits[1][0])
        np.testing.assert_array_equal(te, splits[1][1])
        assert folds(0)[0] is data and len(loads) == 1
