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
  (a cache of decoded data) serves the next; and whose ``allreduce`` runs task i on
  slot i and combines the results on the workers along a fixed tree (:func:`tree_order`),
  the driver receiving only the combined result; rounds of a training loop use it.
- ``n_workers`` and ``worker_memory_limits()``: what a learner needs to plan its work.
- ``close()`` (also as a context manager), ``dashboard_link``.

A task whose worker process dies is retried on another worker up to ``retries`` times;
an exception raised inside a task is not retried.

No wait on a cluster is without an end. Every wait (warm-up, making the pinned pool's
actors, each call to them, gathering tasks) looks up at least every ``POLL_SECONDS``:
it checks that the scheduler or head still answers (else :class:`ClusterLost`), that
the workers its calls depend on are alive (a lost one's work is sent again elsewhere),
and that the cluster has a worker at all (none for ``worker_wait`` seconds:
:class:`ClusterLost`); a wait that has brought no result for ``STALL_SECONDS`` says so
through :meth:`Engine.notice`, and again at doubling intervals.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from bigrate.engines.tree import tree_children, tree_parent, tree_reduce  # noqa: F401

DEFAULT_TIMEOUT = 30.0  # seconds to reach a cluster before giving up
DEFAULT_WORKER_WAIT = 120.0  # seconds a cluster may have no worker before giving up
POLL_SECONDS = 1.0  # every wait on a cluster looks up at least this often
STALL_SECONDS = 45.0  # a wait without any result says so after this long


class TaskError(RuntimeError):
    """A task failed; ``tb`` holds the traceback text from where it ran."""

    def __init__(self, message: str, tb: str = ""):
        super().__init__(message)
        self.tb = tb


class EngineConnectError(ConnectionError):
    """A cluster address could not be reached: one line naming the address and what
    to check (nothing was started, nothing can be resumed)."""


class ClusterLost(RuntimeError):
    """The cluster went away under the work: its Dask scheduler or Ray head stopped
    answering, or it had no worker left for ``worker_wait`` seconds. Nothing more can
    run on it; what was saved (a training checkpoint, finished sweep tasks) resumes on
    a cluster that is there. ``str(e)`` is one line naming what was lost;
    ``address`` is the cluster's (None: embedded); ``at`` says where the work
    stood (e.g. "at round 23"), set by the caller that knows."""

    def __init__(self, message: str, address: str | None = None):
        super().__init__(message)
        self.address = address
        self.at: str | None = None


class Watch:
    """One wait on a cluster. The engine calls :meth:`progress` when a result comes in
    and :meth:`idle` whenever a poll of ``POLL_SECONDS`` brought none: that checks the
    cluster (:meth:`Engine.check_cluster`, which raises :class:`ClusterLost`) and,
    after the engine's ``stall_after`` seconds (``STALL_SECONDS``) without a result,
    says so through :meth:`Engine.notice` (again after twice as long, and so on)."""

    def __init__(self, engine: Engine, what: str):
        self.engine, self.what = engine, what
        self.since = time.monotonic()
        self.next_notice = engine.stall_after

    def progress(self) -> None:
        self.since = time.monotonic()
        self.next_notice = self.engine.stall_after

    def idle(self, waiting: int | None = None) -> None:
        if self.engine.should_stop is not None and self.engine.should_stop():
            raise KeyboardInterrupt
        self.engine.check_cluster()
        quiet = time.monotonic() - self.since
        if quiet >= self.next_notice:
            self.next_notice *= 2
            n = self.engine.n_workers
            of = f" for {waiting} task{'s' * (waiting != 1)}" if waiting else ""
            self.engine.notice(
                f"{self.what}: no result{of} in {quiet:.0f} s; {n} worker"
                f"{'s' * (n != 1)} alive, still waiting"
            )


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


#: seconds a Dask scheduler or Ray GCS may take to answer a probe (they answer at once)
GREETING_SECONDS = 10.0
#: what a gRPC (HTTP/2) client sends first, and an empty SETTINGS frame
_H2_PREFACE = (
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
)


def _shown(data: bytes) -> str:
    """What a server sent, for a message: its first line if text, else hex."""
    head = data[:60]
    text = head.split(b"\n")[0].strip()
    if text and all(32 <= c < 127 for c in text):
        return repr(text.decode())
    return f"bytes {head[:16].hex(' ')}"


def _greeting(host, port, timeout: float, send: bytes, n: int, good) -> bytes:
    """The first ``n`` bytes the server at (host, port) sends (after ``send``), or as
    many as came within ``timeout`` seconds; when ``good(data)`` says they are not what
    was expected, what else it sends in the next 0.3 s too (for the message)."""

    def read(s, data, upto, until):
        while len(data) < upto:
            left = until - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                chunk = s.recv(upto - len(data))
            except OSError:  # a timeout, or the connection reset
                break
            if not chunk:
                break
            data += chunk
        return data

    with socket.create_connection((host, port), timeout=timeout) as s:
        if send:
            s.sendall(send)
        data = read(s, b"", n, time.monotonic() + timeout)
        if data and not good(data):
            data = read(s, data, 64, time.monotonic() + 0.3)
    return data


def probe_cluster(name: str, address: str, timeout: float) -> None:
    """Check that what listens at ``address`` speaks as the engine's cluster does,
    before any client is made: a Dask scheduler greets a connection at once with its
    handshake (an 8-byte length first); a Ray GCS or client server answers an HTTP/2
    preface with a SETTINGS frame. Anything else (an SSH banner, an HTTP server, a
    silent port) is :class:`EngineConnectError`: one line naming the address and what
    answered. TLS addresses (and Ray with RAY_USE_TLS) are not probed: their TLS
    handshake comes first."""
    import os
    import struct

    wait = min(timeout, GREETING_SECONDS)
    if name == "dask":
        if not address.startswith("tcp://"):
            return
        host, port = host_port(address, 8786)
        what = "a Dask scheduler"

        def good(d):  # its handshake's length, first
            return len(d) >= 8 and 0 < struct.unpack("<Q", d[:8])[0] < 2**26

        data = _greeting(host, port, wait, b"", 8, good)
    elif name == "ray":
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        client = address.startswith("ray://")
        host, port = host_port(address, 10001 if client else 6379)
        what = "a Ray client server" if client else "a Ray cluster (GCS)"

        def good(d):  # an HTTP/2 SETTINGS frame
            return len(d) >= 9 and d[3] == 0x04

        data = _greeting(host, port, wait, _H2_PREFACE, 9, good)
    else:
        return
    if good(data):
        return
    if not data:
        raise EngineConnectError(
            f"the server at {address} accepted the connection but said nothing in "
            f"{wait:g} s, which {what} does at once: check the address and port"
        )
    raise EngineConnectError(
        f"the server at {address} answered {_shown(data)}, not as {what} does: "
        "check the address and port (and that the cluster is not behind TLS)"
    )


class Engine(ABC):
    """Base class of the engines; see the module docstring for the contract."""

    name = "engine"
    #: the cluster's address (None: embedded, or no cluster)
    address: str | None = None
    #: seconds the cluster may have no worker before a wait gives up (ClusterLost)
    worker_wait: float = DEFAULT_WORKER_WAIT
    #: where :meth:`notice` sends its lines (None: the ``bigrate.engines`` logger)
    on_notice: Callable[[str], None] | None = None
    #: seconds without a result after which a wait says so (then at doubling times)
    stall_after: float = STALL_SECONDS
    #: asked at every idle look of a wait: True ends the wait with KeyboardInterrupt (a
    #: stop was asked for, e.g. SIGTERM while the round's workers were lost)
    should_stop: Callable[[], bool] | None = None

    @property
    def dashboard_link(self) -> str | None:
        return None

    @property
    def where(self) -> str:
        """The cluster, for messages: its address, or "embedded, 127.0.0.1"."""
        return self.address or "embedded, 127.0.0.1"

    def notice(self, message: str) -> None:
        """Tell the user something about the cluster (a stall, waiting for workers)."""
        message = f"{self.name}: {message}"
        if self.on_notice is not None:
            self.on_notice(message)
        else:
            logging.getLogger("bigrate.engines").warning(message)

    def check_cluster(self) -> None:  # noqa: B027 - engines without a cluster keep it
        """Raise :class:`ClusterLost` if the cluster is gone (no scheduler or head, or
        no worker for ``worker_wait`` seconds). Here: nothing to lose."""

    _empty_since: float | None = None

    def _note_workers(self, n: int) -> None:
        """Bookkeeping for :meth:`check_cluster`: the cluster has ``n`` workers now;
        without any, say so once and raise :class:`ClusterLost` once that has lasted
        ``worker_wait`` seconds."""
        if n > 0:
            self._empty_since = None
            return
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
            self.notice(
                f"no worker in the cluster at {self.where}; waiting up to "
                f"{self.worker_wait:g} s for one to join"
            )
        elif now - self._empty_since >= self.worker_wait:
            raise ClusterLost(
                f"the cluster at {self.where} has had no worker for "
                f"{self.worker_wait:g} s",
                self.address,
            )

    def watch(self, what: str) -> Watch:
        """A :class:`Watch` for one wait on this engine."""
        return Watch(self, what)

    def wait_for_workers(self, n: int = 1) -> int:
        """Wait until the cluster has at least ``n`` workers and return how many it
        has: while it has none, saying so once, and :class:`ClusterLost` after
        ``worker_wait`` seconds; with some but fewer than ``n``, going on with them
        after ``worker_wait`` seconds."""
        have = self.n_workers
        if have >= n:
            return have
        if have:
            self.notice(
                f"{have} of {n} workers at {self.where}; waiting up to "
                f"{self.worker_wait:g} s for the others"
            )
        deadline = time.monotonic() + self.worker_wait
        while True:
            if self.should_stop is not None and self.should_stop():
                raise KeyboardInterrupt
            self.check_cluster()  # says so, then gives up, while there are none
            have = self.n_workers
            if have >= n:
                return have
            if have and time.monotonic() >= deadline:
                self.notice(f"going on with {have} worker{'s' * (have != 1)}")
                return have
            time.sleep(POLL_SECONDS)

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
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        *,
        retries: int = 3,
        what: str = "tasks",
    ) -> Iterator[tuple[int, object]]:
        """Yield ``(index, result or TaskError)`` as the tasks finish (``what`` names
        them in the engine's notices)."""

    def warm_up(self, fn: Callable, *args) -> list:
        """Run ``fn(*args)`` once on every worker (imports, compiled kernels loaded
        from numba's cache), so that the first tasks of a short-task workload do not
        each pay it; returns the results. Here: once in this process (the local
        engine's worker)."""
        return [fn(*args)]

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
        what: str = "tasks",
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
        what: str = "tasks",
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
            run_batch, next_batch, in_flight=2 * workers, retries=retries, what=what
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
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        *,
        retries: int = 3,
        what: str = "tasks",
    ) -> list:
        """The results of ``fn(*args)`` for every tuple, in order; the first failed task
        raises its :class:`TaskError`."""
        out: list = [None] * len(args_list)
        for i, res in self.map(fn, args_list, retries=retries, what=what):
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


