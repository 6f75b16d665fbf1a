"""svmlight / LIBSVM text -> shards, streaming with bounded memory.

The input is read in pieces of about ``chunk_bytes`` decompressed bytes cut at line ends;
each piece is parsed by scikit-learn's compiled svmlight reader (so values are exactly what
``load_svmlight_file`` gives) and written out before the next is read. Memory is bounded by
a few pieces plus one row group per (split, class), whatever the file size.

Input rules are scikit-learn's: feature indices in a line must be sorted and unique
(duplicated features are refused, naming the line), ``qid:`` is ignored, ``#`` starts a
comment, blank and comment-only lines are skipped.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from bigrate.data.format import DEFAULT_ROW_GROUP_SIZE, DEFAULT_ROWS_PER_FILE
from bigrate.data.prep.common import (
    LabelMapper,
    Progress,
    Source,
    check_input,
    finish_block,
)
from bigrate.data.split import PoolAndTest
from bigrate.data.writer import DatasetWriter
from bigrate.errors import DataError

_NUM = re.compile(
    rb"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan|infinity)$",
    re.IGNORECASE,
)


def _data_lines(buf: bytes, first_line: int):
    """(line number, content) of the lines sklearn turns into rows."""
    for k, line in enumerate(buf.split(b"\n")):
        content = line.split(b"#", 1)[0].strip()
        if content:
            yield first_line + k, content


def _row_locator(path: str, buf: bytes, first_line: int):
    def where(row: int):
        for r, (ln, _) in enumerate(_data_lines(buf, first_line)):
            if r == row:
                return path, ln
        return path, None

    return where


def _diagnose(
    path: str, buf: bytes, first_line: int, zero_based: bool, err: Exception
) -> DataError:
    """Find the first line of ``buf`` that sklearn's reader refuses, and say why."""
    for ln, content in _data_lines(buf, first_line):
        toks = content.split()
        if not _NUM.match(toks[0]):
            return DataError(
                f"label {toks[0].decode(errors='replace')!r} is not a number",
                path=path,
                line=ln,
            )
        prev = -1
        for tok in toks[1:]:
            if tok.startswith(b"qid:"):
                continue
            if tok.count(b":") != 1:
                return DataError(
                    f"expected INDEX:VALUE, got {tok.decode(errors='replace')!r}",
                    path=path,
                    line=ln,
                )
            i, v = tok.split(b":")
            if not i.isdigit():
                return DataError(
                    f"feature index {i.decode(errors='replace')!r} is not a "
                    "non-negative integer",
                    path=path,
                    line=ln,
                )
            if not _NUM.match(v):
                return DataError(
                    f"value {v.decode(errors='replace')!r} of feature "
                    f"{int(i)} is not a number",
                    path=path,
                    line=ln,
                )
            idx = int(i)
            if idx == 0 and not zero_based:
                return DataError(
                    "feature index 0 in a one-based file (pass --zero-based "
                    "if the file's indices start at 0)",
                    path=path,
                    line=ln,
                )
            if idx == prev:
                return DataError(
                    f"feature {idx} appears twice in the line (indices must be unique)",
                    path=path,
                    line=ln,
                )
            if idx < prev:
                return DataError(
                    f"feature indices are not sorted ({prev} then {idx}); "
                    "indices must be sorted and unique",
                    path=path,
                    line=ln,
                )
            prev = idx
    last = first_line + buf.count(b"\n")
    return DataError(
        f"scikit-learn's svmlight reader refused lines {first_line}-{last}: {err}",
        path=path,
    )


def iter_svmlight(
    path,
    *,
    zero_based: bool = False,
    chunk_bytes: int = 8 << 20,
    source: Source | None = None,
):
    """Yield ``(X, raw_labels, buf, first_line)`` for pieces of an svmlight file.

    ``X`` is CSR float32 with 0-based column indices; ``buf`` and ``first_line`` let the
    caller name the line of a row that fails a later check.
    """
    src = source or Source(path)
    name = str(path)
    carry = b""
    line_no = 1
    try:
        while True:
            data = src.stream.read(chunk_bytes)
            if data:
                buf = carry + data
                cut = buf.rfind(b"\n")
                if cut < 0:
                    carry = buf
                    continue
                buf, carry = buf[: cut + 1], buf[cut + 1 :]
            else:
                buf, carry = carry, b""
            if buf:
                try:
                    X, y = load_svmlight_file(
                        io.BytesIO(buf),
                        dtype=np.float32,
                        zero_based=zero_based,
                        query_id=False,
                    )
                except ValueError as e:
                    raise _diagnose(name, buf, line_no, zero_based, e) from None
                yield X, y, buf, line_no
                line_no += buf.count(b"\n")
            if not data:
                break
    finally:
        if source is None:
            src.close()


