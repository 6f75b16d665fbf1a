"""Direct connections between the worker slots of a pinned pool, for
:meth:`~bigrate.engines.base.Pinned.allreduce` with ``on="direct"``: the tree's values go
from worker to worker over TCP, with no scheduler, head or driver in between.

Each slot's process holds a :class:`Mesh` per pool: a listening socket on its worker's
host and the connections it made or accepted, one per peer slot, made on first use and
kept for the pool's life. A call runs :func:`mesh_call` on every slot at once (one call
a slot, however many of the tree's nodes it holds); its three phases keep the tree's
fixed order, so the combined value is the same bits as :func:`~bigrate.engines.base.
tree_reduce` in one process:

1. the shared value down the tree, nodes in ascending order (a node's parent is lower);
2. each node's task;
3. the partial results up the tree, nodes in descending order (children are higher).

No slot can wait on a slot that waits on it: a node waits in phase 1 only on lower
nodes, which got theirs first, and in phase 3 only on higher nodes, and all of a
slot's phase-1 messages are sent before its phase 2. Sends are queued and written
while the slot waits for anything (one ``select`` over all its sockets), so two slots
sending each other large states never block each other.

A call that cannot finish ends every slot's call, never a wait without an end: a
task's exception or a peer's closed connection closes all of the slot's connections,
so its peers see theirs close in turn; the driver sends an abort to each slot's
listener when it finds a worker gone; and the connections' TCP keepalive notices a
peer host that vanished. The driver then runs the call again in another way (the pool
opens a new mesh at its next call).

Values travel as (cloud)pickle protocol 5 frames, as the engines' own transports send
functions and values, between the pool's own processes only (the same trust as the
engine's own transport); nothing here is written to disk.
"""

from __future__ import annotations

import os
import pickle
import queue
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

import cloudpickle

from bigrate.engines.tree import combine_node, tree_children, tree_parent

_HELLO = struct.Struct("!4s32si")  # magic, the mesh's token, the sender's slot
_MAGIC = b"BRM1"
_ABORT = -1  # a hello from the driver: end the call
_WORK = -2  # a frame's source and destination node for a slot's part of a call
_COMMON = -3  # ... and destination for what a call's parts have in common
#: call, source node, destination node, the body's bytes, the arrays out of band (the
#: body: their sizes, the pickle, their bytes)
_FRAME = struct.Struct("!qiiqi")
_NOTHING = object()

#: a mesh unused this long is closed when another opens in its process (a pool whose
#: driver ended without closing it)
IDLE_SECONDS = 3600.0
#: this process's meshes: (token, slot) -> Mesh
_MESHES: dict[tuple[str, int], Mesh] = {}


class MeshError(RuntimeError):
    """The call could not finish on the mesh (a peer gone, an abort): not the task's
    fault; the driver runs it again another way."""


def new_token() -> str:
    return secrets.token_hex(16)


def _keepalive(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt, v in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), v)


