"""The Dask engine: an embedded LocalCluster on 127.0.0.1, or an existing scheduler.

Tasks are submitted as Dask futures (not pure: every call runs). A task whose worker
dies is recomputed on another worker by the scheduler (up to its
``distributed.scheduler.allowed-failures`` times, 3 by default); an exception raised
inside a task is not retried. Shared data goes to every
worker once (``put`` scatters it with ``broadcast=True``).
"""

from __future__ import annotations

import logging
import os
import traceback

from distributed.diagnostics.plugin import WorkerPlugin

from bigrate.engines.base import (
    DEFAULT_TIMEOUT,
    Engine,
    EngineConnectError,
    Pinned,
    Slot,
    TaskError,
    submit_while_free,
    wait_reachable,
)

_HEARTBEAT_LOST = "Failed to communicate with scheduler during heartbeat"


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
    ):
        self.cluster = None
        self._dashboard = dashboard
        if address:
            wait_reachable(address, 8786, timeout, "Dask scheduler")
        from dask.distributed import Client, LocalCluster

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
                self.cluster = LocalCluster(
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
        self._known = self._worker_ids()

    @property
    def dashboard_link(self) -> str | None:
        if not self._dashboard:
            return None
        try:
            return self.client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard is fine
            return None

    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info()["workers"])

    def _worker_ids(self) -> dict[str, str]:
        """Worker process id -> address (a worker restarted at the same address by its
        nanny is a new process with a new id)."""
        info = self.client.scheduler_info()["workers"]
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
        return self.client.scatter(obj, broadcast=True, hash=False)

    def warm_up(self, fn, *args) -> None:
        """``fn(*args)`` on every worker now connected (Client.run)."""
        self.client.run(fn, *args)

    def map(self, fn, args_list, *, retries: int = 3):
        """Yield (index, result or TaskError) as tasks finish. A task whose worker dies
        is recomputed on another worker; an exception inside it is not retried."""
        from dask.distributed import as_completed

        futures = [
            self.client.submit(fn, *args, pure=False, retries=0) for args in args_list
        ]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures):
            i = index[fut.key]
            try:
                yield i, fut.result()
            except Exception as e:  # noqa: BLE001 - recorded per task
                tb = "".join(traceback.format_exception(e))
                yield i, TaskError(f"{type(e).__name__}: {e}", tb)

    def map_dynamic(self, fn, next_task, *, in_flight: int, retries: int = 3):
        """Yield (key, result or TaskError) as tasks finish, submitting the next ones
        from ``next_task()`` as slots free up (see the engine interface)."""
        from dask.distributed import as_completed

        pending: dict = {}
        running = as_completed()

        def submit(args):
            fut = self.client.submit(fn, *args, pure=False, retries=0)
            running.add(fut)
            return fut.key

        submit_while_free(pending, in_flight, next_task, submit)
        for fut in running:
            key = pending.pop(fut.key)
            try:
                res = fut.result()
            except Exception as e:  # noqa: BLE001 - recorded per task
                tb = "".join(traceback.format_exception(e))
                res = TaskError(f"{type(e).__name__}: {e}", tb)
            yield key, res
            submit_while_free(pending, in_flight, next_task, submit)

    def pinned(self) -> Pinned:
        """Worker slots as Dask actors, one on each worker now connected (see
        :class:`~bigrate.engines.base.Pinned`)."""
        return _DaskPinned(self)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


class _DaskPinned(Pinned):
    kind = "actors"

    def _open(self) -> list:
        client = self.engine.client
        futures = [
            client.submit(Slot, None, actor=True, workers=[w], pure=False)
            for w in self.engine.workers()
        ]
        self._futures = futures  # the actors live while their futures do
        return [f.result() for f in futures]

    def _submit(self, slot, fn, args):
        return slot.run(fn, args)

    def _result(self, handle):
        return handle.result()

    def _close_slots(self, slots, lost) -> None:
        futures, self._futures = getattr(self, "_futures", []), []
        for f in futures:
            f.release()
