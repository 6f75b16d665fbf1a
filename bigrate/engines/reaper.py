"""Stops what an embedded Ray runtime left behind when its driver died outright.

``ray.init()`` starts the runtime's processes (GCS, raylet, workers, and two agents
under the raylet) as descendants of the driver. When the driver ends normally,
``ray.shutdown()`` stops them; when it is SIGKILLed (an OOM killer, a batch system,
``kill -9``), the GCS, raylet and workers follow, but the dashboard agent and the
runtime-env agent stay, reparented to init, for as long as the machine runs (measured:
both still alive minutes after the kill).

The reaper is a small process the driver starts beside the runtime, in a session of
its own, reading from a pipe whose other end only the driver holds. Every
``SNAPSHOT_SECONDS`` it records the driver's descendants (process id and start time),
which are exactly the processes this driver started. When the pipe reaches its end
without the word ``done`` (the driver died: the kernel closes its end), it sends
SIGKILL to each recorded process still alive with the same start time (not a process
that reused the id), and exits. ``done`` (sent by :meth:`RayEngine.close` after
``ray.shutdown()``) makes it exit and stop nothing.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

SNAPSHOT_SECONDS = 1.0


def start(driver_pid: int) -> subprocess.Popen:
    """The reaper of what ``driver_pid`` starts from now on, once it has recorded what
    was there before (it says "ready"); write ``done\\n`` to its stdin on a clean
    shutdown."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bigrate.engines.reaper", str(driver_pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the driver's group is not for it
        close_fds=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    if ready:
        proc.stdout.readline()
    proc.stdout.close()
    return proc


def stop(proc: subprocess.Popen) -> None:
    """A clean shutdown: the reaper exits and stops nothing."""
    try:
        proc.stdin.write(b"done\n")
        proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass


def _snapshot(driver, seen: dict) -> None:
    import psutil

    try:
        for p in driver.children(recursive=True):
            try:
                seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
    except psutil.Error:
        pass


def _reap(seen: dict) -> None:
    import psutil

    for pid, started in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - started) < 1e-3:
                p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def main(driver_pid: int) -> None:
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        driver = psutil.Process(driver_pid)
    except psutil.Error:
        return
    seen: dict = {}
    _snapshot(driver, seen)
    before = set(seen)  # what the driver had started before the runtime: not its
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdout.close()
    except OSError:
        pass
    fd = sys.stdin.fileno()
    got = b""
    while True:
        _snapshot(driver, seen)
        ready, _, _ = select.select([fd], [], [], SNAPSHOT_SECONDS)
        if not ready:
            continue
        chunk = os.read(fd, 64)
        if chunk:
            got += chunk
            if b"done" in got:
                return
            continue
        # end of the pipe without "done": the driver is gone
        time.sleep(0.5)  # let the GCS and raylet notice on their own first
        _reap({k: v for k, v in seen.items() if k not in before and k != os.getpid()})
        return


if __name__ == "__main__":
    main(int(sys.argv[1]))
