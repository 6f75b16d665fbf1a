"""A progress bar with ETA on stderr: redrawn in place on a terminal, a line every few
seconds otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time


def _fmt(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class Progress:
    def __init__(
        self,
        what: str,
        total: int,
        done: int = 0,
        enabled: bool = True,
        every: float = 2.0,
        width: int = 24,
        stream=None,
    ):
        self.what, self.total, self.done = what, total, done
        self.start_done = done
        self.enabled, self.every, self.width = enabled, every, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = self.last = time.perf_counter()
        if enabled and done:
            self._draw(f"resuming: {done} already done")

    def eta(self) -> float | None:
        did = self.done - self.start_done
        if did <= 0:
            return None
        rate = (time.perf_counter() - self.t0) / did
        return rate * (self.total - self.done)

    def _draw(self, extra: str = "", final: bool = False) -> None:
        frac = self.done / self.total if self.total else 1.0
        fill = int(round(frac * self.width))
        bar = "#" * fill + "." * (self.width - fill)
        eta = self.eta()
        eta_s = (
            "done" if final else (f"ETA {_fmt(eta)}" if eta is not None else "ETA ?")
        )
        line = (
            f"[bigrate] {self.what} [{bar}] {self.done}/{self.total} "
            f"({100 * frac:.0f}%) {eta_s} {extra}"
        ).rstrip()
        if self.tty:
            print(
                "\r" + line.ljust(100),
                end="\n" if final else "",
                file=self.stream,
                flush=True,
            )
        else:
            print(line, file=self.stream, flush=True)

    def update(self, n: int = 1, extra: str = "") -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (
            self.tty or now - self.last >= self.every or self.done == self.total
        ):
            self.last = now
            self._draw(extra)

    def close(self, extra: str = "") -> None:
        if self.enabled:
            self._draw(extra, final=True)
