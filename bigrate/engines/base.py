"""The engine interface: what every engine (local, Dask, Ray) offers, and all that the
learners and the sweeps may ask of one. An engine knows nothing of learners: it puts data
on the workers, maps plain functions over argument tuples and gives results back.

- ``put(obj)``: send ``obj`` to the workers once; tasks receive the handle in its place.
- ``map(fn, args_list, retries=)``: yield ``(index, result or TaskError)`` as tasks finish
  (a sweep records each and goes on).
- ``map_dynamic(fn, next_task, in_flight=, retries=)``: the same for tasks made as
  slots free up (``next_task()`` gives ``(key, args)`` or None), at most ``in_flight``
  submitted and unfinished at once; ``map_guided`` builds batches of short tasks on it.
- ``run(fn, args_list, retries=)``: every result, in order; the first failure raises
  :class:`TaskError` (a training round needs all of its tasks).
- ``n_workers`` and ``worker_memory_limits()``: what a learner needs to plan its work.
- ``close()`` (also as a context manager), ``dashboard_link``.

A task whose worker process dies is retried on another worker up to ``retries`` times;
an exception raised inside a task is not retried.
"""

from __future__ import annotations

import socket
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

import numpy as np

DEFAULT_TIMEOUT = 30.0  # seconds to reach a cluster before giving up


class TaskError(RuntimeError):
    """A task failed; ``tb`` holds the traceback text from where it ran."""

    def __init__(self, message: str, tb: str = ""):
        super().__init__(message)
        self.tb = tb


class EngineConnectError(ConnectionError):
    """A cluster address could not be reached: one line naming the address and what
    to check (nothing was started, nothing can be resumed)."""


def host_port(address: str, default_port: int) -> tuple[str, int]:
    """(host, port) of ``tcp://host:port``, ``ray://host:port`` or ``host:port``."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep:
        return rest, default_port
    if not port.isdigit():
        raise ValueError(f"address {address!r}: the port must be a number")
    return host.strip("[]"), int(port)


def wait_reachable(address: str, default_port: int, timeout: float, what: str) -> None:
    """Return once a TCP connection to ``address`` succeeds; raise
    :class:`EngineConnectError` after ``timeout`` seconds of refusals or silence."""
    host, port = host_port(address, default_port)
    deadline = time.monotonic() + timeout
    last = None
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5, left))):
                return
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            raise EngineConnectError(
                f"cannot reach the {what} at {address} within {timeout:g} s "
                f"({type(last).__name__}: {last}); check the address and port, that "
                "the cluster is running, and that this machine may connect to it "
                "(firewall, TLS)"
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


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

    def poll_events(self) -> list[dict]:
        """Changes of the cluster since the last call: ``{"event": "worker_lost" |
        "worker_joined", "worker": address}`` (none on engines without workers to
        lose). A task of a lost worker is run again elsewhere by the engine."""
        return []

    @abstractmethod
    def map(
        self, fn: Callable, args_list: Sequence[tuple], *, retries: int = 3
    ) -> Iterator[tuple[int, object]]:
        """Yield ``(index, result or TaskError)`` as the tasks finish."""

    def warm_up(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` once on every worker (imports, compiled kernels loaded
        from numba's cache), so that the first tasks of a short-task workload do not
        each pay it. Here: once in this process (the local engine's worker)."""
        fn(*args)

    #: module-level function ``x -> x`` run on a worker for every argument of a batched
    #: task: where the engine resolves only top-level handles (Ray), it fetches the
    #: objects of handles nested in a batch
    resolve_in_batch: Callable | None = None

    def map_dynamic(
        self,
        fn: Callable,
        next_task: Callable[[], tuple | None],
        *,
        in_flight: int,
        retries: int = 3,
    ) -> Iterator[tuple[object, object]]:
        """Yield ``(key, result or TaskError)`` as tasks finish, where the tasks are
        made as they can start: ``next_task()`` returns ``(key, args)`` for
        ``fn(*args)``, or None once there are no more, and is called whenever fewer
        than ``in_flight`` tasks are submitted and unfinished, after the results
        finished so far were handed back (so it can size the next task by them).
        Here: one task at a time, in this process."""
        while (nxt := next_task()) is not None:
            key, args = nxt
            yield key, _call(fn, args)

    def map_guided(
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        target_seconds: float,
        *,
        retries: int = 3,
        sizes: list | None = None,
    ) -> Iterator[tuple[int, object]]:
        """As :meth:`map`, with consecutive short tasks run together as one engine
        task of about ``target_seconds`` of work, to amortise the engine's cost per
        task (guided self-scheduling). The batches are sized as results come in: the
        first ``2 x n_workers`` tasks go alone, each later batch holds
        ``target_seconds`` over the median time of the last 64 tasks finished (timed
        where they ran), but at most the tasks left over ``2 x n_workers``, so the
        last batches shrink and the workers finish together. Two batches per worker
        are kept submitted, so a worker starts its next one while this process
        records the last one's results. Results come back per task, a batch's all at
        once; a task that raises fails alone, a batch whose worker is lost beyond
        ``retries`` fails each of its tasks. ``sizes``, if given, receives each
        batch's size."""
        workers = max(1, self.n_workers)
        n = len(args_list)
        nxt = [0]
        seconds: list[float] = []

        def next_batch():
            a = nxt[0]
            if a >= n:
                return None
            if len(seconds) == 0:
                size = 1
            else:
                per = float(np.median(seconds[-64:]))
                size = int(target_seconds // per) if per > 0 else n
            size = max(1, min(size, -(-(n - a) // (2 * workers))))
            nxt[0] = a + size
            if sizes is not None:
                sizes.append(size)
            items = [args_list[i] for i in range(a, a + size)]
            return range(a, a + size), (fn, items, self.resolve_in_batch)

        for idx, res in self.map_dynamic(
            run_batch, next_batch, in_flight=2 * workers, retries=retries
        ):
            for j, i in enumerate(idx):
                if isinstance(res, TaskError):
                    yield i, res
                    continue
                r = res[j]
                if _failed(r):
                    yield i, TaskError(r["error"], r["tb"])
                else:
                    seconds.append(r["seconds"])
                    yield i, r["value"]

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


def _failed(r: dict) -> bool:
    return "error" in r


def submit_while_free(
    pending: dict, in_flight: int, next_task: Callable, submit: Callable
) -> None:
    """The engines' ``map_dynamic`` step: while fewer than ``in_flight`` tasks are
    ``pending`` (handle -> key), submit the next one, ``submit(args) -> handle``."""
    while len(pending) < in_flight:
        nxt = next_task()
        if nxt is None:
            return
        key, args = nxt
        pending[submit(args)] = key


def _call(fn: Callable, args: tuple):
    """``fn(*args)``, or the exception it raised as a :class:`TaskError`."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - recorded per task, the caller goes on
        return TaskError(f"{type(e).__name__}: {e}", traceback.format_exc())


def run_batch(fn: Callable, items: list[tuple], resolve: Callable | None) -> list[dict]:
    """One engine task running ``fn(*args)`` for every tuple of ``items``, in order:
    ``{"value": result, "seconds": its time}`` or ``{"error": message, "tb":
    traceback}`` for each."""
    out = []
    for args in items:
        try:
            if resolve is not None:
                args = tuple(resolve(a) for a in args)
            t = time.perf_counter()
            value = fn(*args)
            out.append({"value": value, "seconds": time.perf_counter() - t})
        except Exception as e:  # noqa: BLE001 - recorded per task, the batch goes on
            out.append(
                {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
            )
    return out
