"""The Ray engine: an embedded local Ray runtime bound to 127.0.0.1, or an existing
cluster (``host:6379`` or ``ray://host:10001``).

The embedded runtime is started with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's
single-node mode, in which the GCS, raylet and workers bind to 127.0.0.1 only (Ray's
default binds every interface). Shared data is put in the object store once
(:meth:`RayEngine.put`) and passed to every task by reference.
"""

from __future__ import annotations

import os

from bigrate.engines.base import (
    DEFAULT_TIMEOUT,
    Engine,
    Pinned,
    Slot,
    TaskError,
    submit_while_free,
    wait_reachable,
)


def _single_node_mode() -> None:
    """Ray's single-node mode: every Ray process binds and connects to 127.0.0.1.

    Ray reads the switch when it is first imported (ray_constants.ENABLE_RAY_CLUSTER), so
    it is set in the environment (inherited by the GCS, raylet and workers) and, if Ray
    was already imported here, in that module too."""
    import sys

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    consts = sys.modules.get("ray._private.ray_constants")
    if consts is not None:
        consts.ENABLE_RAY_CLUSTER = False


def resolve_ref(x):
    """On a Ray worker: the object behind a handle nested in a batched task's
    arguments (Ray resolves only a task's top-level arguments)."""
    import ray

    return ray.get(x) if isinstance(x, ray.ObjectRef) else x


def _warm_and_hold(fn, *args):
    """``fn(*args)``, then stay busy for a moment so that concurrent warm-up tasks land
    on distinct worker processes."""
    import time

    fn(*args)
    time.sleep(0.3)


class RayEngine(Engine):
    name = "ray"
    resolve_in_batch = staticmethod(resolve_ref)

    def __init__(
        self,
        address: str | None = None,
        *,
        n_workers: int | None = None,
        quiet: bool = True,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        if address:  # Ray's own connect retries for minutes on a dead address
            client = address.startswith("ray://")
            wait_reachable(address, 10001 if client else 6379, timeout,
                           "Ray client server" if client else "Ray cluster (GCS)")  # fmt: skip
        host = (address or "").split("://")[-1].rsplit(":", 1)[0]
        loopback = not address or (
            host in ("127.0.0.1", "localhost") and not address.startswith("ray://")
        )
        if loopback:
            _single_node_mode()
        if address:
            # clusters started by `ray start` (cluster/ray/*.sh) require token
            # authentication; the token is read from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH
            # or ~/.ray/auth_token. Set RAY_AUTH_MODE=disabled for a cluster without.
            os.environ.setdefault("RAY_AUTH_MODE", "token")
        import ray

        self._ray = ray
        self._actors = None  # the pinned pools' actors, made on first use
        self.started = False
        if ray.is_initialized():
            self.started = False
        elif address:
            # a loopback head runs in Ray's single-node mode; so must the driver, or it
            # looks for a raylet on the machine's network address and waits forever
            kw = {"_node_ip_address": "127.0.0.1"} if loopback else {}
            ray.init(
                address=address, log_to_driver=not quiet, configure_logging=False, **kw
            )
        else:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(
                num_cpus=n_workers or os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=not quiet,
                configure_logging=False,
                _node_ip_address="127.0.0.1",
            )
            self.started = True

    @property
    def dashboard_link(self):
        ctx = self._ray.get_runtime_context()
        url = getattr(ctx, "dashboard_url", None)
        return url or None

    @property
    def n_workers(self) -> int:
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def poll_events(self) -> list[dict]:
        now = {n["NodeID"]: n["NodeManagerAddress"] for n in self._ray.nodes()
               if n["Alive"]}  # fmt: skip
        before = getattr(self, "_known", None)
        self._known = now
        if before is None:
            return []
        return [{"event": "worker_lost", "worker": f"node {before[k]} ({k[:8]})"}
                for k in sorted(set(before) - set(now))] + [
            {"event": "worker_joined", "worker": f"node {now[k]} ({k[:8]})"}
            for k in sorted(set(now) - set(before))
        ]  # fmt: skip

    def node_addresses(self) -> list[str]:
        return sorted(n["NodeManagerAddress"] for n in self._ray.nodes() if n["Alive"])

    def put(self, obj):
        return self._ray.put(obj)

    def warm_up(self, fn, *args) -> None:
        """``fn(*args)`` as one task per CPU, all at once (Ray starts a worker process
        per concurrently running task, so each CPU's worker runs one)."""
        self.run(_warm_and_hold, [(fn, *args)] * self.n_workers)

    def map(self, fn, args_list, *, retries: int = 3):
        """Yield (index, result or TaskError) as tasks finish. A task whose worker dies
        is retried up to ``retries`` times by Ray; an exception inside it is not."""
        ray = self._ray
        remote = ray.remote(max_retries=retries, retry_exceptions=False)(fn)
        refs = [remote.remote(*args) for args in args_list]
        index = {r: i for i, r in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            try:
                yield index[ref], ray.get(ref)
            except Exception as e:  # noqa: BLE001 - recorded per task
                yield (
                    index[ref],
                    TaskError(f"{type(e).__name__}: {str(e)[:2000]}", str(e)),
                )

    def map_dynamic(self, fn, next_task, *, in_flight: int, retries: int = 3):
        """Yield (key, result or TaskError) as tasks finish, submitting the next ones
        from ``next_task()`` as slots free up (see the engine interface)."""
        ray = self._ray
        remote = ray.remote(max_retries=retries, retry_exceptions=False)(fn)
        pending: dict = {}

        def submit(args):
            return remote.remote(*args)

        submit_while_free(pending, in_flight, next_task, submit)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            key = pending.pop(ref)
            try:
                res = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - recorded per task
                res = TaskError(f"{type(e).__name__}: {str(e)[:2000]}", str(e))
            yield key, res
            submit_while_free(pending, in_flight, next_task, submit)

    def pinned(self) -> Pinned:
        """Worker slots as Ray actors, one per CPU of the cluster, spread over its
        nodes (see :class:`~bigrate.engines.base.Pinned`). The actors are this
        engine's, made at the first pinned call and kept until it closes, so a fit
        after the first finds its actors started, its kernels loaded and its row
        groups cached (starting an actor process costs ~2 s here); they reserve no
        CPU (``num_cpus=0``: a CPU is used only while a call runs), so the engine's
        other tasks are never held up by idle actors."""
        return _RayPinned(self)

    def _actor_slots(self) -> list:
        if self._actors is None:
            ray = self._ray
            actor = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")
            slots = [actor(Slot).remote(resolve_ref) for _ in range(self.n_workers)]
            self._actors = slots
            try:  # every actor up
                ray.get([s.run.remote(int, ()) for s in slots], timeout=DEFAULT_TIMEOUT)
            except Exception:
                self._kill_actor_slots()
                raise
        return self._actors

    def _kill_actor_slots(self) -> None:
        slots, self._actors = self._actors or [], None
        for s in slots:
            try:
                self._ray.kill(s)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass

    def close(self) -> None:
        self._kill_actor_slots()
        if self.started:
            self._ray.shutdown()
            self.started = False


class _RayPinned(Pinned):
    kind = "actors"

    def _open(self) -> list:
        return self.engine._actor_slots()

    def _submit(self, slot, fn, args):
        return slot.run.remote(fn, args)

    def _result(self, handle):
        return self.engine._ray.get(handle)

    def _close_slots(self, slots, lost) -> None:
        if lost:  # the others are made again with the lost one's replacement
            self.engine._kill_actor_slots()
