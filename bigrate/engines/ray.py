"""The Ray engine: an embedded local Ray runtime bound to 127.0.0.1, or an existing
cluster (``host:6379`` or ``ray://host:10001``).

The embedded runtime is started with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's
single-node mode, in which the GCS, raylet and workers bind to 127.0.0.1 only (Ray's
default binds every interface). Shared data is put in the object store once
(:meth:`RayEngine.put`) and passed to every task by reference.

Every wait polls (see :mod:`bigrate.engines.base`). A head that stops answering is
:class:`~bigrate.engines.base.ClusterLost` within seconds: its GCS port is looked at
whenever a wait brings nothing for ``POLL_SECONDS`` (Ray's own client would wait 60 s
and then end the whole process from its C++ core), and calls that need the GCS run
in a helper thread with a time limit. Ray has no view of its worker processes a
driver can poll cheaply: the engine records a lost worker where it sees one, an actor
of the pinned pool that died (``worker_lost``, its process id) and its replacement
(``worker_joined``), besides nodes that leave or join.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from bigrate.engines.base import (
    DEFAULT_TIMEOUT,
    DEFAULT_WORKER_WAIT,
    FAILED,
    LOST,
    POLL_SECONDS,
    ClusterLost,
    Engine,
    Pinned,
    Reduced,
    Slot,
    TaskError,
    host_port,
    probe_cluster,
    same,
    shared_value,
    submit_while_free,
    tree_leaf,
    wait_reachable,
)
from bigrate.engines.tree import combine_node, tree_parent


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


def _answers(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _warm_and_hold(fn, *args):
    """``fn(*args)``, then stay busy for a moment so that concurrent warm-up tasks land
    on distinct worker processes."""
    import time

    out = fn(*args)
    time.sleep(0.3)
    return out


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
        worker_wait: float = DEFAULT_WORKER_WAIT,
    ):
        self.address = address or None
        self.worker_wait = float(worker_wait)
        self._lost: ClusterLost | None = None
        self._observed: list[dict] = []  # worker events the engine saw itself
        if address:  # Ray's own connect retries for minutes on a dead address
            client = address.startswith("ray://")
            wait_reachable(address, 10001 if client else 6379, timeout,
                           "Ray client server" if client else "Ray cluster (GCS)")  # fmt: skip
            probe_cluster("ray", address, timeout)
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
        self._reaper = None
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
            # what a SIGKILLed driver would leave behind, stopped: the reaper starts
            # first, so that what it sees appear from now on is this runtime
            from bigrate.engines import reaper

            self._reaper = reaper.start(os.getpid())
            try:
                ray.init(
                    num_cpus=n_workers or os.cpu_count() or 1,
                    include_dashboard=False,
                    log_to_driver=not quiet,
                    configure_logging=False,
                    _node_ip_address="127.0.0.1",
                )
            except BaseException:
                reaper.stop(self._reaper)
                raise
            self.started = True

        # what tells whether the head is there: its GCS, or the client server
        if address and address.startswith("ray://"):
            self._head = host_port(address, 10001)
        else:
            self._head = host_port(ray.get_runtime_context().gcs_address, 6379)

    def _head_lost(self) -> ClusterLost:
        self._lost = self._lost or ClusterLost(
            f"the Ray head at {self.where} was lost", self.address
        )
        return self._lost

    def check_cluster(self) -> None:
        """:class:`ClusterLost` if the head's GCS (or client server) does not accept a
        connection twice in a row, or the cluster has had no CPU for
        ``worker_wait`` seconds."""
        if self._lost is not None:
            raise self._lost
        if not _answers(*self._head, 1.0):
            time.sleep(0.5)
            if not _answers(*self._head, 2.0):
                raise self._head_lost()
        self._note_workers(self._cpus())

    def _gcs(self, fn, *args):
        """``fn(*args)`` for a call that needs the head: in a helper thread, so that a
        head gone meanwhile is :class:`ClusterLost` within seconds (the thread is left
        to Ray) instead of a wait without an end."""
        if self._lost is not None:
            raise self._lost
        box: dict = {}

        def call():
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e

        t = threading.Thread(target=call, daemon=True, name="bigrate-ray-gcs")
        t.start()
        t.join(POLL_SECONDS)
        while t.is_alive():  # slow: is the head still there?
            if not _answers(*self._head, 2.0):
                raise self._head_lost()
            t.join(POLL_SECONDS)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _cpus(self) -> int:
        return int(self._gcs(self._ray.cluster_resources).get("CPU", 0))

    @property
    def dashboard_link(self):
        ctx = self._ray.get_runtime_context()
        url = getattr(ctx, "dashboard_url", None)
        return url or None

    @property
    def n_workers(self) -> int:
        """The cluster's CPUs (one task each); 0 while it has none."""
        return self._cpus()

    def poll_events(self) -> list[dict]:
        now = {n["NodeID"]: n["NodeManagerAddress"] for n in self._gcs(self._ray.nodes)
               if n["Alive"]}  # fmt: skip
        before = getattr(self, "_known", None)
        self._known = now
        seen, self._observed = self._observed, []
        if before is None:
            return seen
        return seen + [
            {"event": "worker_lost", "worker": f"node {before[k]} ({k[:8]})"}
            for k in sorted(set(before) - set(now))
        ] + [
            {"event": "worker_joined", "worker": f"node {now[k]} ({k[:8]})"}
            for k in sorted(set(now) - set(before))
        ]  # fmt: skip

    def node_addresses(self) -> list[str]:
        return sorted(
            n["NodeManagerAddress"] for n in self._gcs(self._ray.nodes) if n["Alive"]
        )

    def put(self, obj):
        return self._ray.put(obj)

    def warm_up(self, fn, *args) -> list:
        """``fn(*args)`` as one task per CPU, all at once (Ray starts a worker process
        per concurrently running task, so each CPU's worker runs one); the results."""
        return self.run(_warm_and_hold, [(fn, *args)] * max(1, self.n_workers),
                        what="warm-up")  # fmt: skip

    def _ready_refs(self, refs: list, what: str):
        """The refs of ``refs`` as they finish, looking up every ``POLL_SECONDS``."""
        ray = self._ray
        watch = self.watch(what)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
            if not done:
                watch.idle(len(pending))
                continue
            watch.progress()
            yield done[0]

    def _outcome(self, ref):
        try:
            return self._ray.get(ref)
        except Exception as e:  # noqa: BLE001 - recorded per task
            if self._lost is None and not _answers(*self._head, 2.0):
                raise self._head_lost() from None
            return TaskError(f"{type(e).__name__}: {str(e)[:2000]}", str(e))

    def map(self, fn, args_list, *, retries: int = 3, what: str = "tasks"):
        """Yield (index, result or TaskError) as tasks finish. A task whose worker dies
        is retried up to ``retries`` times by Ray; an exception inside it is not."""
        remote = self._ray.remote(max_retries=retries, retry_exceptions=False)(fn)
        refs = [remote.remote(*args) for args in args_list]
        index = {r: i for i, r in enumerate(refs)}
        for ref in self._ready_refs(refs, what):
            yield index[ref], self._outcome(ref)

    def map_dynamic(
        self, fn, next_task, *, in_flight: int, retries: int = 3, what: str = "tasks"
    ):
        """Yield (key, result or TaskError) as tasks finish, submitting the next ones
        from ``next_task()`` as slots free up (see the engine interface)."""
        ray = self._ray
        remote = ray.remote(max_retries=retries, retry_exceptions=False)(fn)
        pending: dict = {}

        def submit(args):
            return remote.remote(*args)

        submit_while_free(pending, in_flight, next_task, submit)
        watch = self.watch(what)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
            if not done:
                watch.idle(len(pending))
                continue
            watch.progress()
            ref = done[0]
            key = pending.pop(ref)
            yield key, self._outcome(ref)
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

    #: seconds to wait for the pinned pool's actors to start before going on without
    OPEN_SECONDS = DEFAULT_TIMEOUT

    def _actor_slots(self) -> list:
        """The pinned pool's actors, one per CPU, as (actor, its process id): made at
        the first call, and topped up to the CPUs there are after one died. An actor
        that dies or does not start within ``OPEN_SECONDS`` is left out; an actor made
        after the first ones is recorded as ``worker_joined``."""
        first = self._actors is None
        have = [] if first else self._actors
        missing = self.n_workers - len(have)
        if missing <= 0:
            return have
        ray = self._ray
        actor = ray.remote(num_cpus=0, max_restarts=0, scheduling_strategy="SPREAD")
        made = [actor(Slot).remote(resolve_ref) for _ in range(missing)]
        pids = {s.run.remote(os.getpid, ()): s for s in made}
        watch = self.watch("making the worker slots")
        deadline = time.monotonic() + self.OPEN_SECONDS
        up = []
        while pids and time.monotonic() < deadline:
            done, _ = ray.wait(list(pids), num_returns=len(pids), timeout=POLL_SECONDS)
            for ref in done:
                s = pids.pop(ref)
                try:
                    (r,) = ray.get(ref)
                    up.append((s, r["value"]))
                except Exception:  # noqa: BLE001 - died starting: left out
                    self._kill(s)
                    self._observed.append(
                        {
                            "event": "worker_lost",
                            "worker": "an actor process (starting)",
                        }
                    )
            if pids:
                watch.idle(len(pids))
        for s in pids.values():
            self._kill(s)
        if not first:
            self._observed += [
                {"event": "worker_joined", "worker": f"actor process {pid}"}
                for _, pid in up
            ]
        self._actors = have + up
        return self._actors

    def _drop_actors(self, pids: set) -> None:
        """Let go of the pool's actors whose processes ``pids`` died (each a
        ``worker_lost`` event)."""
        for s, pid in self._actors or []:
            if pid in pids:
                self._kill(s)
                self._observed.append(
                    {"event": "worker_lost", "worker": f"actor process {pid}"}
                )
        self._actors = [(s, p) for s, p in self._actors or [] if p not in pids]

    def _kill(self, actor) -> None:
        try:
            self._ray.kill(actor)
        except Exception:  # noqa: BLE001 - an actor already gone
            pass

    def _kill_actor_slots(self) -> None:
        slots, self._actors = self._actors or [], None
        if self._lost is None:
            for s, _ in slots:
                self._kill(s)

    def close(self) -> None:
        self._kill_actor_slots()
        if self.started:
            self._ray.shutdown()
            self.started = False
        if getattr(self, "_reaper", None) is not None:
            from bigrate.engines import reaper

            reaper.stop(self._reaper)
            self._reaper = None


