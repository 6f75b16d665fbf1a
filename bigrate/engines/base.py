"""The engine interface: what every engine (local, Dask, Ray) offers, and all that the
learners and the sweeps may ask of one. An engine knows nothing of learners: it puts data
on the workers, maps plain functions over argument tuples and gives results back.

- ``put(obj)``: send ``obj`` to the workers once; tasks receive the handle in its place.
- ``map(fn, args_list, retries=)``: yield ``(index, result or TaskError)`` as tasks finish
  (a sweep records each and goes on).
- ``run(fn, args_list, retries=)``: every result, in order; the first failure raises
  :class:`TaskError` (a training round needs all of its tasks).
- ``n_workers`` and ``worker_memory_limits()``: what a learner needs to plan its work.
- ``close()`` (also as a context manager), ``dashboard_link``.

A task whose worker process dies is retried on another worker up to ``retries`` times;
an exception raised inside a task is not retried.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence


class TaskError(RuntimeError):
    """A task failed; ``tb`` holds the traceback text from where it ran."""

    def __init__(self, message: str, tb: str = ""):
        super().__init__(message)
        self.tb = tb


class Engine(ABC):
    """Base class of the engines; see the module docstring for the contract."""

    name = "engine"

    @property
    def dashboard_link(self) -> str | None:
        return None

    @property
    @abstractmethod
    def n_workers(self) -> int:
        """How many tasks can run at once."""

    def worker_memory_limits(self) -> list[int | None]:
        """Each worker's memory limit in bytes (None: no limit known)."""
        return [None] * self.n_workers

    def put(self, obj):
        return obj

    @abstractmethod
    def map(
        self, fn: Callable, args_list: Sequence[tuple], *, retries: int = 3
    ) -> Iterator[tuple[int, object]]:
        """Yield ``(index, result or TaskError)`` as the tasks finish."""

    def run(
        self, fn: Callable, args_list: Sequence[tuple], *, retries: int = 3
    ) -> list:
        """The results of ``fn(*args)`` for every tuple, in order; the first failed task
        raises its :class:`TaskError`."""
        out: list = [None] * len(args_list)
        for i, res in self.map(fn, args_list, retries=retries):
            if isinstance(res, TaskError):
                raise res
            out[i] = res
        return out

    def close(self) -> None:  # noqa: B027 - engines without resources keep it
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
