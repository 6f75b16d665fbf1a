"""The local engine: tasks run one after another in this process (no cluster)."""

from __future__ import annotations

import traceback


class TaskError(RuntimeError):
    """A task failed; ``tb`` holds the remote traceback text."""

    def __init__(self, message: str, tb: str = ""):
        super().__init__(message)
        self.tb = tb


class LocalEngine:
    name = "local"
    dashboard_link = None

    def put(self, obj):
        return obj

    def map(self, fn, args_list, *, retries: int = 0):
        """Yield (index, result or TaskError) as tasks finish."""
        for i, args in enumerate(args_list):
            try:
                yield i, fn(*args)
            except Exception as e:  # noqa: BLE001 - recorded per task, the sweep goes on
                yield i, TaskError(f"{type(e).__name__}: {e}", traceback.format_exc())

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