class _RayPinned(Pinned):
    kind = "actors"

    def _open(self) -> list:
        return self.engine._actor_slots()

    def _submit(self, slot, fn, args):
        return slot[0].run.remote(fn, args)

    def _tree(self, fn, args_list, combine, shared, slots, what):
        """The tree as calls to the slots' actors with the handles of other calls'
        results as arguments (Ray moves a result from the object store of its actor's
        node to the caller's, never through this process): the shared value put once
        (or the previous call's root, left where it is) and copied down the tree, the
        tasks, then each node's combination; only the root's result is fetched. An
        actor executes its calls in the order they were made, and every call here
        waits only on calls made before it, so no actor waits on itself."""
        ray, mine = self.engine._ray, self._slots
        n = len(args_list)
        where = [mine[k % len(mine)][0] for k in slots]
        kids, src = self._tree_plan(n)
        if isinstance(shared, Reduced) and shared.handle_in(self) is not None:
            top = shared.handle
        else:
            top = ray.put(shared_value(shared))
        copy = [top] + [None] * (n - 1)
        for i in range(1, n):
            if kids[i]:
                copy[i] = where[i].apply.remote(same, copy[tree_parent(i)])
        leaf = [where[i].apply.remote(tree_leaf, fn, copy[src[i]], args_list[i])
                for i in range(n)]  # fmt: skip
        part = list(leaf)
        for i in range(n - 1, -1, -1):
            if kids[i]:
                part[i] = where[i].apply.remote(combine_node, combine, leaf[i],
                                                *(part[c] for c in kids[i]))  # fmt: skip
        root = part[0]
        watch = self.engine.watch(what)
        while True:
            done, _ = ray.wait([root], timeout=POLL_SECONDS, fetch_local=False)
            if done:
                break
            watch.idle(n)
        try:
            value = ray.get(root)
        except Exception:  # noqa: BLE001 - an actor died, or a task raised
            used = [s for s in mine if any(s[0] is w for w in where)]
            return FAILED if all(self._alive(used)) else LOST
        return Reduced(value, root, self, self.generation)

    def _collect(self, handles: dict, timeout: float) -> dict:
        ray = self.engine._ray
        refs = {r: i for i, r in handles.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        out = {}
        for ref in done:
            try:
                out[refs[ref]] = ray.get(ref)
            except Exception:  # noqa: BLE001 - the actor died with the call
                out[refs[ref]] = LOST
        return out

    def _close_slots(self, slots, lost) -> None:
        """The actors are the engine's and outlive the pool; after a lost call, those
        that no longer answer are let go of (the next call makes new ones)."""
        if lost and self.engine._lost is None:
            alive = self._alive(slots)
            self.engine._drop_actors(
                {pid for (_, pid), ok in zip(slots, alive, strict=True) if not ok}
            )

    def _alive(self, slots) -> list[bool]:
        """Which actors of ``slots`` still answer (within ``POLL_SECONDS``)."""
        ray = self.engine._ray
        refs = [s.run.remote(int, ()) for s, _ in slots]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_SECONDS * 5)
        ok = []
        for r in refs:
            try:
                ok.append(r in done and ray.get(r) is not None)
            except Exception:  # noqa: BLE001 - dead
                ok.append(False)
        return ok
