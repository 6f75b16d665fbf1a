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

Values travel as pickle protocol 5 frames, between the pool's own processes only (the
same trust as the engine's own transport); nothing here is written to disk.
"""

from __future__ import annotations

import os
import pickle
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable

from bigrate.engines.base import combine_node, tree_children, tree_parent

_HELLO = struct.Struct("!4s32si")  # magic, the mesh's token, the sender's slot
_MAGIC = b"BRM1"
_ABORT = -1  # a hello from the driver: end the call
_FRAME = struct.Struct("!qiiq")  # call, source node, destination node, length
_CHUNK = 1 << 20
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
    """A slot's end of the pool's connections (see the module docstring)."""

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
        self.memo: tuple = (_NOTHING, b"")  # (the object, its pickle)
        self.used = time.monotonic()

    # -- connections -------------------------------------------------------------
    def _add(self, s: socket.socket, peer: int) -> None:
        s.setblocking(False)
        self.socks[s] = {"peer": peer, "rbuf": bytearray(), "wq": []}
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
    def send(self, peer: int, src: int, dst: int, obj) -> None:
        """Queue ``obj`` for node ``dst`` on slot ``peer`` (written while waiting)."""
        if self.memo[0] is not obj:  # a value sent to two children is pickled once
            self.memo = (obj, pickle.dumps(obj, protocol=5))
        payload = self.memo[1]
        s = self._conn(peer)
        self.socks[s]["wq"].append(
            memoryview(_FRAME.pack(self.call, src, dst, len(payload)) + payload)
        )

    def recv(self, src: int, dst: int):
        """Node ``src``'s value for node ``dst`` in this call (waiting for it)."""
        key = (self.call, src, dst)
        self._pump(lambda: key in self.inbox)
        return self.inbox.pop(key)

    def flush(self) -> None:
        """Wait until every queued frame is written."""
        self._pump(lambda: not any(b["wq"] for b in self.socks.values()))

    def _read(self, s: socket.socket) -> None:
        b = self.socks[s]
        try:
            data = s.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError as e:
            raise MeshError(f"slot {self.slot}: slot {b['peer']}: {e}") from None
        if not data:
            raise MeshError(f"slot {self.slot}: slot {b['peer']} closed its connection")
        buf = b["rbuf"]
        buf += data
        while len(buf) >= _FRAME.size:
            call, src, dst, n = _FRAME.unpack_from(buf)
            if len(buf) < _FRAME.size + n:
                break
            if call == self.call:
                self.inbox[(call, src, dst)] = pickle.loads(
                    memoryview(buf)[_FRAME.size : _FRAME.size + n]
                )
            del buf[: _FRAME.size + n]  # an earlier, ended call's frame: dropped

    def _write(self, s: socket.socket) -> None:
        q = self.socks[s]["wq"]
        try:
            sent = s.send(q[0])
        except BlockingIOError:
            return
        except OSError as e:
            peer = self.socks[s]["peer"]
            raise MeshError(f"slot {self.slot}: slot {peer}: {e}") from None
        q[0] = q[0][sent:]
        if not len(q[0]):
            q.pop(0)

    def _pump(self, done: Callable[[], bool]) -> None:
        while not done():
            socks = list(self.socks)
            writing = [s for s in socks if self.socks[s]["wq"]]
            r, w, _ = select.select([self.listener, *socks], writing, [], 1.0)
            for s in w:
                self._write(s)
            for s in r:
                if s is self.listener:
                    self._accept()
                else:
                    self._read(s)

    def close(self, why: str | None = None) -> None:
        self.broken = why or "closed"
        for s in list(self.socks):
            s.close()
        self.socks.clear()
        self.out.clear()
        self.inbox.clear()
        self.listener.close()


def mesh_open(token: str, slot: int, host: str | None) -> dict:
    """Slot ``slot``'s end of mesh ``token`` in this process (a listener on ``host``,
    or this worker's own address): its address, and this process's id. Meshes of
    this slot's earlier pools in the process are closed."""
    now = time.monotonic()
    for key in [
        k for k, m in _MESHES.items() if m.broken or now - m.used > IDLE_SECONDS
    ]:
        _MESHES.pop(key).close()
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
        _MESHES.pop(k).close()
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
    relay: int | None = None,
):
    """This slot's part of one allreduce over mesh ``token``: the tree's nodes
    ``node_args`` (node -> the task's arguments; task i runs ``fn(shared, *args)``),
    ``where[i]`` the slot of node i. ``shared``, on the root's slot: ``("value", x)``
    (given to the root), ``("kept", c)`` (the root's value of call ``c``, kept on this
    slot) or ``("from", j)`` (that value, sent by slot j, which gets ``relay=c``);
    ``("down",)`` elsewhere. Returns the combined value on the root's slot, None
    elsewhere, and the seconds each phase took here."""
    m = _MESHES.get((token, slot))
    if m is None or m.broken:
        raise MeshError(f"slot {slot}: mesh {token[:8]} is not open here")
    if call <= m.call:
        raise MeshError(f"slot {slot}: call {call} after call {m.call}")
    m.call, m.used, m.memo = call, time.monotonic(), (_NOTHING, b"")
    m.inbox = {k: v for k, v in m.inbox.items() if k[0] >= call}
    n, mine = len(where), sorted(node_args)
    t0 = time.perf_counter()
    try:
        if relay is not None:  # the previous root's value, to this call's root
            m.send(where[0], -1, 0, m.kept[relay])
        val = {}
        for i in mine:  # 1: the shared value down
            if i == 0:
                kind = shared[0]
                val[i] = (
                    shared[1] if kind == "value"
                    else m.kept[shared[1]] if kind == "kept"
                    else m.recv(-1, 0)
                )  # fmt: skip
            else:
                p = tree_parent(i)
                val[i] = val[p] if where[p] == slot else m.recv(p, i)
            for c in tree_children(i, n):
                if where[c] != slot:
                    m.send(where[c], i, c, val[i])
        m.flush()
        t1 = time.perf_counter()
        own = {i: fn(val[i], *node_args[i]) for i in mine}  # 2: the tasks
        t2 = time.perf_counter()
        part = {}
        for i in reversed(mine):  # 3: the partials up
            kids = [
                part.pop(c) if where[c] == slot else m.recv(c, i)
                for c in tree_children(i, n)
            ]
            part[i] = combine_node(combine, own.pop(i), *kids)
            if i and where[tree_parent(i)] != slot:
                m.send(where[tree_parent(i)], i, tree_parent(i), part.pop(i))
        m.flush()
    except BaseException as e:
        # this slot's connections closed: its peers' waits on it end too
        m.close(f"{type(e).__name__}: {e}")
        _MESHES.pop((token, slot), None)
        raise
    seconds = (t1 - t0, t2 - t1, time.perf_counter() - t2)
    if 0 in part:
        m.kept = {call: part[0]}
        return {"value": part[0], "seconds": seconds}
    return {"value": None, "seconds": seconds}