#: what :meth:`Pinned._collect` gives for a call whose worker or actor is gone
LOST = object()
#: what :meth:`Pinned._tree` gives when a task of the tree raised
FAILED = object()


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


def tree_leaf(fn: Callable, shared, args: tuple):
    """A task of :meth:`Pinned.allreduce`: ``fn(shared, *args)``."""
    return fn(shared, *args)


def same(x):
    """A copy of ``x`` where this task runs (a step of the broadcast down the tree)."""
    return x


class Reduced:
    """What :meth:`Pinned.allreduce` returns: the combined ``value`` (in this process)
    and, where the engine keeps it on a worker, a ``handle`` to it there, from which
    the next call's ``shared`` argument is broadcast down the tree instead of being
    sent from this process to every worker."""

    def __init__(self, value, handle=None, pool=None, generation: int = 0):
        self.value, self.handle = value, handle
        self.pool, self.generation = pool, generation

    def handle_in(self, pool) -> object | None:
        """The handle, if it is one of ``pool``'s slot set now (slots made again
        after a lost worker may have lost it: the value is sent instead)."""
        if self.handle is None or self.pool is not pool:
            return None
        return self.handle if self.generation == pool.generation else None


def shared_value(shared):
    """The value of an ``allreduce`` ``shared`` argument (a :class:`Reduced` or a
    plain object)."""
    return shared.value if isinstance(shared, Reduced) else shared


