"""The local engine: tasks run one after another in this process (no cluster)."""

from __future__ import annotations

from bigrate.engines.base import Engine, _call


class LocalEngine(Engine):
    """Runs every task in this process, in order; ``put`` passes objects as they are
    (``map_dynamic`` is the base class's: one task at a time, here)."""

    name = "local"

    @property
    def n_workers(self) -> int:
        return 1

    def map(self, fn, args_list, *, retries: int = 0, what: str = "tasks"):
        for i, args in enumerate(args_list):
            yield i, _call(fn, args)
