"""The Dask engine: an embedded LocalCluster on 127.0.0.1, or an existing scheduler.

Tasks are submitted as Dask futures (not pure: every call runs). A task whose worker
dies is recomputed on another worker by the scheduler (up to its
``distributed.scheduler.allowed-failures`` times, 3 by default); an exception raised
inside a task is not retried. Shared data goes to every
worker once (``put`` scatters it with ``broadcast=True``).

Every wait polls (see :mod:`bigrate.engines.base`): a scheduler that stops answering
(the client no longer connected after a few seconds, or a new scheduler at the same
address) is :class:`~bigrate.engines.base.ClusterLost`, as is a cluster without a
worker for ``worker_wait`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass

from distributed.diagnostics.plugin import WorkerPlugin

from bigrate.engines.base import (
    DEFAULT_TIMEOUT,
    DEFAULT_WORKER_WAIT,
    FAILED,
    LOST,
    POLL_SECONDS,
    ClusterLost,
    Engine,
    EngineConnectError,
    Pinned,
    Reduced,
    Slot,
    TaskError,
    probe_cluster,
    same,
    shared_value,
    submit_while_free,
    tree_leaf,
    wait_reachable,
)
from bigrate.engines.tree import combine_node, tree_parent

#: seconds a client may stay disconnected from its scheduler before it counts as lost
RECONNECT_SECONDS = 5.0

_HEARTBEAT_LOST = "Failed to communicate with scheduler during heartbeat"


@contextlib.contextmanager
def _workers_ignore_signals():
    """Worker processes spawned within ignore SIGINT and SIGTERM (a disposition kept
    through exec): a terminal's Ctrl-C and a batch system's SIGTERM to the process
    group reach the driver, which ends the work cleanly and then closes the cluster,
    and not the embedded workers, which would print tracebacks. They still end with
    the driver, however it ends: each exits when its parent's pipe closes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = [signal.getsignal(s) for s in sigs]
    for s in sigs:
        signal.signal(s, signal.SIG_IGN)
    try:
        yield
    finally:
        for s, h in zip(sigs, old, strict=True):
            signal.signal(s, h)


class _HeartbeatOneLine(logging.Filter):
    """A worker's failed heartbeat as its one-line message, without the traceback
    Dask attaches: when the embedded cluster shuts down (Ctrl-C included) the
    scheduler can close while a worker's heartbeat is in flight, and the worker
    processes write to the command's stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(_HEARTBEAT_LOST):
            record.exc_info = None
            record.exc_text = None
        return True


class _NoClosedCommTraceback(logging.Filter):
    """Dask logs a closed batched connection at INFO with its traceback
    (``distributed.batched``): in this process that is the client's link to a lost
    scheduler, which the job reports itself in one line (with the command that
    resumes), so the record is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Batched Comm Closed")


def _quiet_closed_comms() -> None:
    log = logging.getLogger("distributed.batched")
    if not any(isinstance(f, _NoClosedCommTraceback) for f in log.filters):
        log.addFilter(_NoClosedCommTraceback())


class _OneLineHeartbeats(WorkerPlugin):
    """Installs :class:`_HeartbeatOneLine` on every worker of the embedded cluster,
    also on workers a nanny restarts (never on the workers of a scheduler we only
    connect to: their logging is not ours)."""

    name = "bigrate-one-line-heartbeats"

    def setup(self, worker) -> None:
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, _HeartbeatOneLine) for f in log.filters):
            log.addFilter(_HeartbeatOneLine())