class Slot:
    """A worker slot of a pinned pool, made an actor by the engine: it runs functions
    in its worker's process (where that process's caches live); ``resolve`` as
    :attr:`Engine.resolve_in_batch`."""

    def __init__(self, resolve: Callable | None = None):
        self.resolve = resolve

    def run(self, fn: Callable, args: tuple) -> list[dict]:
        return run_batch(fn, [args], self.resolve)

    def apply(self, fn: Callable, *args):
        """``fn(*args)`` as it is (the engine resolved the handles among ``args``):
        a step of :meth:`Pinned.allreduce`'s tree."""
        return fn(*args)


class Pinned:
    """Tasks pinned to worker slots, for a loop that calls the same tasks again and
    again (a training round): ``run(fn, args_list, slots=)`` runs task i on slot
    ``slots[i]`` (default i) modulo the slots, each slot one worker process for the
    pool's life, so a worker's per-process cache (row groups decoded in an earlier
    round) serves the same slot's next task. On Dask and Ray a slot is an actor:
    calls go straight to its worker, without the scheduler's round trip a task pays
    (Dask: ~13 -> ~6 ms a round of two 378 KB states on this machine).

    No call waits without an end: every wait polls (``POLL_SECONDS``), and a call
    whose worker is lost (its actor gone, or its worker no longer in the cluster) is
    run again as an ordinary task (with ``retries``, counted in ``fallbacks``): a task
    is a pure function of its arguments, so the result is the same. The slots are made
    again on the workers there are at the next call, and again once the engine has more
    workers than slots while they are fewer than wanted (checked at most once a
    second); a worker lost while its slot is being made is left out. Where no actor can
    be made at first, the pool runs plain tasks (``kind``). An exception raised inside
    ``fn`` raises its :class:`TaskError`, as :meth:`Engine.run` does. This base class
    (the local engine's) runs :meth:`Engine.run`."""

    #: how calls reach the workers: "tasks" (ordinary engine tasks) or "actors"
    kind = "tasks"

    def __init__(self, engine: Engine):
        self.engine = engine
        self.fallbacks = 0
        #: counts the times the slots were let go of (a handle of an earlier
        #: generation may be on a worker that is gone)
        self.generation = 0
        self._slots: list | None = None  # one handle a slot, made on first use
        self._size: int | None = None  # how many are wanted (the workers at first)
        self._retry_at = 0.0
        self._mesh: dict | None = None  # the slots' connections (on="direct")
        self._mesh_calls = 0
        #: why the slots could not open the mesh (then direct calls combine in the
        #: driver for the pool's life), or None
        self._mesh_refused: str | None = None
        self._mesh_faults = 0  # direct calls in a row that failed, not by a task
        self._cluster_checked = 0.0  # when a direct call last looked at the cluster
        self._on_each_slot_error: str | None = None  # the last one's failure
        #: the last direct call's seconds on the root's slot: (the shared value
        #: passed down, the tasks, the partials passed up, and within the first the
        #: other slots' parts pickled and queued)
        self.mesh_seconds: dict[int, tuple] = {}
        #: direct calls that failed (a task's exception, or the connections) and
        #: ran again as tasks combined in the driver
        self.direct_failures = 0

    #: seconds the slots may take to open their ends of the mesh
    MESH_OPEN_SECONDS = DEFAULT_TIMEOUT
    #: direct calls in a row whose connections failed (their tasks did not) before
    #: the pool combines in the driver for good
    MESH_FAULTS = 2

    @property
    def mesh_refused(self) -> str | None:
        """Why direct calls combine in the driver for the pool's life, or None."""
        return self._mesh_refused

    @property
    def n_slots(self) -> int:
        """Slots the pool has now (0 before the first call, and with plain tasks)."""
        return len(self._slots or [])

    def _open(self) -> list:
        """One handle a worker slot, for the workers there are now, leaving out any
        lost while its slot is made (engines with actors); [] for plain tasks."""
        return []

    def _submit(self, slot, fn: Callable, args: tuple):
        """Start ``run_batch(fn, [args])`` on ``slot``; a handle for :meth:`_collect`."""
        raise NotImplementedError

    def _collect(self, handles: dict, timeout: float) -> dict:
        """Wait up to ``timeout`` seconds for any of ``handles`` (key -> handle) and
        return the finished ones: key -> ``run_batch``'s list, or :data:`LOST` where
        the call could not complete (its worker or actor is gone)."""
        raise NotImplementedError

    def _gone(self, slots: list) -> set:
        """The indices (into ``slots``) of slots whose worker has left the cluster."""
        return set()

    def _close_slots(self, slots: list, lost: bool) -> None:
        """Let go of ``slots`` (``lost``: a worker of theirs was lost)."""

    def run(
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        *,
        slots: Sequence[int] | None = None,
        retries: int = 3,
        what: str = "tasks",
    ) -> list:
        """The results of ``fn(*args)`` for every tuple, in order; task i on slot
        ``slots[i]`` (default i); the first failed task raises its TaskError.
        ``what`` names the call in the engine's notices (e.g. "round 12")."""
        if not self._ready():
            return self.engine.run(fn, args_list, retries=retries, what=what)
        slots = range(len(args_list)) if slots is None else slots
        mine = self._slots
        n = len(mine)
        pending: dict = {}  # task -> (slot index, handle)
        lost: list = []
        for i, (k, args) in enumerate(zip(slots, args_list, strict=True)):
            try:
                pending[i] = (k % n, self._submit(mine[k % n], fn, args))
            except ClusterLost:
                raise
            except Exception:  # noqa: BLE001 - a slot known lost: run it elsewhere
                lost.append(i)
        out: list = [None] * len(args_list)
        watch = self.engine.watch(what)
        while pending:
            got = self._collect({i: h for i, (_, h) in pending.items()}, POLL_SECONDS)
            for i, r in got.items():
                del pending[i]
                if r is LOST:
                    lost.append(i)
                    continue
                (r,) = r
                if _failed(r):
                    raise TaskError(r["error"], r["tb"])
                out[i] = r["value"]
            if got:
                watch.progress()
                continue
            gone = self._gone(mine)
            for i in [i for i, (s, _) in pending.items() if s in gone]:
                del pending[i]
                lost.append(i)
            if pending:
                watch.idle(len(pending))
        if lost:
            self.engine.check_cluster()  # the whole cluster, or only a worker?
            lost.sort()
            self.fallbacks += len(lost)
            self._drop(lost=True)  # made again on the workers there are, next call
            again = self.engine.run(
                fn, [args_list[i] for i in lost], retries=retries, what=what
            )
            for i, res in zip(lost, again, strict=True):
                out[i] = res
        return out

    def allreduce(
        self,
        fn: Callable,
        args_list: Sequence[tuple],
        combine: Callable,
        *,
        shared=None,
        slots: Sequence[int] | None = None,
        on: str = "workers",
        retries: int = 3,
        what: str = "tasks",
    ) -> Reduced:
        """``fn(shared, *args)`` for every tuple, task i on slot ``slots[i]`` (default
        i) as :meth:`run` places it, the results combined on the workers along the
        reduction tree (:func:`tree_children`: node i combines its own result with its
        children's partials, on its own slot, so each result crosses the network once
        and the driver receives only the root's). The combination order is fixed by
        the task indices, so the value is the same bits on every engine and whatever
        order the tasks finish in (:func:`tree_reduce` gives it in one process).

        ``shared``: the object every task receives first: a plain object (sent with
        each task) or the :class:`Reduced` of the previous call, whose value is then
        broadcast from the root's slot down the same tree (each slot sends it to at
        most two others). A call whose tree cannot finish (a worker lost, or an
        exception in a task) runs again as :meth:`Engine.run` tasks combined in this
        process: the same value (tasks are pure), ``fallbacks`` counting the tasks,
        an exception in ``fn`` raising its :class:`TaskError`. This base class (the
        local engine's): the tasks in order, combined here.

        ``on="driver"``: the same tree, combined in this process from the results
        :meth:`run` brings back (the same bits; the cheaper way where the engine's
        worker-to-worker hops cost more than the states' trips to the driver, which
        is so on Dask and Ray below tens of workers: ``bench_sgd.py scale``).

        ``on="direct"``: the same tree over TCP connections between the slots'
        processes (:mod:`bigrate.engines.mesh`), with no scheduler in any hop: one
        call a round, to the root's slot, which sends every other slot its part; the
        shared value sent once to the root's slot (or kept there from the previous
        call) and passed down, the partials passed up, the root's slot returning the
        value. The same bits again. Connections that fail while the tasks do not
        (``MESH_FAULTS`` calls in a row), or slots that cannot listen, leave the pool
        combining in the driver."""
        if on not in ("workers", "driver", "direct"):
            raise ValueError(f"on must be 'workers', 'direct' or 'driver', got {on!r}")
        if on == "driver" or not self._ready():
            run = functools.partial(self.run, slots=slots)
            return self._reduce_here(run, fn, args_list, combine, shared, retries, what)
        slots = list(range(len(args_list)) if slots is None else slots)
        if on == "direct" and self._mesh_refused is not None:
            run = functools.partial(self.run, slots=slots)  # no mesh here: the driver
            return self._reduce_here(run, fn, args_list, combine, shared, retries, what)
        if on == "direct":
            got = self._direct(fn, args_list, combine, shared, slots, what)
        else:
            got = self._tree(fn, args_list, combine, shared, slots, what)
        if isinstance(got, Reduced):
            self._mesh_faults = 0
            return got
        if got is LOST:
            self.engine.check_cluster()  # the whole cluster, or only a worker?
            self.fallbacks += len(args_list)
            self._drop(lost=True)  # made again on the workers there are, next call
        # LOST, or FAILED: run here, where an exception raises its TaskError
        run = self.engine.run
        out = self._reduce_here(run, fn, args_list, combine, shared, retries, what)
        if got is FAILED and on == "direct":
            # the tasks ran here without an error: the connections failed, not them
            self._mesh_faults += 1
            if self._mesh_faults >= self.MESH_FAULTS:
                self._mesh_refused = f"{self._mesh_faults} calls in a row failed"
                self.engine.notice(
                    f"{what}: the workers' direct connections failed "
                    f"{self._mesh_faults} times in a row; rounds are combined in the "
                    "driver from now on"
                )
        return out

    @staticmethod
    def _reduce_here(run, fn, args_list, combine, shared, retries, what) -> Reduced:
        """The tasks run by ``run`` (this pool's :meth:`run`, or the engine's plain
        tasks), their results combined along the tree in this process."""
        value = shared_value(shared)
        results = run(
            tree_leaf, [(fn, value, a) for a in args_list], retries=retries, what=what
        )
        return Reduced(tree_reduce(results, combine))

    def _tree(self, fn, args_list, combine, shared, slots, what):
        """The engine's tree (see :meth:`allreduce`) on the pool's slots: a
        :class:`Reduced`, :data:`LOST` (a slot's worker is gone) or :data:`FAILED` (a
        task raised). Here: none (the local engine has no slots, so :meth:`allreduce`
        never gets here)."""
        return LOST

    def _direct(self, fn, args_list, combine, shared, slots, what):
        """The tree over the pool's mesh (``on="direct"``): a :class:`Reduced`,
        :data:`LOST` (a slot's worker is gone) or :data:`FAILED` (a task raised, or
        the mesh broke: run again here)."""
        from bigrate.engines import mesh as M

        # the calls go worker to worker, and would go on without the scheduler or
        # head: whether the cluster is whole is looked at once a second at most
        now = time.monotonic()
        if now - self._cluster_checked >= POLL_SECONDS:
            self.engine.check_cluster()
            self._cluster_checked = now
        net = self._mesh_ready()
        if net is None:
            return LOST
        mine = self._slots
        where = [k % len(mine) for k in slots]
        self._mesh_calls += 1
        call = self._mesh_calls
        h = shared.handle if isinstance(shared, Reduced) else None
        relay = None  # (slot, call): the slot keeping the previous call's value
        if (
            isinstance(h, tuple)
            and h[:2] == ("mesh", net["token"])
            and h[3] < len(mine)
            and shared.handle_in(self) is not None
        ):
            # the previous call's value, on its root's slot: kept there, or sent on
            # from there to this call's root
            top = ("kept", h[2]) if h[3] == where[0] else ("from", h[3])
            relay = None if h[3] == where[0] else (h[3], h[2])
        else:
            top = ("value", shared_value(shared))
        used = set(where) | ({relay[0]} if relay is not None else set())
        # one call, to the root's slot: it sends the other slots their parts
        root = where[0]
        pending = {root: self._submit(mine[root], M.mesh_call, (
            net["token"], root, call, where, fn, combine, top,
            dict(enumerate(args_list)), relay))}  # fmt: skip
        value, bad, lost = None, False, False
        self.mesh_seconds = {}
        watch = self.engine.watch(what)
        while pending:
            got = self._collect(pending, POLL_SECONDS)
            if root in got:
                del pending[root]
                r = got[root]
                if r is LOST:
                    lost = True
                elif _failed(r[0]):
                    bad = r[0]["error"]
                else:
                    value = r[0]["value"]["value"]
                    self.mesh_seconds[root] = r[0]["value"]["seconds"]
                    watch.progress()
            elif any(j in self._gone(mine) for j in used):
                lost = True
                break
            else:
                watch.idle(len(used))
        if not (bad or lost):
            return Reduced(value, ("mesh", net["token"], call, root), self,
                           self.generation)  # fmt: skip
        # the slots' parts end at once, and the next call opens a new mesh
        M.mesh_abort([net["addresses"][j] for j in sorted(used)], net["token"])
        self._mesh = None
        if lost or any(j in self._gone(mine) for j in used):
            return LOST
        self.direct_failures += 1
        if self.direct_failures == 1:  # said once: the rounds go on, more slowly
            first = str(bad).splitlines()[0] if bad else "?"
            self.engine.notice(
                f"{what}: the workers' direct connections failed ({first}); the "
                "call runs again as tasks combined here"
            )
        return FAILED

    def _slot_host(self, slot) -> str | None:
        """The host a slot's worker listens on for the mesh (None: the worker says)."""
        return None

    def _mesh_ready(self) -> dict | None:
        """The pool's mesh on its slots now (opened at the first direct call, and
        again after a lost worker or a broken call): its token and every slot's
        listening address; None where a slot could not open its end."""
        from bigrate.engines import mesh as M

        net = self._mesh
        if net is not None and net["generation"] == self.generation:
            return net
        token, mine = M.new_token(), self._slots
        try:
            hosts = [self._slot_host(s) for s in mine]
        except Exception as e:  # noqa: BLE001 - workers without a TCP address
            hosts = None
            why = f"{type(e).__name__}: {e}"
        opened = None
        if hosts is not None:
            opened = self._on_each_slot(
                M.mesh_open, [(token, j, hosts[j]) for j in range(len(mine))]
            )
            why = self._on_each_slot_error or "a slot did not answer"
        if opened is None:
            if all(j not in self._gone(mine) for j in range(len(mine))):
                # the workers are there but cannot open their ends (no address to
                # listen on): the pool combines in the driver from now on
                self._mesh_refused = why
                self.engine.notice(
                    f"the workers cannot connect to each other directly ({why}); "
                    "rounds are combined in the driver"
                )
            return None
        addresses = [tuple(o["address"]) for o in opened]
        if self._on_each_slot(
            M.mesh_peers, [(token, j, addresses) for j in range(len(mine))]
        ) is None:  # fmt: skip
            return None
        self._mesh_calls = 0
        self._mesh = {"token": token, "addresses": addresses,
                      "generation": self.generation}  # fmt: skip
        return self._mesh

    def _on_each_slot(self, fn: Callable, args_list: list) -> list | None:
        """``fn(*args_list[j])`` on slot j, for every slot; None if any is lost, or
        fails, or takes longer than ``MESH_OPEN_SECONDS``."""
        mine = self._slots
        self._on_each_slot_error = None
        pending = {j: self._submit(mine[j], fn, a) for j, a in enumerate(args_list)}
        out: list = [None] * len(args_list)
        deadline = time.monotonic() + self.MESH_OPEN_SECONDS
        while pending and time.monotonic() < deadline:
            for j, r in self._collect(pending, POLL_SECONDS).items():
                del pending[j]
                if r is LOST or _failed(r[0]):
                    if r is not LOST:
                        self._on_each_slot_error = r[0]["error"].splitlines()[0]
                    return None
                out[j] = r[0]["value"]
            if any(j in self._gone(mine) for j in pending):
                return None
        return None if pending else out

    def _mesh_close(self) -> None:
        """Close the slots' ends of the mesh (best effort, briefly: a slot whose
        worker is gone has none left)."""
        from bigrate.engines import mesh as M

        net, self._mesh = self._mesh, None
        if net is None or not self._slots:
            return
        try:
            pending = {
                j: self._submit(s, M.mesh_close, (net["token"],))
                for j, s in enumerate(self._slots)
            }
            deadline = time.monotonic() + 2 * POLL_SECONDS
            while pending and time.monotonic() < deadline:
                for j in self._collect(pending, POLL_SECONDS / 4):
                    del pending[j]
        except Exception:  # noqa: BLE001 - a slot gone: its end went with it
            pass

    def _tree_plan(self, n: int):
        """For the tree over ``n`` tasks: each node's children, and the node whose
        copy of ``shared`` each task reads (its own for a node with children, which
        passes it on; its parent's for a leaf of the tree; the root's for the root)."""
        kids = [tree_children(i, n) for i in range(n)]
        src = [i if (kids[i] or i == 0) else tree_parent(i) for i in range(n)]
        return kids, src

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
        want = self.engine.n_workers
        try:
            self._slots = self._open()
        except ClusterLost:
            raise
        except Exception:  # noqa: BLE001 - no actors here: plain tasks
            self._slots = []
        if self._size is None:
            self._size = max(want, len(self._slots)) if self._slots else 0
            if not self._slots:
                self.kind = "tasks"
        self._retry_at = now + 1.0
        return self._slots

    def _drop(self, lost: bool = False) -> None:
        if not lost:
            self._mesh_close()
        self._mesh = None
        slots, self._slots = self._slots or [], None
        self.generation += 1
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
