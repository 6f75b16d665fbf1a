"""The slots' direct connections (bigrate.engines.mesh) on real sockets on 127.0.0.1,
two slots as two threads of this process: the tree's order, large values crossing in
both directions at once, and every way a call can end without finishing."""

import threading
import time

import numpy as np
import pytest

from bigrate.engines import mesh as M
from bigrate.engines.base import tree_reduce


def _leaf(shared, k, size):
    return {"keys": [k], "shared": [shared], "x": np.full(size, (k + 1) ** 3 / 7.0)}


def _leaf_count(shared, k, size):  # given the previous value: its number of keys
    return _leaf(len(shared["keys"]), k, size)


def _leaf_keys(shared, k, size):  # given the previous value: its keys
    return _leaf(shared["keys"], k, size)


def _combine(a, b):  # not commutative: the keys record the order
    return {"keys": a["keys"] + b["keys"], "shared": a["shared"] + b["shared"],
            "x": a["x"] + b["x"]}  # fmt: skip


def fails_on_slot_1(shared, k, n):
    if k == 1:
        raise ValueError("task 1 fails")
    return _leaf(shared, k, n)


def hangs_on_slot_1(shared, k, n):
    if k == 1:
        time.sleep(8)
    return _leaf(shared, k, n)


def _open(n_slots):
    token = M.new_token()
    addrs = [M.mesh_open(token, j, "127.0.0.1")["address"] for j in range(n_slots)]
    for j in range(n_slots):
        M.mesh_peers(token, j, addrs)
    return token, addrs


def _call(token, call, where, fn, shared, args, relay=None):
    """mesh_call on the root's slot (the other slots' threads take their parts)."""
    return M.mesh_call(token, where[0], call, where, fn, _combine, shared,
                       dict(enumerate(args)), relay)  # fmt: skip


def test_tree_order_and_large_values_crossing_both_ways():
    """Nodes spread over two slots so that each slot sends the other a 16 MB partial
    at the same moment: neither blocks; the value is tree_reduce's, bit for bit; the
    next call starts from the value kept on the root's slot, or relayed from it to a
    root on another slot."""
    token, _ = _open(2)
    try:
        size = 2_000_000  # 16 MB of float64 a partial
        where = [0, 1, 1, 0, 0, 1, 1]
        args = [(k, size) for k in range(7)]
        expect = tree_reduce([_leaf("s", *a) for a in args], _combine)
        value = _call(token, 1, where, _leaf, ("value", "s"), args)["value"]
        assert value["keys"] == expect["keys"] != sorted(expect["keys"])
        assert value["shared"] == ["s"] * 7
        np.testing.assert_array_equal(value["x"], expect["x"])
        # the next call: the root's value kept on slot 0
        small = [(k, 3) for k in range(7)]
        again = _call(token, 2, where, _leaf_count, ("kept", 1), small)  # fmt: skip
        assert again["value"]["shared"] == [7] * 7
        # the root now on slot 1: slot 0 relays the value kept from call 2
        flipped = [1, 0, 0, 1, 1, 0, 0]
        third = _call(token, 3, flipped, _leaf_keys, ("from", 0), small,
                      relay=(0, 2))  # fmt: skip
        assert third["value"]["shared"] == [again["value"]["keys"]] * 7
    finally:
        M.mesh_close(token)


def test_a_failing_task_ends_every_slots_call():
    """A task's exception closes its slot's connections: the root's call ends with a
    MeshError at once, not a wait without end, and every slot's end is closed."""
    token, _ = _open(2)

    try:
        t = time.monotonic()
        with pytest.raises(M.MeshError, match="closed its connection"):
            _call(token, 1, [0, 1, 0], fails_on_slot_1, ("value", "s"),
                  [(k, 3) for k in range(3)])  # fmt: skip
        assert time.monotonic() - t < 10
        assert "task 1 fails" in M._MESHES[(token, 1)].broken
        with pytest.raises(M.MeshError, match="closed its connection"):
            _call(token, 2, [0], _leaf, ("value", 1), [(0, 1)])
    finally:
        M.mesh_close(token)


def test_the_drivers_abort_ends_a_call_waiting_on_a_silent_peer():
    """The root waits for slot 1's partial, and slot 1's task hangs (or its worker
    is gone without closing its connections): the driver's abort, sent to the
    listeners, ends the root's call; a stranger's connection (another token) does
    not."""
    token, addrs = _open(2)
    out = {}

    def root():
        try:
            out[0] = _call(token, 1, [0, 1], hangs_on_slot_1, ("value", "s"),
                           [(k, 3) for k in range(2)])  # fmt: skip
        except BaseException as e:  # noqa: BLE001 - recorded for the test
            out[0] = e

    try:
        th = threading.Thread(target=root)
        th.start()
        time.sleep(0.5)
        M.mesh_abort(addrs, M.new_token())  # not this mesh's: ignored
        time.sleep(1.5)
        assert th.is_alive()
        t = time.monotonic()
        M.mesh_abort(addrs, token)
        th.join(10)
        assert not th.is_alive() and time.monotonic() - t < 5
        assert isinstance(out[0], M.MeshError) and "driver ended" in str(out[0])
    finally:
        M.mesh_close(token)