def _own_host() -> str:
    """The address this worker's peers reach it at, where the driver could not say:
    Ray's node address in a Ray worker, else the host name's."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostbyname(socket.gethostname())


class Mesh:
    """A slot's end of the pool's connections (see the module docstring), served by
    a thread of its own: every read, write and task of a call happens there, so the
    root slot's actor call only hands it the call and waits, and the other slots
    start when the root's work frame reaches them."""

    def __init__(self, token: str, slot: int, host: str):
        self.token, self.slot = token, slot
        self.listener = socket.create_server((host, 0), backlog=128)
        self.listener.setblocking(False)
        self.address = (host, self.listener.getsockname()[1])
        self.peers: list[tuple[str, int]] = []
        self.out: dict[int, socket.socket] = {}  # peer slot -> the connection to it
        self.socks: dict[socket.socket, dict] = {}  # every connection: its buffers
        self.inbox: dict[tuple[int, int, int], object] = {}
        self.call = -1
        self.kept: dict[int, object] = {}  # call -> the root's value (one kept)
        self.broken: str | None = None
        self.memo: tuple = (_NOTHING, [])  # (the object, its frame's parts)
        self.used = time.monotonic()
        # calls handed over by this process's actor calls, and their outcomes
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: dict[int, tuple] = {}
        self.cond = threading.Condition()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closing = False
        self.thread = threading.Thread(
            target=self._serve, name=f"bigrate-mesh-{slot}", daemon=True
        )
        self.thread.start()

    # -- the thread ------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while True:
                job = self._next()
                self._run(job)
        except BaseException as e:  # noqa: BLE001 - every end is reported
            self._end(f"{type(e).__name__}: {e}")

    def _next(self) -> dict:
        """The next call: one handed over here (this is its root's slot) or a work
        frame from the root's slot."""
        got: list = []

        def ready() -> bool:
            if not self.jobs.empty():
                got.append(self.jobs.get())
                return True
            for key in self.inbox:
                if key[1:] == (_WORK, _WORK) and key[0] > self.call:
                    got.append(self.inbox.pop(key))
                    return True
            return False

        self._pump(ready)
        return got[0]

    def _end(self, why: str) -> None:
        """Close every connection (the peers' waits on this slot end) and tell a
        waiting actor call why."""
        self.broken = why
        for s in [*self.socks, self.listener, self._wake_r, self._wake_w]:
            try:
                s.close()
            except OSError:
                pass
        self.socks.clear()
        self.out.clear()
        self.inbox.clear()
        with self.cond:
            self.cond.notify_all()

    def wait(self, call: int) -> tuple:
        """(value, seconds) of call ``call`` handed over here; MeshError if the
        mesh broke first."""
        with self.cond:
            while call not in self.done:
                if self.broken:
                    raise MeshError(f"slot {self.slot}: {self.broken}")
                self.cond.wait(1.0)
            return self.done.pop(call)

    def hand_over(self, job: dict) -> None:
        self.jobs.put(job)
        self._wake()

    def request_close(self) -> None:
        """End the thread (from any thread: the thread itself closes the sockets)."""
        self._closing = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # closed already

    # -- connections -------------------------------------------------------------
    def _add(self, s: socket.socket, peer: int) -> None:
        s.setblocking(False)
        self.socks[s] = {"peer": peer, "head": bytearray(), "body": None, "off": 0,
                         "wq": []}  # fmt: skip
        self.out.setdefault(peer, s)

    def _conn(self, peer: int) -> socket.socket:
        s = self.out.get(peer)
        if s is None:
            host, port = self.peers[peer]
            s = socket.create_connection((host, port), timeout=30)
            _keepalive(s)
            s.sendall(_HELLO.pack(_MAGIC, self.token.encode(), self.slot))
            self._add(s, peer)
        return s

    def _accept(self) -> None:
        try:
            s, _ = self.listener.accept()
        except BlockingIOError:
            return
        s.settimeout(30)
        try:
            data = b""
            while len(data) < _HELLO.size:
                more = s.recv(_HELLO.size - len(data))
                if not more:
                    raise OSError("closed before its hello")
                data += more
            magic, token, peer = _HELLO.unpack(data)
        except OSError:
            s.close()
            return
        if magic != _MAGIC or token.decode() != self.token:
            s.close()  # not one of this mesh's peers
            return
        if peer == _ABORT:
            s.close()
            raise MeshError(f"slot {self.slot}: the driver ended the call")
        _keepalive(s)
        self._add(s, peer)

    # -- frames ------------------------------------------------------------------
    def send(self, peer: int, src: int, dst: int, obj, call: int | None = None) -> None:
        """Queue ``obj`` for node ``dst`` on slot ``peer`` (written while waiting).
        Arrays travel out of band (pickle protocol 5): their bytes are written from
        where they lie and read into one buffer, where the arrays then live, with no
        copy into or out of the pickle."""
        if self.memo[0] is not obj:  # a value sent to two children is pickled once
            bufs: list = []
            data = cloudpickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
            raw = [b.raw() for b in bufs]
            sizes = struct.pack(f"!{len(raw)}q", *(r.nbytes for r in raw))
            self.memo = (obj, [memoryview(sizes), memoryview(data), *raw])
        parts = self.memo[1]
        s = self._conn(peer)
        body = sum(p.nbytes for p in parts)
        head = _FRAME.pack(
            self.call if call is None else call, src, dst, body, len(parts) - 2
        )
        self.socks[s]["wq"] += [memoryview(head), *parts]

    def recv(self, src: int, dst: int):
        """Node ``src``'s value for node ``dst`` in this call (waiting for it)."""
        key = (self.call, src, dst)
        self._pump(lambda: key in self.inbox)
        return self.inbox.pop(key)

    def flush(self) -> None:
        """Wait until every queued frame is written."""
        self._pump(lambda: not any(b["wq"] for b in self.socks.values()))

    def _read(self, s: socket.socket) -> None:
        """Read what ``s`` has (a frame's header, then its body straight into a
        buffer of its size), and file the frames it completes."""
        b = self.socks[s]
        for _ in range(64):  # at most this many reads before the writes get a turn
            head, body = b["head"], b["body"]
            try:
                if body is None:
                    data = s.recv(_FRAME.size - len(head))
                    got = len(data)
                    head += data
                else:
                    got = s.recv_into(memoryview(body)[b["off"] :])
                    b["off"] += got
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                raise MeshError(f"slot {self.slot}: slot {b['peer']}: {e}") from None
            if not got:
                raise MeshError(
                    f"slot {self.slot}: slot {b['peer']} closed its connection"
                )
            if body is None and len(head) == _FRAME.size:
                b["body"], b["off"] = bytearray(_FRAME.unpack(head)[3]), 0
            body = b["body"]
            if body is not None and b["off"] == len(body):
                self._file(_FRAME.unpack(head), body)
                b["head"], b["body"] = bytearray(), None

    def _file(self, head: tuple, body: bytearray) -> None:
        call, src, dst, _, n_bufs = head
        if call < self.call:
            return  # an earlier, ended call's frame: dropped
        view = memoryview(body)
        sizes = struct.unpack_from(f"!{n_bufs}q", body)
        end = len(body) - sum(sizes)
        bufs, at = [], end
        for n in sizes:
            bufs.append(view[at : at + n])
            at += n
        self.inbox[(call, src, dst)] = pickle.loads(
            view[8 * n_bufs : end], buffers=bufs
        )

    def _write(self, s: socket.socket) -> None:
        q = self.socks[s]["wq"]
        while q:
            try:
                sent = s.sendmsg(q[:64])  # the queued parts, gathered
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                peer = self.socks[s]["peer"]
                raise MeshError(f"slot {self.slot}: slot {peer}: {e}") from None
            while sent and q:
                n = q[0].nbytes
                if sent >= n:
                    sent -= n
                    q.pop(0)
                else:
                    q[0] = q[0][sent:]
                    sent = 0

    def _pump(self, done: Callable[[], bool]) -> None:
        while not done():
            if self._closing:
                raise MeshError(f"slot {self.slot}: closed")
            socks = list(self.socks)
            writing = [s for s in socks if self.socks[s]["wq"]]
            r, w, _ = select.select(
                [self.listener, self._wake_r, *socks], writing, [], 1.0
            )
            for s in w:
                self._write(s)
            for s in r:
                if s is self.listener:
                    self._accept()
                elif s is self._wake_r:
                    try:
                        s.recv(4096)
                    except BlockingIOError:
                        pass
                else:
                    self._read(s)

    # -- a call ------------------------------------------------------------------
    def _run(self, job: dict) -> None:
        """This slot's part of one call (see :func:`mesh_call`)."""
        if "where" not in job:  # a part sent by the root's slot: with the common
            job = {**self.inbox.pop((job["call"], _WORK, _COMMON)), **job}
        call, where, fn, combine = job["call"], job["where"], job["fn"], job["combine"]
        slot, n = self.slot, len(where)
        self.call, self.used, self.memo = call, time.monotonic(), (_NOTHING, [])
        self.inbox = {k: v for k, v in self.inbox.items() if k[0] >= call}
        t0 = time.perf_counter()
        work = job.get("work")
        if work is not None:  # the root's slot: every other slot's part, flat
            common = {k: job[k] for k in ("where", "fn", "combine")}
            for j in work:  # pickled once for all (and before each part)
                self.send(j, _WORK, _COMMON, common)
            for j, part in work.items():
                self.send(j, _WORK, _WORK, part)
        t_work = time.perf_counter() - t0
        nodes = job["nodes"]
        if job.get("relay") is not None:  # the previous root's value, to this root
            self.send(where[0], -1, 0, self.kept[job["relay"]])
        mine = sorted(nodes)
        val = {}
        for i in mine:  # 1: the shared value down
            if i == 0:
                kind, x = job["shared"]
                val[i] = (
                    x if kind == "value"
                    else self.kept[x] if kind == "kept"
                    else self.recv(-1, 0)
                )  # fmt: skip
            else:
                p = tree_parent(i)
                val[i] = val[p] if where[p] == slot else self.recv(p, i)
            for c in tree_children(i, n):
                if where[c] != slot:
                    self.send(where[c], i, c, val[i])
        self.flush()
        t1 = time.perf_counter()
        own = {i: fn(val[i], *nodes[i]) for i in mine}  # 2: the tasks
        t2 = time.perf_counter()
        part = {}
        for i in reversed(mine):  # 3: the partials up
            kids = [
                part.pop(c) if where[c] == slot else self.recv(c, i)
                for c in tree_children(i, n)
            ]
            part[i] = combine_node(combine, own.pop(i), *kids)
            if i and where[tree_parent(i)] != slot:
                self.send(where[tree_parent(i)], i, tree_parent(i), part.pop(i))
        self.flush()
        if 0 in part:
            self.kept = {call: part[0]}
            seconds = (t1 - t0, t2 - t1, time.perf_counter() - t2, t_work)
            with self.cond:
                self.done[call] = (part[0], seconds)
                self.cond.notify_all()


