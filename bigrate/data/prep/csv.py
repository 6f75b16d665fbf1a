"""Dense numeric CSV / TSV (and Percolator pin files) -> shards, streaming.

The file is parsed block by block by Arrow's CSV reader (compiled, bounded memory); every
feature column must be numeric. Zeros are not stored (the shards are sparse), so a dense
matrix comes back exactly from ``to_csr(...).X.toarray()``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import scipy.sparse as sp

from bigrate.data.format import DEFAULT_ROW_GROUP_SIZE, DEFAULT_ROWS_PER_FILE
from bigrate.data.prep.common import LabelMapper, Progress, Source, finish_block
from bigrate.data.split import PoolAndTest
from bigrate.data.writer import DatasetWriter
from bigrate.errors import DataError


def _read_head(path, skip_rows: int, delimiter: str) -> list[str]:
    """The fields of the first line after ``skip_rows`` lines."""
    with Source(path) as src:
        for _ in range(skip_rows):
            src.stream.readline()
        first = src.stream.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    if not first:
        raise DataError("the file is empty", path=str(path))
    return [f.strip() for f in first.split(delimiter)]


def _resolve(spec, names: list[str], what: str, path) -> str:
    if spec in names:
        return spec
    try:
        k = int(spec)
    except (TypeError, ValueError):
        k = None
    if k is not None and -len(names) <= k < len(names):
        return names[k]
    raise DataError(
        f"{what} {spec!r} is not a column; columns are {names[:12]}"
        + (" ..." if len(names) > 12 else ""),
        path=str(path),
    )


def _line_blocks(stream, skip_lines: int, block_bytes: int):
    """The stream's bytes after ``skip_lines`` lines, in blocks of about ``block_bytes``
    that end at a line end (the last block may not).

    The blocks are read here, in the calling thread, and Arrow parses each from memory.
    Arrow's own streaming reader would read the (Python) file ahead on its IO threads;
    such a thread still reading when an error ends the process needs the GIL during
    interpreter shutdown and aborts the process (SIGABRT, "terminate called without an
    active exception"), and closing the reader does not wait for it.
    """
    for _ in range(skip_lines):
        if not stream.readline():
            return
    rest = b""
    while True:
        buf = stream.read(block_bytes)
        if not buf:
            if rest:
                yield rest
            return
        buf = rest + buf
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        if cut == 0:
            rest = buf
            continue
        rest = buf[cut:]
        yield buf[:cut]


def _parse_block(block: bytes, names, delimiter, convert_options) -> pa.Table:
    return pacsv.read_csv(
        pa.BufferReader(block),
        read_options=pacsv.ReadOptions(column_names=names),
        parse_options=pacsv.ParseOptions(delimiter=delimiter),
        convert_options=convert_options,
    )


def _locate_bad_cell(block, path, line0, delimiter, names, column, na_values):
    """Re-read ``column`` of ``block`` (whose first row is on line ``line0``) as text
    and find the first cell that is not a number."""
    copts = pacsv.ConvertOptions(
        column_types={column: pa.string()},
        include_columns=[column],
        null_values=list(na_values),
        strings_can_be_null=True,
    )
    cells = _parse_block(block, names, delimiter, copts).column(0).to_pylist()
    for k, v in enumerate(cells):
        if v is None:
            continue
        try:
            float(v)
        except ValueError:
            return DataError(
                f"cell {v!r} is not a number",
                path=str(path),
                line=line0 + k,
                column=column,
            )
    return None


def _parse_error(
    e: pa.ArrowInvalid, block, path, line0, delimiter, names, feats, na_values
) -> DataError:
    """The DataError for a block Arrow could not parse: the file, line and column of
    the first cell that is not a number when that is the cause."""
    msg = str(e)
    if "In CSV column #" in msg:
        k = int(msg.split("In CSV column #")[1].split(":")[0])
        col = names[k] if k < len(names) else None
        if col is not None and col in feats:
            bad = _locate_bad_cell(block, path, line0, delimiter, names, col, na_values)
            if bad is not None:
                return bad
    return DataError(f"could not parse the file: {msg}", path=str(path))


def prep_csv(
    file: str | os.PathLike,
    out: str | os.PathLike,
    *,
    label_column: str,
    group_column: str | None = None,
    drop_columns: Sequence[str] = (),
    header: bool = True,
    delimiter: str = ",",
    skip_rows: int = 0,
    na_values: Sequence[str] = ("", "NA", "?"),
    drop_missing: bool = False,
    positive_labels: Sequence[str] | None = None,
    negative_labels: Sequence[str] | None = None,
    test_file: str | os.PathLike | None = None,
    split: str | dict | None = None,
    seed: int = 0,
    l2_normalize: bool = False,
    standardize: bool = False,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    compression: str = "lz4",
    block_bytes: int = 8 << 20,
    overwrite: bool = False,
    progress: bool = True,
    name: str | None = None,
    command: str | None = None,
    label_transform=None,
) -> dict:
    """Convert a dense numeric CSV file into a sharded dataset; returns the manifest.

    Columns are named by the header line, or by their 0-based position with
    ``header=False`` (``label_column="-1"`` is the last column). Every column other than
    the label, the group and ``drop_columns`` is a feature and must be numeric: a cell
    that is not names its file, line and column. Missing cells (``na_values``) are an
    error unless ``drop_missing``, which drops their rows and counts them in the
    manifest. ``test_file`` (same layout) goes wholly to the test split.
    ``label_transform`` maps each raw label string before the label mapping (e.g.
    stripping the trailing dot of UCI adult.test labels). ``standardize`` maps every
    feature to ``(x - mean) / std`` with the mean and standard deviation of the train
    split only, applied to every split; the map is stored in the manifest, and a model
    trained on the dataset applies it to the data it scores (``bigrate predict``).
    """
    if standardize and l2_normalize:
        raise ValueError(
            "standardize and l2_normalize exclude each other: choose one preprocessing"
        )
    route = PoolAndTest(split, seed, [test_file] if test_file else [])
    head = _read_head(file, skip_rows, delimiter)
    names = head if header else [str(i) for i in range(len(head))]
    if len(set(names)) != len(names):
        raise DataError(
            f"duplicate column names in the header: {names}", path=str(file)
        )
    label = _resolve(label_column, names, "label column", file)
    group = (
        None
        if group_column is None
        else _resolve(group_column, names, "group column", file)
    )
    drops = {_resolve(c, names, "dropped column", file) for c in drop_columns}
    feats = [c for c in names if c not in drops and c != label and c != group]
    if not feats:
        raise DataError("no feature columns are left", path=str(file))
    mapper = LabelMapper(positive_labels, negative_labels)
    sources = []
    dropped = 0
    row_id = 0
    prog = Progress("prep csv", enabled=progress)
    types = {c: pa.float64() for c in feats}
    types[label] = pa.string()
    if group is not None:
        types[group] = pa.string()
    with DatasetWriter(
        out,
        splits=route.splits,
        has_group=group is not None,
        overwrite=overwrite,
        row_group_size=row_group_size,
        rows_per_file=rows_per_file,
        compression=compression,
        standardize=len(feats) if standardize else None,
    ) as w:
        for role, path in (("pool", file), ("test", test_file)):
            if path is None:
                continue
            if path != file:
                other = _read_head(path, skip_rows, delimiter)
                if len(other) != len(head) or (header and other != head):
                    raise DataError(
                        f"header/width {other[:6]}... differs from {file}",
                        path=str(path),
                    )
            copts = pacsv.ConvertOptions(
                column_types=types,
                null_values=list(na_values),
                strings_can_be_null=True,
                include_columns=feats + [label] + ([group] if group else []),
            )
            line0 = skip_rows + (1 if header else 0) + 1
            seen = 0
            with Source(path) as src:
                for block in _line_blocks(
                    src.stream, skip_rows + (1 if header else 0), block_bytes
                ):
                    try:
                        table = _parse_block(block, names, delimiter, copts)
                    except pa.ArrowInvalid as e:
                        raise _parse_error(
                            e,
                            block,
                            path,
                            line0 + seen,
                            delimiter,
                            names,
                            feats,
                            na_values,
                        ) from None
                    for rb in table.to_batches():
                        n = rb.num_rows
                        base = line0 + seen

                        def where(r, base=base, path=path):
                            return str(path), base + r

                        dense = (
                            np.column_stack(
                                [
                                    rb.column(c).to_numpy(zero_copy_only=False)
                                    for c in feats
                                ]
                            )
                            if n
                            else np.zeros((0, len(feats)))
                        )
                        lab = rb.column(label)
                        grp = rb.column(group) if group else None
                        missing = _nulls(rb, feats)
                        # NaN / inf cells ("nan", "inf" parse as numbers) count as
                        # missing: named with their column, dropped by drop_missing
                        missing |= ~np.isfinite(dense).all(axis=1)
                        missing |= _isnull(lab)
                        if grp is not None:
                            missing |= _isnull(grp)
                        if missing.any():
                            if not drop_missing:
                                r = int(np.flatnonzero(missing)[0])
                                col = _first_missing_col(
                                    rb, feats + [label] + ([group] if group else []), r
                                )
                                raise DataError(
                                    "missing, NaN or infinite value (pass "
                                    "--drop-missing to drop such rows)",
                                    path=str(path),
                                    line=base + r,
                                    column=col,
                                )
                            keep = ~missing
                            dropped += int(missing.sum())
                            rows_line = np.flatnonzero(keep)

                            def where(r, base=base, rows_line=rows_line, path=path):  # noqa: F811
                                return str(path), base + int(rows_line[r])

                            dense = dense[keep]
                            lab = lab.filter(pa.array(keep))
                            if grp is not None:
                                grp = grp.filter(pa.array(keep))
                        raw = np.asarray(lab.to_pylist(), dtype=object)
                        if label_transform is not None:
                            raw = np.asarray(
                                [label_transform(v) for v in raw], dtype=object
                            )
                        raw = raw.astype(str)
                        g = (
                            None
                            if grp is None
                            else np.asarray(grp.to_pylist(), dtype=object)
                        )
                        X = sp.csr_matrix(dense)
                        rows = finish_block(
                            X, raw, row_id, mapper, l2_normalize, where, group=g
                        )
                        row_id += len(rows)
                        seen += n
                        route.add(w, role, rows)
                        prog.update(len(rows))
                sources.append({**src.info(), "role": role})
            if role == "pool":
                route.finish(w)
        mapper.check_two_classes()
        prog.close("done")
        return w.commit(
            n_features=len(feats),
            label_mapping=mapper.manifest(),
            preprocessing={
                "l2_normalize": bool(l2_normalize),
                "split": route.manifest(),
                "feature_columns": feats,
                "label_column": label,
                "group_column": group,
                "dropped_columns": sorted(drops),
                "rows_dropped_for_missing_values": dropped,
            },
            sources=sources,
            command=command,
            name=name,
        )


def _isnull(col: pa.Array) -> np.ndarray:
    return np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _nulls(rb: pa.RecordBatch, cols: list[str]) -> np.ndarray:
    out = np.zeros(rb.num_rows, dtype=bool)
    for c in cols:
        a = rb.column(c)
        if a.null_count:
            out |= _isnull(a)
    return out


def _first_missing_col(rb: pa.RecordBatch, cols: list[str], r: int) -> str | None:
    """The first of ``cols`` whose cell in row ``r`` is empty, NaN or infinite."""
    for c in cols:
        v = rb.column(c)[r]
        if not v.is_valid:
            return c
        x = v.as_py()
        if isinstance(x, float) and not np.isfinite(x):
            return c
    return None


PIN_METADATA = (
    "SpecId",
    "Label",
    "ScanNr",
    "ExpMass",
    "Mass",
    "CalcMass",
    "Peptide",
    "Proteins",
)


def prep_pin(file, out, *, spectra: bool = False, **kw) -> dict:
    """A Percolator/mokapot pin file (tab-separated, header ``SpecId Label ScanNr ...``):
    targets (Label 1) become the positive class and decoys (Label -1) the negative one;
    the metadata columns (SpecId, ScanNr, ExpMass, Mass/CalcMass, Peptide, Proteins) are
    dropped, as mokapot does, and the rest are features. ``spectra`` keeps ScanNr as the
    group column, so that scores can be put through target-decoy competition (the best
    PSM of each spectrum; :func:`bigrate.metrics.best_per_group`)."""
    head = _read_head(file, 0, "\t")
    if "Label" not in head or "SpecId" not in head:
        raise DataError(
            "not a pin file: the header has no SpecId and Label columns", path=str(file)
        )
    if spectra and "ScanNr" not in head:
        raise DataError(
            "spectra=True needs a ScanNr column, and the header has none",
            path=str(file),
        )
    group = "ScanNr" if spectra else None
    drops = [c for c in head if c in PIN_METADATA and c not in ("Label", group)]
    kw.setdefault("positive_labels", ["1"])
    kw.setdefault("negative_labels", ["-1"])
    return prep_csv(
        file,
        out,
        label_column="Label",
        group_column=group,
        drop_columns=drops,
        delimiter="\t",
        header=True,
        **kw,
    )