def prep_svmlight(
    files: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    test_files: Sequence[str | os.PathLike] = (),
    positive_labels: Sequence[str] | None = None,
    negative_labels: Sequence[str] | None = None,
    split: str | dict | None = None,
    seed: int = 0,
    l2_normalize: bool = False,
    zero_based: bool = False,
    n_features: int | None = None,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    compression: str = "lz4",
    chunk_bytes: int = 8 << 20,
    overwrite: bool = False,
    progress: bool = True,
    name: str | None = None,
    command: str | None = None,
) -> dict:
    """Convert svmlight files into a sharded dataset at ``out``; returns the manifest.

    Parameters
    ----------
    files : list of paths
        Files pooled and split into train/val/test by ``split`` (row ids follow the
        order of the files and of their lines).
    test_files : list of paths
        Files whose rows all go to the test split (e.g. LIBSVM's ``a9a.t``).
    positive_labels, negative_labels : list of str, optional
        Source labels of the positive class (the rest are negative unless
        ``negative_labels`` is given, which then refuses any other label). Default:
        labels must be {-1, +1} or {0, 1} and 1 is positive.
    split : str or dict
        Fractions such as ``"train=0.8,val=0.1,test=0.1"`` (the default; without
        ``test_files``) or ``"train=0.9,val=0.1"`` (the default with ``test_files``).
    l2_normalize : bool
        Scale every row to unit L2 norm.
    n_features : int, optional
        Declared width; an index at or beyond it is an error. Default: the largest
        index seen plus one.
    """
    if not files:
        raise ValueError("give at least one input file")
    route = PoolAndTest(split, seed, test_files)
    if chunk_bytes < 1024:
        raise ValueError(f"chunk_bytes must be >= 1024, got {chunk_bytes}")
    for f in list(files) + list(test_files):
        check_input(f)
    mapper = LabelMapper(positive_labels, negative_labels)
    width = 0
    row_id = 0
    sources = []
    prog = Progress("prep svmlight", enabled=progress)
    with DatasetWriter(
        out,
        splits=route.splits,
        overwrite=overwrite,
        row_group_size=row_group_size,
        rows_per_file=rows_per_file,
        compression=compression,
    ) as w:
        for role, group in (("pool", files), ("test", test_files)):
            for path in group:
                with Source(path) as src:
                    for X, y, buf, line in iter_svmlight(
                        path, zero_based=zero_based, chunk_bytes=chunk_bytes, source=src
                    ):
                        where = _row_locator(str(path), buf, line)
                        if n_features is not None and X.shape[1] > n_features:
                            bad = int(np.flatnonzero(X.indices >= n_features)[0])
                            row = int(np.searchsorted(X.indptr, bad, side="right") - 1)
                            p, ln = where(row)
                            raise DataError(
                                f"feature index {X.indices[bad] + (0 if zero_based else 1)} "
                                f"is beyond n_features={n_features}",
                                path=p,
                                line=ln,
                            )
                        block = finish_block(X, y, row_id, mapper, l2_normalize, where)
                        row_id += len(block)
                        width = max(width, X.shape[1])
                        route.add(w, role, block)
                        prog.update(
                            len(block),
                            f"({src._raw.nbytes / 2**20:.0f} MiB read "
                            f"of {os.path.basename(str(path))})",
                        )
                    sources.append({**src.info(), "role": role})
            if role == "pool":
                route.finish(w)
        mapper.check_two_classes()
        prog.close("done")
        return w.commit(
            n_features=n_features if n_features is not None else width,
            label_mapping=mapper.manifest(),
            preprocessing={
                "l2_normalize": bool(l2_normalize),
                "split": route.manifest(),
                "zero_based_source": bool(zero_based),
            },
            sources=sources,
            command=command,
            name=name,
        )


def dump_svmlight(
    path, X: sp.csr_matrix, y: np.ndarray, *, chunk_rows: int = 100_000
) -> None:
    """Write CSR rows as a one-based svmlight file (for benchmarks and tests).

    Written in chunks with scikit-learn's writer so memory stays bounded."""
    from sklearn.datasets import dump_svmlight_file

    with open(path, "wb") as f:
        for a in range(0, X.shape[0], chunk_rows):
            dump_svmlight_file(
                X[a : a + chunk_rows], y[a : a + chunk_rows], f, zero_based=False
            )
