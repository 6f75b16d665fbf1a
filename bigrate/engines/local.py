"""The local engine: tasks run one after another in this process (no cluster)."""

from __future__ import annotations

import traceback

from bigrate.engines.base import Engine, TaskError


class LocalEngine(Engine):
    """Runs every task in this process, in order; ``put`` passes objects as they are."""

    name = "local"

    @property
    def n_workers(self) -> int:
        return 1

    def map(self, fn, args_list, *, retries: int = 0):
        for i, args in enumerate(args_list):
            try:
                yield i, fn(*args)
            except Exception as e:  # noqa: BLE001 - recorded per task, the sweep goes on
                yield i, TaskError(f"{type(e).__name__}: {e}", traceback.format_exc())