def mesh_open(token: str, slot: int, host: str | None) -> dict:
    """Slot ``slot``'s end of mesh ``token`` in this process (a listener on ``host``,
    or this worker's own address, and its thread): its address, and this process's
    id. Broken meshes in the process, and those unused for ``IDLE_SECONDS``, are
    closed."""
    now = time.monotonic()
    for key in [
        k for k, m in _MESHES.items() if m.broken or now - m.used > IDLE_SECONDS
    ]:
        _MESHES.pop(key).request_close()
    m = Mesh(token, slot, host or _own_host())
    _MESHES[(token, slot)] = m
    return {"address": m.address, "pid": os.getpid()}


def mesh_peers(token: str, slot: int, peers: list) -> int:
    """Every slot's address, in slot order (the second step of opening a mesh)."""
    _MESHES[(token, slot)].peers = [tuple(p) for p in peers]
    return len(peers)


def mesh_close(token: str) -> int:
    """Close this process's ends of mesh ``token``; how many there were."""
    keys = [k for k in _MESHES if k[0] == token]
    for k in keys:
        _MESHES.pop(k).request_close()
    return len(keys)


def mesh_abort(addresses: list, token: str) -> None:
    """Tell the slots listening at ``addresses`` to end their calls of mesh
    ``token`` (the driver, after losing a worker): best effort, briefly."""
    for host, port in addresses:
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.sendall(_HELLO.pack(_MAGIC, token.encode(), _ABORT))
        except OSError:
            pass  # gone already


