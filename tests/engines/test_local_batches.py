from bigrate.engines.local import LocalEngine
from bigrate.model_selection.sweep import run_sweep
from bigrate.rundir import MemoryStore
from tests.engines.batching import check_map_batched, short_task


def test_local_engine_map_batched():
    check_map_batched(LocalEngine())


def test_one_worker_does_not_batch():
    store = MemoryStore()
    run_sweep(LocalEngine(), store, [{"k": 0}, {"k": 1}], 3, short_task,
              lambda p, f: (p,), progress=False, batch_seconds=1.0)  # fmt: skip
    waves = [e for e in store.log if e["event"] == "sweep_wave"]
    assert waves == [dict(waves[0], tasks=6, batch=1)]
