"""Ctrl-C for long runs.

Python turns SIGINT into KeyboardInterrupt at the next bytecode, and when that bytecode
belongs to a ``__del__`` or a weakref callback the exception is printed and swallowed, so
the run would go on to the end as if nothing had been pressed. The handler here also
records the request, the sweep checks it between tasks and the command checks it last.
"""

from __future__ import annotations

import signal
import threading

_requested = threading.Event()


def _on_sigint(signum, frame):
    _requested.set()
    raise KeyboardInterrupt


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
