"""Pieces shared by the converters: source files, label mapping, checks, progress."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import numpy as np

from bigrate.data._kernels import l2_normalize_rows
from bigrate.data.format import RowBlock
from bigrate.errors import DataError


class _HashingReader(io.RawIOBase):
    """A raw binary file that hashes and counts every byte read through it."""

    def __init__(self, path: str | os.PathLike):
        if is_url(path):
            from bigrate.data.reader import filesystem

            fs, p = filesystem(str(path))
            self._f = fs.open(p, "rb", block_size=1 << 22)
        else:
            self._f = open(path, "rb")
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._f.readinto(b)
        if n:
            self.sha256.update(memoryview(b)[:n])
            self.nbytes += n
        return n

    def drain(self) -> None:
        """Read (and hash) whatever the decompressor left unread."""
        while self._f.readable():
            chunk = self._f.read(1 << 22)
            if not chunk:
                break
            self.sha256.update(chunk)
            self.nbytes += len(chunk)

    def close(self) -> None:
        self._f.close()
        super().close()


def is_url(path) -> bool:
    """A remote input (any fsspec URL but ``file://``)?"""
    return "://" in str(path) and not str(path).startswith("file://")


def check_input(path) -> None:
    """Raise FileNotFoundError naming ``path`` if it is not a readable file (a local
    path, or a URL of any fsspec store, read with the standard credentials)."""
    if is_url(path):
        from bigrate.data.reader import filesystem

        fs, p = filesystem(str(path))
        try:
            ok = fs.isfile(p)
        except OSError as e:
            raise FileNotFoundError(f"{path}: input cannot be read: {e}") from None
        if not ok:
            raise FileNotFoundError(f"{path}: input file not found at that URL")
    elif not os.path.isfile(str(path).removeprefix("file://")):
        raise FileNotFoundError(f"{path}: input file not found")


class Source:
    """An input file opened for one streaming pass, decompressed by its extension
    (.gz, .bz2, .xz), with its sha256 computed on the compressed bytes as they pass."""

    def __init__(self, path: str | os.PathLike):
        check_input(path)
        path = str(path).removeprefix("file://")
        self.path = Path(path) if not is_url(path) else PurePosixPath(path)
        self._raw = _HashingReader(path)
        buffered = io.BufferedReader(self._raw, buffer_size=1 << 20)
        suffix = self.path.suffix.lower()
        if suffix == ".gz":
            self.stream = gzip.GzipFile(fileobj=buffered, mode="rb")
        elif suffix == ".bz2":
            self.stream = bz2.BZ2File(buffered, mode="rb")
        elif suffix in (".xz", ".lzma"):
            self.stream = lzma.LZMAFile(buffered, mode="rb")
        else:
            self.stream = buffered
        self._buffered = buffered

    def info(self) -> dict:
        """Name, byte size and sha256 of the source file (call after the pass)."""
        self._raw.drain()
        return {
            "name": self.path.name,
            "bytes": self._raw.nbytes,
            "sha256": self._raw.sha256.hexdigest(),
        }

    def close(self) -> None:
        self.stream.close()
        self._buffered.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def format_label(v) -> str:
    """Source labels as strings: integral floats print as integers (1.0 -> "1")."""
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if f.is_integer():
            return str(int(f))
        return repr(f)
    return str(v)


class LabelMapper:
    """Map source labels to +1 / -1.

    * ``positive`` and ``negative`` both given: every other label is an error.
    * only ``positive`` given: every other label is negative.
    * neither: the labels found must be {-1, +1} or {0, 1} (1 is positive); anything
      else asks for ``--positive-labels``.
    Labels are compared as strings after :func:`format_label`, so "1", "1.0" and "+1"
    name the same svmlight label.
    """

    def __init__(
        self,
        positive: Iterable[str] | None = None,
        negative: Iterable[str] | None = None,
    ):
        self.positive = None if positive is None else {_norm(x) for x in positive}
        self.negative = None if negative is None else {_norm(x) for x in negative}
        if self.positive is not None and not self.positive:
            raise ValueError("positive labels: give at least one label")
        if self.negative is not None and self.positive is None:
            raise ValueError(
                "negative labels were given without positive labels; "
                "give --positive-labels too"
            )
        if self.positive and self.negative and self.positive & self.negative:
            raise ValueError(
                f"labels {sorted(self.positive & self.negative)} are listed as both "
                "positive and negative"
            )
        self.counts: dict[str, int] = {}

    def map(self, raw: np.ndarray, where) -> np.ndarray:
        """int8 labels for ``raw``; ``where(k)`` gives (path, line) of row k for errors."""
        uniq, inverse, cnt = np.unique(raw, return_inverse=True, return_counts=True)
        names = [_norm(u) for u in uniq]
        for n, c in zip(names, cnt, strict=True):
            self.counts[n] = self.counts.get(n, 0) + int(c)
        code = np.empty(len(uniq), dtype=np.int8)
        for k, n in enumerate(names):
            code[k] = self._code(
                n, lambda k=k: where(int(np.flatnonzero(inverse == k)[0]))
            )
        return code[inverse.ravel()]

    def _code(self, name: str, locate) -> int:
        if self.positive is not None:
            if name in self.positive:
                return 1
            if self.negative is None or name in self.negative:
                return -1
            path, line = locate()
            raise DataError(
                f"label {name!r} is neither positive {sorted(self.positive)} nor negative "
                f"{sorted(self.negative)}; labels found so far: {sorted(self.counts)}",
                path=path,
                line=line,
            )
        seen = set(self.counts)
        if seen <= {"-1", "1"}:
            return 1 if name == "1" else -1
        if seen <= {"0", "1"}:
            return 1 if name == "1" else -1
        path, line = locate()
        raise DataError(
            f"labels found {sorted(seen)} are not {{-1, +1}} or {{0, 1}}, so which class is "
            "positive is not known; pass --positive-labels (and --negative-labels to "
            "refuse any other label)",
            path=path,
            line=line,
        )

    def check_two_classes(self) -> None:
        pos = sum(
            c
            for n, c in self.counts.items()
            if self._code(n, lambda: (None, None)) == 1
        )
        neg = sum(self.counts.values()) - pos
        if pos == 0 or neg == 0:
            raise DataError(
                f"after mapping there is only one class ({pos} positive, {neg} negative "
                f"rows); labels found with counts: {self.counts}. Check --positive-labels"
            )

    def manifest(self) -> dict:
        pos = sorted(n for n in self.counts if self._code(n, lambda: (None, None)) == 1)
        neg = sorted(n for n in self.counts if n not in pos)
        return {
            "positive": pos,
            "negative": neg,
            "source_counts": dict(sorted(self.counts.items())),
        }


def _norm(label) -> str:
    s = str(label).strip()
    try:
        return format_label(float(s))
    except ValueError:
        return s


def finish_block(
    X, raw_y, row_id0: int, mapper: LabelMapper, l2_normalize: bool, where, group=None
) -> RowBlock:
    """Checks and preprocessing common to every converter: finite values, label
    mapping, float32/int32 CSR, optional row L2 normalisation."""
    X.sort_indices()
    data = X.data
    if not np.isfinite(data).all():
        bad = int(np.flatnonzero(~np.isfinite(data))[0])
        row = int(np.searchsorted(X.indptr, bad, side="right") - 1)
        path, line = where(row)
        raise DataError(
            f"non-finite value {data[bad]} (NaN and infinity are not allowed)",
            path=path,
            line=line,
        )
    y = mapper.map(raw_y, where)
    X = X.astype(np.float32, copy=False)
    X.indices = X.indices.astype(np.int32, copy=False)
    if l2_normalize:
        X.data = np.array(X.data, dtype=np.float32, copy=True)
        l2_normalize_rows(X.indptr, X.data)
    n = X.shape[0]
    return RowBlock(
        X=X, y=y, row_id=np.arange(row_id0, row_id0 + n, dtype=np.int64), group=group
    )


class Progress:
    """Progress lines on stderr, at most one every ``every`` seconds."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        enabled: bool = True,
        every: float = 2.0,
        unit: str = "rows",
    ):
        self.what, self.total, self.enabled, self.every, self.unit = (
            what,
            total,
            enabled,
            every,
            unit,
        )
        self.t0 = self.last = time.perf_counter()
        self.done = 0

    def update(self, n: int, extra: str = "") -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and now - self.last >= self.every:
            self.last = now
            self._print(extra)

    def _print(self, extra: str = "") -> None:
        el = time.perf_counter() - self.t0
        rate = self.done / el if el > 0 else 0.0
        tot = f"/{self.total:,}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        print(
            f"[bigrate] {self.what}: {self.done:,}{tot} {self.unit}{pct}, "
            f"{rate:,.0f} {self.unit}/s, {el:.0f}s {extra}".rstrip(),
            file=sys.stderr,
            flush=True,
        )

    def close(self, extra: str = "") -> None:
        if self.enabled:
            self._print(extra)
