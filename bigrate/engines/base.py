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

import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

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

    def map_batched(
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        batch_size: int,
        *,
        retries: int = 3,
    ) -> Iterator[tuple[int, object]]:
        """As :meth:`map`, with ``batch_size`` consecutive tasks run as one engine task
        (to amortise the engine's per-task cost over short tasks). Results come back
        per task, a batch's all at once when it finishes; a task that raises fails
        alone, a batch whose worker is lost beyond ``retries`` fails each of its tasks."""
        if batch_size <= 1:
            yield from self.map(fn, args_list, retries=retries)
            return
        chunks = [
            list(range(a, min(a + batch_size, len(args_list))))
            for a in range(0, len(args_list), batch_size)
        ]
        batches = [
            (fn, [args_list[i] for i in c], self.resolve_in_batch) for c in chunks
        ]
        for b, res in self.map(run_batch, batches, retries=retries):
            for j, i in enumerate(chunks[b]):
                if isinstance(res, TaskError):
                    yield i, res
                else:
                    r = res[j]
                    yield (
                        i,
                        (TaskError(r["error"], r["tb"]) if _failed(r) else r["value"]),
                    )

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


def run_batch(fn: Callable, items: list[tuple], resolve: Callable | None) -> list[dict]:
    """One engine task running ``fn(*args)`` for every tuple of ``items``, in order:
    ``{"value": result}`` or ``{"error": message, "tb": traceback}`` for each."""
    import traceback

    out = []
    for args in items:
        try:
            if resolve is not None:
                args = tuple(resolve(a) for a in args)
            out.append({"value": fn(*args)})
        except Exception as e:  # noqa: BLE001 - recorded per task, the batch goes on
            out.append(
                {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
            )
    return out
