"""Ctrl-C for long runs.

Python turns SIGINT into KeyboardInterrupt at the next bytecode, and when that bytecode
belongs to a ``__del__`` or a weakref callback the exception is printed and swallowed, so
the run would go on to the end as if nothing had been pressed. The handler here also
records the request, the sweep checks it between tasks and the command checks it last.

Training rounds run :func:`deferred`: there a first Ctrl-C is only recorded, and the
round loop raises it between rounds (:func:`check`). Raised inside a wait on the engine
it can land in the engine client's own bookkeeping: Dask's ``sync`` then logs a
``NameError`` traceback from its event loop (a Ctrl-C in the moment between a call
being queued and started, which the rounds' many short calls make likely enough for
the tests to meet it). A second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

_requested = threading.Event()
_deferring = threading.Event()


def _on_sigint(signum, frame):
    if _deferring.is_set() and not _requested.is_set():
        _requested.set()
        # straight to the descriptor: the handler may run in the middle of another
        # write to sys.stderr (a progress line), where print would be a reentrant call
        try:
            os.write(
                2,
                b"bigrate: Ctrl-C: stopping after this round (again to stop at once)\n",
            )
        except OSError:
            pass
        return
    _requested.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred():
    """Within: a first Ctrl-C is recorded, not raised, for the work to stop at its
    next :func:`check`; a second one raises at once."""
    _deferring.set()
    try:
        yield
    finally:
        _deferring.clear()


def install() -> None:
    """Handle SIGINT in this (main) thread; call once, before the work starts."""
    clear()
    signal.signal(signal.SIGINT, _on_sigint)


def clear() -> None:
    _requested.clear()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed, even if it was swallowed."""
    if _requested.is_set():
        raise KeyboardInterrupt
