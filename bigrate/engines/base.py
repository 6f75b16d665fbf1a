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
- ``pinned()``: a :class:`Pinned` pool (a context manager) whose ``run`` sends task i
  to worker slot i every call, straight to that worker where the engine can (Dask and
  Ray actors: no scheduler in between), so what a worker process keeps from one call
  (a cache of decoded data) serves the next; rounds of a training loop use it.
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

    def pinned(self) -> Pinned:
        """A pool of this engine's worker slots for calls that should land where the
        same call landed before (see :class:`Pinned`); close it (or use it as a
        context manager) when done. Here: :meth:`run`, in this process."""
        return Pinned(self)

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


class Slot:
    """A worker slot of a pinned pool, made an actor by the engine: it runs functions
    in its worker's process (where that process's caches live); ``resolve`` as
    :attr:`Engine.resolve_in_batch`."""

    def __init__(self, resolve: Callable | None = None):
        self.resolve = resolve

    def run(self, fn: Callable, args: tuple) -> list[dict]:
        return run_batch(fn, [args], self.resolve)


class Pinned:
    """Tasks pinned to worker slots, for a loop that calls the same tasks again and
    again (a training round): ``run(fn, args_list, slots=)`` runs task i on slot
    ``slots[i]`` (default i) modulo the slots, each slot one worker process for the
    pool's life, so a worker's per-process cache (row groups decoded in an earlier
    round) serves the same slot's next task. On Dask and Ray a slot is an actor:
    calls go straight to its worker, without the scheduler's round trip a task pays
    (Dask: ~13 -> ~6 ms a round of two 378 KB states on this machine). A call whose
    worker is lost is run again as an ordinary task (with ``retries``, counted in
    ``fallbacks``) and the slots are made again on the workers there are at the next
    call, and again once the engine has more workers than slots while they are fewer
    than at first (checked at most once a second); where no actor can be made at first,
    the pool runs plain tasks (``kind``). An exception raised inside ``fn`` raises its
    :class:`TaskError`, as :meth:`Engine.run` does. This base class (the local
    engine's) runs :meth:`Engine.run`."""

    #: how calls reach the workers: "tasks" (ordinary engine tasks) or "actors"
    kind = "tasks"

    def __init__(self, engine: Engine):
        self.engine = engine
        self.fallbacks = 0
        self._slots: list | None = None  # one handle a slot, made on first use
        self._size: int | None = None  # how many there were at first
        self._retry_at = 0.0

    @property
    def n_slots(self) -> int:
        """Slots the pool has now (0 before the first call, and with plain tasks)."""
        return len(self._slots or [])

    def _open(self) -> list:
        """One handle a worker slot (engines with actors); [] for plain tasks."""
        return []

    def _submit(self, slot, fn: Callable, args: tuple):
        """Start ``run_batch(fn, [args])`` on ``slot``; a handle for :meth:`_result`."""
        raise NotImplementedError

    def _result(self, handle) -> list[dict]:
        """What :meth:`_submit` started; raises if the slot's worker was lost."""
        raise NotImplementedError

    def _close_slots(self, slots: list, lost: bool) -> None:
        """Let go of ``slots`` (``lost``: a worker of theirs was lost)."""

    def run(
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        *,
        slots: Sequence[int] | None = None,
        retries: int = 3,
    ) -> list:
        """The results of ``fn(*args)`` for every tuple, in order; task i on slot
        ``slots[i]`` (default i); the first failed task raises its TaskError."""
        if not self._ready():
            return self.engine.run(fn, args_list, retries=retries)
        slots = range(len(args_list)) if slots is None else slots
        n = len(self._slots)
        handles: list = []
        for k, args in zip(slots, args_list, strict=True):
            try:
                handles.append(self._submit(self._slots[k % n], fn, args))
            except Exception:  # noqa: BLE001 - a slot known lost: run it elsewhere
                handles.append(None)
        out: list = [None] * len(args_list)
        lost = []
        for i, h in enumerate(handles):
            r = None
            if h is not None:
                try:
                    (r,) = self._result(h)
                except Exception:  # noqa: BLE001 - the worker is gone: run it elsewhere
                    pass
            if r is None:
                lost.append(i)
                continue
            if _failed(r):
                raise TaskError(r["error"], r["tb"])
            out[i] = r["value"]
        if lost:
            self.fallbacks += len(lost)
            self._drop(lost=True)  # made again on the workers there are, next call
            again = self.engine.run(fn, [args_list[i] for i in lost], retries=retries)
            for i, res in zip(lost, again, strict=True):
                out[i] = res
        return out

    def _ready(self) -> list:
        """The slots, made on first use, and made again after a lost worker: at the
        next call, then while there are fewer than at first (a nanny's replacement
        worker not up yet) as soon as the engine has more workers than slots, looked
        at once a second at most. [] (plain tasks): none can be made (at first: for
        the pool's life, ``kind`` says "tasks")."""
        slots, now = self._slots, time.monotonic()
        if slots is not None:
            if len(slots) >= self._size or now < self._retry_at:
                return slots
            self._retry_at = now + 1.0
            if self.engine.n_workers <= len(slots):
                return slots
        self._drop(lost=slots is not None)
        try:
            self._slots = self._open()
        except Exception:  # noqa: BLE001 - no actors here: plain tasks
            self._slots = []
        if self._size is None:
            self._size = len(self._slots)
            if not self._slots:
                self.kind = "tasks"
        self._retry_at = now + 1.0
        return self._slots

    def _drop(self, lost: bool = False) -> None:
        slots, self._slots = self._slots or [], None
        try:
            self._close_slots(slots, lost)
        except Exception:  # noqa: BLE001 - slots of lost workers are gone already
            pass

    def close(self) -> None:
        self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