def mesh_call(
    token: str,
    slot: int,
    call: int,
    where: list[int],
    fn: Callable,
    combine: Callable,
    shared: tuple,
    node_args: dict[int, tuple],
    relay: tuple[int, int] | None = None,
) -> dict:
    """One allreduce over mesh ``token``, called on the root's slot ``slot`` (=
    ``where[0]``): task i runs ``fn(shared, *node_args[i])`` on slot ``where[i]``.
    The root's slot sends every other slot its nodes' arguments (one frame a slot),
    and the three phases run on all of them at once. ``shared``: ``("value", x)``,
    ``("kept", c)`` (the value of call ``c``, kept on this slot) or ``("from", j)``
    (kept on slot j, which sends it here: ``relay=(j, c)``). Returns the combined
    value and the seconds of the phases on this slot (the value down, the tasks, the
    partials up; and, within the first, the other slots' parts pickled and queued)."""
    m = _MESHES.get((token, slot))
    if m is None or m.broken:
        why = m.broken if m is not None else "not open here"
        raise MeshError(f"slot {slot}: mesh {token[:8]}: {why}")
    if call <= m.call:
        raise MeshError(f"slot {slot}: call {call} after call {m.call}")
    if where[0] != slot:
        raise ValueError(f"mesh_call goes to the root's slot {where[0]}, not {slot}")
    common = {"call": call, "where": where, "fn": fn, "combine": combine}
    parts: dict[int, dict] = {}
    for i, j in enumerate(where):
        parts.setdefault(j, {})[i] = node_args[i]
    if relay is not None:
        parts.setdefault(relay[0], {})
    work = {
        j: {"call": call, "nodes": nodes, "shared": ("down",),
            "relay": relay[1] if relay is not None and relay[0] == j else None}
        for j, nodes in parts.items() if j != slot
    }  # fmt: skip
    mine = parts.get(slot, {})
    m.hand_over({**common, "nodes": mine, "shared": shared, "work": work,
                 "relay": relay[1] if relay is not None and relay[0] == slot else None})  # fmt: skip
    value, seconds = m.wait(call)
    return {"value": value, "seconds": seconds}