class DaskEngine(Engine):
    """A Dask client on an embedded LocalCluster (default) or an existing scheduler.

    Parameters
    ----------
    address : str, optional
        ``tcp://host:8786`` of a running scheduler; None starts a LocalCluster bound to
        127.0.0.1 with ``n_workers`` single-threaded worker processes.
    n_workers : int, optional
        Embedded cluster size (default: the number of CPUs, at most 8).
    memory_limit : str or int
        Per-worker memory limit of the embedded cluster (e.g. "1GiB"). Its workers do
        not pause at 80% of it (Dask's default): bigrate's tasks bound their own memory
        (shuffle buffers, a row-group cache of a quarter of the limit), and a worker
        paused with memory its allocator keeps never resumes, so a fit would wait
        forever (seen at 1 GiB on 5x RCV1-scale shards). A worker past 95% is still
        restarted by its nanny and its task run again. Its workers free memory as
        glibc does in any process (this one, the local engine's worker, included),
        not through Dask's MALLOC_TRIM_THRESHOLD_ of 64 KiB: with that, each ~40 ms
        sweep fit found its arrays' memory handed back to the system and
        page-faulted ~3,600 fresh pages (53 ms of CPU a fit instead of 46 ms).
    timeout : float
        Seconds to reach the scheduler at ``address`` before giving up with
        :class:`~bigrate.engines.base.EngineConnectError`.
    worker_wait : float
        Seconds the cluster may have no worker before a wait gives up with
        :class:`~bigrate.engines.base.ClusterLost`.
    dashboard : bool
        Serve the dashboard of the embedded cluster on 127.0.0.1 (random port).
    """

    name = "dask"

    def __init__(
        self,
        address: str | None = None,
        *,
        n_workers: int | None = None,
        memory_limit="auto",
        dashboard: bool = True,
        quiet: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
        worker_wait: float = DEFAULT_WORKER_WAIT,
    ):
        self.cluster = None
        self._dashboard = dashboard
        self.address = address or None
        self.worker_wait = float(worker_wait)
        self._empty_since = None
        if address:
            wait_reachable(address, 8786, timeout, "Dask scheduler")
            probe_cluster("dask", address, timeout)
        from dask.distributed import Client

        _quiet_closed_comms()
        if address:
            try:
                self.client = Client(address, timeout=f"{timeout}s")
            except (OSError, TimeoutError) as e:
                raise EngineConnectError(
                    f"the Dask scheduler at {address} did not answer within "
                    f"{timeout:g} s ({type(e).__name__}: {e}); check that it is a Dask "
                    "scheduler and that its TLS settings match"
                ) from None
        else:
            import dask

            n = n_workers or min(os.cpu_count() or 1, 8)
            # the nannies hand this configuration to the workers they (re)start;
            # glibc's own trimming instead of Dask's 64 KiB threshold (see above)
            with dask.config.set(
                {
                    "distributed.worker.memory.pause": False,
                    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                }
            ):
                with _workers_ignore_signals():
                    self.cluster = _LocalCluster(
                        host="127.0.0.1",
                        n_workers=n,
                        threads_per_worker=1,
                        processes=True,
                        memory_limit=memory_limit,
                        # a random loopback port either way: the scheduler's HTTP server
                        # (health, metrics) never takes 8787 from another cluster here
                        dashboard_address="127.0.0.1:0",
                        worker_dashboard_address="127.0.0.1:0",
                        scheduler_kwargs={"dashboard": bool(dashboard)},
                        silence_logs=logging.ERROR if quiet else logging.WARNING,
                    )
            self.client = Client(self.cluster)
            self.client.register_plugin(_OneLineHeartbeats())
        self._scheduler_id = self.client.scheduler_info().get("id")
        self._known = self._worker_ids()

    @property
    def dashboard_link(self) -> str | None:
        if not self._dashboard:
            return None
        try:
            return self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard is fine
            return None

    def check_cluster(self) -> None:
        """:class:`ClusterLost` if the scheduler stopped answering (the client not
        connected again within ``RECONNECT_SECONDS``) or was replaced by another one
        (whatever it held is gone), or the cluster has had no worker for
        ``worker_wait`` seconds."""
        info = self._identity()
        if info.get("id") != self._scheduler_id:
            raise ClusterLost(
                f"the Dask scheduler at {self.where} was restarted (the work it held "
                "is gone)",
                self.address,
            )
        self._note_workers(len(info["workers"]))

    def _identity(self) -> dict:
        """The scheduler's identity (its id, its workers), asked for now. A scheduler
        that does not answer within RECONNECT_SECONDS is lost: the client's own call
        (``scheduler_info``) would go on connecting to a dead address for the whole
        connect timeout (30 s) while the client has not yet seen the connection
        close, a race a busy machine loses. A client that is connecting again is
        given RECONNECT_SECONDS to do so first: a brief drop is not a lost cluster."""
        import asyncio

        c = self.client
        t = time.monotonic()
        while c.status == "connecting" and time.monotonic() - t < RECONNECT_SECONDS:
            time.sleep(0.2)
        if c.status != "running" or c.scheduler is None:
            raise ClusterLost(
                f"the Dask scheduler at {self.where} was lost", self.address
            )
        try:
            return c.sync(asyncio.wait_for, c.scheduler.identity(n_workers=-1),
                          RECONNECT_SECONDS)  # fmt: skip
        except (TimeoutError, OSError):
            raise ClusterLost(  # as check_cluster words it: the job's line goes on
                f"the Dask scheduler at {self.where} was lost", self.address
            ) from None

    def workers(self) -> list[str]:
        return sorted(self._identity()["workers"])

    def _worker_ids(self) -> dict[str, str]:
        """Worker process id -> address (a worker restarted at the same address by its
        nanny is a new process with a new id)."""
        info = self._identity()["workers"]
        return {w.get("id", addr): addr for addr, w in info.items()}

    def poll_events(self) -> list[dict]:
        now = self._worker_ids()
        before = getattr(self, "_known", None)
        self._known = now
        if before is None:
            return []
        lost = [{"event": "worker_lost", "worker": before[k]} for k in before
                if k not in now]  # fmt: skip
        joined = [{"event": "worker_joined", "worker": now[k]} for k in now
                  if k not in before]  # fmt: skip
        return lost + joined

    @property
    def n_workers(self) -> int:
        return len(self.workers())

    def worker_memory_limits(self) -> list[int | None]:
        info = self.client.scheduler_info()["workers"]
        return [w.get("memory_limit") or None for w in info.values()]

    def worker_pids(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def put(self, obj):
        """Send ``obj`` to every worker once; tasks receive it by reference."""
        return self.client.scatter(
            obj, broadcast=True, hash=False, timeout=self.worker_wait
        )

    def _submit(self, fn, *args, worker: str | None = None):
        kw = {"workers": [worker], "allow_other_workers": False} if worker else {}
        return self.client.submit(fn, *args, pure=False, retries=0, **kw)

    def _outcome(self, fut):
        """A finished future's result, or its failure as a TaskError (a future
        cancelled because the scheduler went away: :class:`ClusterLost`)."""
        try:
            return fut.result()
        except Exception as e:  # noqa: BLE001 - recorded per task
            if fut.status == "cancelled" or "Cancelled" in type(e).__name__:
                self.check_cluster()
            tb = "".join(traceback.format_exception(e))
            return TaskError(f"{type(e).__name__}: {e}", tb)

    def warm_up(self, fn, *args) -> list:
        """``fn(*args)`` once on every worker connected now, as a task held to that
        worker; a worker lost meanwhile is left out. Returns the results; a failing
        ``fn`` raises its :class:`TaskError`."""
        pending = {w: self._submit(fn, *args, worker=w) for w in self.workers()}
        watch = self.watch("warm-up")
        out = []
        while pending:
            done = _wait_some(list(pending.values()))
            for w in [w for w, f in pending.items() if f in done]:
                res = self._outcome(pending.pop(w))
                if isinstance(res, TaskError):
                    raise res
                out.append(res)
            if done:
                watch.progress()
                continue
            live = set(self.workers())
            for w in [w for w in pending if w not in live]:
                pending.pop(w).cancel()
            if pending:
                watch.idle(len(pending))
        return out

    def map(self, fn, args_list, *, retries: int = 3, what: str = "tasks"):
        """Yield (index, result or TaskError) as tasks finish. A task whose worker dies
        is recomputed on another worker; an exception inside it is not retried."""
        from dask.distributed import as_completed

        futures = [self._submit(fn, *args) for args in args_list]
        index = {f.key: i for i, f in enumerate(futures)}
        running = as_completed(futures)
        for fut in self._as_done(running, what):
            yield index[fut.key], self._outcome(fut)

    def map_dynamic(
        self, fn, next_task, *, in_flight: int, retries: int = 3, what: str = "tasks"
    ):
        """Yield (key, result or TaskError) as tasks finish, submitting the next ones
        from ``next_task()`` as slots free up (see the engine interface)."""
        from dask.distributed import as_completed

        pending: dict = {}
        running = as_completed()

        def submit(args):
            fut = self._submit(fn, *args)
            running.add(fut)
            return fut.key

        submit_while_free(pending, in_flight, next_task, submit)
        for fut in self._as_done(running, what):
            key = pending.pop(fut.key)
            yield key, self._outcome(fut)
            submit_while_free(pending, in_flight, next_task, submit)

    def _as_done(self, running, what: str):
        """The futures of the ``as_completed`` ``running`` as they finish, looking up
        every ``POLL_SECONDS`` (the cluster checked, a stall reported)."""
        watch = self.watch(what)
        looked = time.monotonic()
        while True:
            while not running.has_ready():
                if running.is_empty():
                    return
                with running.thread_condition:  # as as_completed's own iteration
                    running.thread_condition.wait(timeout=0.1)
                if (
                    time.monotonic() - looked >= POLL_SECONDS
                    and not running.has_ready()
                ):
                    watch.idle(running.count())
                    looked = time.monotonic()
            watch.progress()
            looked = time.monotonic()
            yield next(running)

    def pinned(self) -> Pinned:
        """Worker slots as Dask actors, one on each worker now connected (see
        :class:`~bigrate.engines.base.Pinned`)."""
        return _DaskPinned(self)

    def close(self) -> None:
        # a client whose scheduler is gone logs its cancelled reconnection as a
        # traceback while it closes: the loss was reported already, in one line
        lost = self.client.status != "running"
        logs = [
            logging.getLogger(n) for n in ("distributed.client", "distributed.utils")
        ]
        levels = [log.level for log in logs]
        if lost:
            for log in logs:
                log.setLevel(logging.CRITICAL)
        try:
            self.client.close(timeout=RECONNECT_SECONDS)
        finally:
            for log, level in zip(logs, levels, strict=True):
                log.setLevel(level)
        if self.cluster is not None:
            self.cluster.close()


def _LocalCluster(**kw):
    """An embedded LocalCluster whose nannies are left to restart lost workers."""
    from distributed import LocalCluster
    from distributed.deploy.cluster import Cluster

    class KeepNannies(LocalCluster):
        """A LocalCluster that leaves a nanny be when its worker is lost. Dask's
        SpecCluster closes the nanny of a worker whose name is still absent
        ``distributed.deploy.lost-worker-timeout`` (15 s) after a loss; the nanny
        restarts its worker within a second or two, so a second loss of the same
        worker at that moment (seen in CI: two killed-worker tests 15 s apart) closed
        the nanny, and the embedded cluster ran on one worker for good. A nanny that
        cannot restart its worker closes itself."""

        def _update_worker_status(self, op, msg):
            if op == "remove":  # the bookkeeping, without the closing timer
                Cluster._update_worker_status(self, op, msg)
            else:
                super()._update_worker_status(op, msg)

    return KeepNannies(**kw)


def _wait_some(futures: list, timeout: float = POLL_SECONDS) -> set:
    """The futures of ``futures`` finished within ``timeout`` seconds (at least one
    unless the time runs out)."""
    from dask.distributed import wait

    try:
        done, _ = wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
    except TimeoutError:
        return set()
    return set(done)


@dataclass
class _DaskSlot:
    actor: object  # the Slot actor's handle
    worker: str  # the address of the worker it lives on
    worker_id: str  # that worker process's id (a restarted worker has a new one)
    future: object  # the actor's future: the actor lives while it does


class _DaskPinned(Pinned):
    kind = "actors"

    #: seconds to wait for a worker's slot to be made before going on without it
    OPEN_SECONDS = DEFAULT_TIMEOUT

    def _open(self) -> list:
        """A Slot actor on each worker connected now, each held to its worker; a
        worker lost while its slot is being made (or slower than ``OPEN_SECONDS``) is
        left out."""
        eng = self.engine
        ids = eng._worker_ids()  # worker id -> address
        futures = {
            wid: eng.client.submit(Slot, None, actor=True, workers=[addr],
                                   allow_other_workers=False, pure=False)
            for wid, addr in ids.items()
        }  # fmt: skip
        watch = eng.watch("making the worker slots")
        deadline = time.monotonic() + self.OPEN_SECONDS
        while time.monotonic() < deadline:
            pending = [f for f in futures.values() if not f.done()]
            if not pending:
                break
            if _wait_some(pending):
                watch.progress()
                continue
            live = eng._worker_ids()
            for wid in [
                w for w, f in futures.items() if w not in live and not f.done()
            ]:
                futures.pop(wid).cancel()
            watch.idle(len(pending))
        slots = []
        for wid, f in futures.items():
            try:
                if f.status == "finished":
                    slots.append(_DaskSlot(f.result(timeout=POLL_SECONDS * 5), ids[wid],
                                           wid, f))  # fmt: skip
                    continue
            except Exception:  # noqa: BLE001 - its worker went away just now
                pass
            f.cancel()
        return slots

    def _submit(self, slot, fn, args):
        try:
            return slot.actor.run(fn, args)
        except RuntimeError as e:
            # "Worker holding Actor was lost", raised at the call when the worker died
            # just before: a finished handle that _collect reports as LOST, as it does
            # a call whose worker dies while it runs
            import concurrent.futures

            lost = concurrent.futures.Future()
            lost.set_exception(e)
            return lost

    def _slot_host(self, slot) -> str | None:
        from distributed.comm import get_address_host

        return get_address_host(slot.worker)

    def _tree(self, fn, args_list, combine, shared, slots, what):
        """The tree as Dask tasks held to the slots' workers (an actor's results go
        back to the client; a task's stay on its worker until a dependent fetches
        them, worker to worker): the shared value scattered once to the root's worker
        (or the previous call's root left where it is) and copied down the tree, the
        tasks, then each node's combination; the client gathers the root's only."""
        eng, mine = self.engine, self._slots
        n, where = len(args_list), [self._slots[k % len(self._slots)] for k in slots]
        kids, src = self._tree_plan(n)

        def on(slot, f, *a):
            return eng.client.submit(f, *a, workers=[slot.worker],
                                     allow_other_workers=False, pure=False, retries=0)  # fmt: skip

        if isinstance(shared, Reduced) and shared.handle_in(self) is not None:
            top = shared.handle
        else:
            top = eng.client.scatter(shared_value(shared), workers=[where[0].worker],
                                     hash=False)  # fmt: skip
        copy = [top] + [None] * (n - 1)
        for i in range(1, n):
            if kids[i]:
                copy[i] = on(where[i], same, copy[tree_parent(i)])
        leaf = [on(where[i], tree_leaf, fn, copy[src[i]], args_list[i])
                for i in range(n)]  # fmt: skip
        part = list(leaf)
        for i in range(n - 1, -1, -1):
            if kids[i]:
                part[i] = on(where[i], combine_node, combine, leaf[i],
                             *(part[c] for c in kids[i]))  # fmt: skip
        root = part[0]
        every = [f for f in copy[1:] + leaf + part if f is not None]
        watch = eng.watch(what)
        while not root.done():
            try:
                if _wait_some([root]):
                    break
            except Exception:  # noqa: BLE001 - cancelled (its inputs were lost)
                break
            gone = self._gone(mine)
            if any(mine.index(w) in gone for w in where):
                eng.client.cancel(every)
                return LOST
            watch.idle(sum(not f.done() for f in leaf))
        if root.status != "finished":
            gone = self._gone(mine)
            return LOST if any(mine.index(w) in gone for w in where) else FAILED
        try:
            value = root.result(timeout=POLL_SECONDS * 30)
        except Exception:  # noqa: BLE001 - lost on the way back
            return LOST
        return Reduced(value, root, self, self.generation)

    def _collect(self, handles: dict, timeout: float) -> dict:
        if not any(h.done() for h in handles.values()):
            try:  # the first one (all are needed; the others finish meanwhile)
                next(iter(handles.values())).result(timeout=timeout)
            except Exception:  # noqa: BLE001 - timed out, or failed: looked at below
                pass
        out = {}
        for i, h in handles.items():
            if h.done():
                try:
                    out[i] = h.result()
                except Exception:  # noqa: BLE001 - its worker is gone
                    out[i] = LOST
        return out

    def _gone(self, slots: list) -> set:
        """Slots whose worker process is gone: its id no longer in the cluster, or
        now at another address (a nanny restarts a worker under its name, on a new
        port where none was fixed: calls held to the old address would wait for
        ever)."""
        live = self.engine._worker_ids()
        return {j for j, s in enumerate(slots) if live.get(s.worker_id) != s.worker}

    def _close_slots(self, slots, lost) -> None:
        for s in slots:
            s.future.release()
