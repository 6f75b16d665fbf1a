"""Fault injection for the tests that kill a cluster worker at a chosen moment.

The cluster processes those tests start (Dask workers, a Ray head and its workers) get
this folder on their PYTHONPATH, so Python imports this module at start-up. With
``BIGRATE_FAULT_FILE`` set, it wraps the functions listed in ``TARGETS`` once their
module is imported; each call reads that file, lines ``NAME N [DELAY]`` (or nothing),
and the N-th call of NAME across the whole cluster (counted by creating files
``NAME-1``, ``NAME-2``, ... next to it, which only one process can do each) sends
SIGKILL to the process making it, before the function runs: the worker dies exactly
there, as a machine that fails does. Once one of them has, every wrapped call first
sleeps DELAY seconds (default 0): slower workers, so that the job still runs when the
replacement of the lost one joins. A line ``slow DELAY`` makes every call sleep that
long, without killing. The tests write the file before each job and remove it after.
The `bigrate` command itself (the driver) can load it too.
"""

import functools
import importlib.abc
import os
import signal
import sys
import time

FAULT_FILE = os.environ.get("BIGRATE_FAULT_FILE")

# name -> (module, attribute path); the first ones run on cluster workers, the last
# ones in the driver (the `bigrate` command itself)
TARGETS = {
    "slot": ("bigrate.engines.base", "Slot.__init__"),
    "warm": ("bigrate.linear.distributed", "warm_steps"),
    "round": ("bigrate.linear.distributed", "sgd_round"),
    "evaluate": ("bigrate.runner.evaluate", "score_file"),
    "driver-evaluate": ("bigrate.runner.evaluate", "evaluate"),
    "bpsp-save": ("bigrate.runner.fit", "_save_task"),
    "crossfit-save": ("bigrate.runner.crossfit", "save_fold"),
}


def _armed(name: str) -> bool:
    """Whether this call of ``name`` is one to die at (after sleeping DELAY, if a kill
    happened already)."""
    try:
        with open(FAULT_FILE) as f:
            specs = [line.split() for line in f if line.strip()]
        for spec in [s for s in specs if s[0] == "slow"]:
            time.sleep(float(spec[1]))  # every call slower, no kill
        specs = [s for s in specs if s[0] != "slow"]
        kills = [(want, int(n)) for want, n, *_ in specs]
        delay = max((float(d[0]) for _, _, *d in specs if d), default=0.0)
    except (OSError, ValueError):
        return False
    d = os.path.dirname(FAULT_FILE)
    if delay and any(os.path.exists(os.path.join(d, f"{w}-{n}")) for w, n in kills):
        time.sleep(delay)
    at = {n for want, n in kills if want == name}
    if not at:
        return False
    for k in range(1, max(at) + 1):  # claim the next call number, cluster-wide
        try:
            os.close(os.open(os.path.join(d, f"{name}-{k}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        return k in at
    return False


def _wrap(name: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _armed(name):
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)

    return call


def _patch(module) -> None:
    for name, (mod, path) in TARGETS.items():
        if mod != module.__name__:
            continue
        owner, attr = module, path
        if "." in path:
            cls, attr = path.split(".")
            owner = getattr(module, cls)
        setattr(owner, attr, _wrap(name, getattr(owner, attr)))


class _Finder(importlib.abc.MetaPathFinder):
    """Patches a target module right after it is executed."""

    modules = {mod for mod, _ in TARGETS.values()}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.modules:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if FAULT_FILE:
    import importlib.util

    sys.meta_path.insert(0, _Finder())
