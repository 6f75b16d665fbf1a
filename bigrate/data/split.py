"""Seeded, exactly stratified train/val/test split of a stream of rows.

Rows of each class are taken in windows of ``window`` rows (counted per class, so the
result does not depend on how the input was chunked). Window j of a class gets, for every
split s, exactly ``B_s((j+1) W) - B_s(j W)`` slots, where ``B_s(N) = round(N * F_s)`` and
``F_s`` is the cumulative fraction up to s; the slots are shuffled by a generator seeded
with ``(seed, class, j)``. The last, partial window of r rows gets
``B_s(j W + r) - B_s(j W)`` slots. So after all N rows of a class, split s holds exactly
``round(N F_s) - round(N F_{s-1})`` of them, chosen at random, and the memory held is at
most one window of rows per class.
"""

from __future__ import annotations

import os

import numpy as np

from bigrate.data.format import SPLITS, RowBlock


def parse_fractions(spec: str | dict) -> dict[str, float]:
    """``"train=0.8,val=0.1,test=0.1"`` (or a dict) -> validated fractions summing to 1."""
    if isinstance(spec, str):
        out: dict[str, float] = {}
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ValueError(
                    f"split: expected NAME=FRACTION items like 'train=0.8,val=0.2', got {part!r}"
                )
            k, v = part.split("=", 1)
            try:
                out[k.strip()] = float(v)
            except ValueError:
                raise ValueError(
                    f"split: fraction of {k.strip()!r} is not a number: {v!r}"
                ) from None
        spec = out
    fr = {k: float(v) for k, v in spec.items()}
    for k, v in fr.items():
        if k not in SPLITS:
            raise ValueError(f"split: unknown split {k!r}; expected train, val or test")
        if not (0.0 <= v <= 1.0) or not np.isfinite(v):
            raise ValueError(f"split: fraction of {k!r} must be in [0, 1], got {v}")
    total = sum(fr.values())
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"split: fractions must sum to 1, got {total:g} ({fr})")
    if fr.get("train", 0.0) <= 0.0:
        raise ValueError("split: the train fraction must be > 0")
    return {s: fr[s] for s in SPLITS if fr.get(s, 0.0) > 0.0}


class StratifiedSplitter:
    """Route row blocks to splits; see the module docstring for the exact rule."""

    def __init__(self, fractions: dict[str, float], seed: int = 0, window: int = 4096):
        self.names = [s for s in SPLITS if fractions.get(s, 0.0) > 0.0]
        cum = np.cumsum([fractions[s] for s in self.names])
        cum[-1] = 1.0
        self.cum = cum
        self.seed = int(seed)
        self.window = int(window)
        self.pending: dict[int, list[RowBlock]] = {1: [], -1: []}
        self.pending_rows = {1: 0, -1: 0}
        self.assigned = {1: 0, -1: 0}
        self.windows = {1: 0, -1: 0}

    def _bounds(self, n: int) -> np.ndarray:
        return np.concatenate([[0], np.floor(n * self.cum + 0.5).astype(np.int64)])

    def _slots(self, c: int, n: int) -> np.ndarray:
        """Split codes for the next n rows of class c (one window or the tail)."""
        start = self.assigned[c]
        counts = np.diff(self._bounds(start + n)) - np.diff(self._bounds(start))
        if (counts < 0).any():  # only possible for fractions below 1 / window
            counts = np.maximum(counts, 0)
            counts[np.argmax(counts)] -= counts.sum() - n
        labels = np.repeat(np.arange(len(self.names), dtype=np.int8), counts)
        rng = np.random.default_rng([self.seed, 0 if c == 1 else 1, self.windows[c]])
        rng.shuffle(labels)
        self.assigned[c] += n
        self.windows[c] += 1
        return labels

    def _route(self, c: int, block: RowBlock, nrows: int, out: list) -> RowBlock:
        """Assign the first ``nrows`` rows of ``block`` (whole windows, or the tail)."""
        codes = []
        done = 0
        while done < nrows:
            n = min(self.window, nrows - done)
            codes.append(self._slots(c, n))
            done += n
        code = np.concatenate(codes)
        head = block if nrows == len(block) else block.take(np.arange(nrows))
        for k, name in enumerate(self.names):
            sel = code == k
            if sel.any():
                out.append((name, head.take(sel)))
        return block.take(np.arange(nrows, len(block)))

    def push(self, block: RowBlock) -> list[tuple[str, RowBlock]]:
        """Add rows; returns the (split, rows) pieces that are decided now."""
        out: list[tuple[str, RowBlock]] = []
        for c in (1, -1):
            mask = block.y == c
            if not mask.any():
                continue
            part = block if mask.all() else block.take(mask)
            self.pending[c].append(part)
            self.pending_rows[c] += len(part)
            if self.pending_rows[c] >= self.window:
                merged = RowBlock.concat(self.pending[c])
                full = (len(merged) // self.window) * self.window
                rest = self._route(c, merged, full, out)
                self.pending[c] = [rest] if len(rest) else []
                self.pending_rows[c] = len(rest)
        return out

    def finish(self) -> list[tuple[str, RowBlock]]:
        """Assign the remaining (partial-window) rows of each class."""
        out: list[tuple[str, RowBlock]] = []
        for c in (1, -1):
            if self.pending_rows[c]:
                merged = RowBlock.concat(self.pending[c])
                self._route(c, merged, len(merged), out)
                self.pending[c] = []
                self.pending_rows[c] = 0
        return out


class PoolAndTest:
    """Where a prep's rows go: the pooled files' rows through a seeded
    :class:`StratifiedSplitter` into the splits of ``split`` (default
    ``"train=0.8,val=0.1,test=0.1"``, or ``"train=0.9,val=0.1"`` when there are
    ``test_files``), the rows of ``test_files`` wholly to the test split."""

    def __init__(self, split: str | dict | None, seed: int, test_files=()):
        self.test_files = [os.path.basename(str(f)) for f in test_files]
        if split is None:
            split = (
                "train=0.9,val=0.1" if self.test_files else "train=0.8,val=0.1,test=0.1"
            )
        self.fractions = parse_fractions(split)
        #: the splits the dataset has
        self.splits = [
            s
            for s in SPLITS
            if s in self.fractions or (s == "test" and self.test_files)
        ]
        self.seed = int(seed)
        self._splitter = StratifiedSplitter(self.fractions, seed=seed)

    def add(self, writer, role: str, block: RowBlock) -> None:
        """Give ``writer`` the rows of ``block``, from a pooled file (``role``
        "pool") or a test file ("test")."""
        if role == "pool":
            for s, piece in self._splitter.push(block):
                writer.append(s, piece)
        else:
            writer.append("test", block)

    def finish(self, writer) -> None:
        """The pool's last rows, held back by the splitter's windows, to ``writer``."""
        for s, piece in self._splitter.finish():
            writer.append(s, piece)

    def manifest(self) -> dict:
        """How the rows were split, as the manifest records it."""
        return {
            "fractions": self.fractions,
            "seed": self.seed,
            "method": "exact per-class stratification in seeded windows",
            "test_files": self.test_files,
        }
