"""Cooperative cancellation of tasks on the local engine's threads.

A thread cannot be stopped from outside, and compiled code does not look at signals.
The local engine binds each task thread to an event it sets when its caller stops
(an error, Ctrl-C); long tasks call :func:`check` between their compiled calls, which
raises :class:`Cancelled` once it is set. Elsewhere (one thread, Ray and Dask
workers) nothing is bound and :func:`check` does nothing.
"""

from __future__ import annotations

import threading

_bound = threading.local()


class Cancelled(Exception):
    """The task's caller stopped waiting for it (see :mod:`bigrate._cancel`)."""


def bind(event: threading.Event | None) -> None:
    """Tie this thread's tasks to ``event`` (None: to nothing)."""
    _bound.event = event


def check() -> None:
    """Raise :class:`Cancelled` if this thread's event is set."""
    event = getattr(_bound, "event", None)
    if event is not None and event.is_set():
        raise Cancelled("the task was cancelled: its caller stopped waiting for it")
