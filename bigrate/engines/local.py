"""The local engine: tasks run in this process (no cluster), one after another, or on
a pool of threads for tasks whose hot loops release the GIL (``threads``)."""

from __future__ import annotations

import threading

from bigrate import _cancel
from bigrate.engines.base import Engine, _call


def _bound_call(stop: threading.Event, fn, args):
    """``_call(fn, args)`` on a thread whose :func:`bigrate._cancel.check` looks at
    ``stop``."""
    _cancel.bind(stop)
    try:
        return _call(fn, args)
    finally:
        _cancel.bind(None)


class LocalEngine(Engine):
    """Runs every task in this process; ``put`` passes objects as they are
    (``map_dynamic`` is the base class's: one task at a time, here).

    ``threads`` > 1: :meth:`map` runs up to that many tasks at once on threads of this
    process, results yielded as they finish. Only for tasks that share no mutable
    state and spend their time in compiled code that releases the GIL (BPSP's
    partitions): there is no process to start and nothing to copy, but Python code in
    the tasks runs one thread at a time. A caller that stops (an error, Ctrl-C)
    cancels the tasks not yet started and waits for the running ones, which stop at
    their next :func:`bigrate._cancel.check` (BPSP's partitions: between calls of
    their compiled walk and between seeds) or at their end."""

    name = "local"

    def __init__(self, threads: int = 1):
        if not (isinstance(threads, int) and threads >= 1):
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self.threads = threads

    @property
    def n_workers(self) -> int:
        return self.threads

    def map(self, fn, args_list, *, retries: int = 0, what: str = "tasks"):
        if self.threads == 1 or len(args_list) <= 1:
            for i, args in enumerate(args_list):
                yield i, _call(fn, args)
            return
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        ex = ThreadPoolExecutor(self.threads, thread_name_prefix="bigrate-local")
        stop = threading.Event()
        try:
            index = {
                ex.submit(_bound_call, stop, fn, args): i
                for i, args in enumerate(args_list)
            }
            pending = set(index)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                # in submission order among those finished together: the same order
                # from run to run where tasks finish at once
                for f in sorted(done, key=index.__getitem__):
                    yield index[f], f.result()
        finally:
            # on an interrupt or a caller that stops early: no further task starts,
            # and the running ones stop at their next check
            stop.set()
            ex.shutdown(wait=True, cancel_futures=True)
