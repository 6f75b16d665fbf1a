"""The local engine: tasks run in this process (no cluster), one after another, or on
a pool of threads for tasks whose hot loops release the GIL (``threads``)."""

from __future__ import annotations

import threading

from bigrate import _cancel
from bigrate.engines.base import Engine, _call, submit_while_free


def _bound_call(stop: threading.Event, fn, args):
    """``_call(fn, args)`` on a thread whose :func:`bigrate._cancel.check` looks at
    ``stop``."""
    _cancel.bind(stop)
    try:
        return _call(fn, args)
    finally:
        _cancel.bind(None)


class LocalEngine(Engine):
    """Runs every task in this process; ``put`` passes objects as they are.

    ``threads`` > 1: :meth:`map` and :meth:`map_dynamic` run up to that many tasks
    at once on threads of this process, results yielded as they finish. Only for
    tasks that share no mutable state and spend their time in compiled code that
    releases the GIL (BPSP's partitions): there is no process to start and nothing to copy, but Python code in
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

    def map_dynamic(self, fn, next_task, *, in_flight: int, retries: int = 3,
                    what: str = "tasks"):  # fmt: skip
        """As the base class's, on up to ``threads`` threads (and ``in_flight``):
        ``next_task()`` is called whenever a thread is free, after the results
        finished so far were handed back (so it can choose the next task by them)."""
        if self.threads == 1 or in_flight <= 1:
            yield from super().map_dynamic(fn, next_task, in_flight=in_flight,
                                           retries=retries, what=what)  # fmt: skip
            return
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        width = min(self.threads, in_flight)
        ex = ThreadPoolExecutor(width, thread_name_prefix="bigrate-local")
        stop = threading.Event()
        pending: dict = {}  # future -> key
        order: dict = {}  # future -> submission number
        try:

            def submit(args):
                f = ex.submit(_bound_call, stop, fn, args)
                order[f] = len(order)
                return f

            submit_while_free(pending, width, next_task, submit)
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                # in submission order among those finished together: the same order
                # from run to run where tasks finish at once
                for f in sorted(done, key=order.__getitem__):
                    yield pending.pop(f), f.result()
                submit_while_free(pending, width, next_task, submit)
        finally:
            # on an interrupt or a caller that stops early: no further task starts,
            # and the running ones stop at their next check
            stop.set()
            ex.shutdown(wait=True, cancel_futures=True)

    def map(self, fn, args_list, *, retries: int = 0, what: str = "tasks"):
        if self.threads == 1 or len(args_list) <= 1:
            for i, args in enumerate(args_list):
                yield i, _call(fn, args)
            return
        # the threads' loop is map_dynamic's, over the tasks in their order
        tasks = iter(enumerate(args_list))
        yield from self.map_dynamic(fn, lambda: next(tasks, None),
                                    in_flight=self.threads, retries=retries,
                                    what=what)  # fmt: skip
