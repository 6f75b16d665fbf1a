"""Ctrl-C and SIGTERM for long runs: both are an interruption.

A terminal sends SIGINT to the whole process group on Ctrl-C; batch systems (SLURM,
Kubernetes) send SIGTERM, to the driver or to its group. Either way the run stops at
its next safe point, saves what is finished (a training checkpoint, sweep tasks),
records ``interrupted`` and the command exits with 128 + the signal's number, printing
the exact ``bigrate resume`` command. A second signal stops at once, also cleanly.

Python turns SIGINT into KeyboardInterrupt at the next bytecode, and when that bytecode
belongs to a ``__del__`` or a weakref callback the exception is printed and swallowed, so
the run would go on to the end as if nothing had been pressed. The handler here also
records the request, the sweep checks it between tasks and the command checks it last.

Training rounds run :func:`deferred`: there a first signal is only recorded, and the
round loop raises it between rounds (:func:`check`); a wait on the cluster that has no
result for a second gives up at once (:func:`requested`, the engine's ``should_stop``).
Raised inside a wait on the engine it can land in the engine client's own bookkeeping:
Dask's ``sync`` then logs a ``NameError`` traceback from its event loop (a Ctrl-C in the
moment between a call being queued and started, which the rounds' many short calls
make likely enough for the tests to meet it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_requested = threading.Event()
_deferring = threading.Event()
_signal = [signal.SIGINT]  # the signal of the first request

#: how each signal is named to the user
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def _on_signal(signum, frame):
    first = not _requested.is_set()
    if first:
        _signal[0] = signum
    if _deferring.is_set() and first:
        _requested.set()
        # straight to the descriptor: the handler may run in the middle of another
        # write to sys.stderr (a progress line), where print would be a reentrant call
        name = NAMES.get(signum, f"signal {signum}")
        try:
            os.write(
                2,
                f"bigrate: {name}: stopping after this round (again to stop at "
                "once)\n".encode(),
            )
        except OSError:
            pass
        return
    _requested.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred():
    """Within: a first signal is recorded, not raised, for the work to stop at its
    next :func:`check`; a second one raises at once."""
    _deferring.set()
    try:
        yield
    finally:
        _deferring.clear()


def install() -> None:
    """Handle SIGINT and SIGTERM in this (main) thread; call once, before the work
    starts."""
    clear()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def clear() -> None:
    _requested.clear()
    _signal[0] = signal.SIGINT


def requested() -> bool:
    return _requested.is_set()


def received() -> int:
    """The number of the signal that asked to stop (SIGINT if none did)."""
    return int(_signal[0])


def check() -> None:
    """Raise KeyboardInterrupt if a stop was asked for, even if it was swallowed."""
    if _requested.is_set():
        raise KeyboardInterrupt
