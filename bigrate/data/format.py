"""The bigrate shard format: schema, row blocks, and Arrow <-> CSR conversion.

A dataset is a directory::

    manifest.json
    train/pos/part-00000.parquet
    train/neg/part-00000.parquet
    val/...  test/...

Every Parquet file has the columns

============  =====================  ============================================
``row_id``    int64                  stable, unique across the whole dataset
``label``     int8                   +1 (class ``pos``) or -1 (class ``neg``)
``indices``   list<int32>            0-based feature indices, sorted and unique
``values``    list<float32>          the matching values
``group``     string (optional)      subpopulation, e.g. for fairness constraints
============  =====================  ============================================

and row groups of ``row_group_size`` rows (default 32,768). The conversion to CSR reads
the Arrow list offsets and child arrays directly: no Python work per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

FORMAT_NAME = "bigrate-shards"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
CLASSES = ("pos", "neg")
CLASS_LABEL = {"pos": 1, "neg": -1}
DEFAULT_ROW_GROUP_SIZE = 32_768
DEFAULT_ROWS_PER_FILE = 262_144


@dataclass(frozen=True)
class ShardFile:
    """One shard file as the manifest records it; ``dataset`` is the dataset's root
    (local path or fsspec URL) once read, empty while the writer makes it."""

    path: str  # relative to the root
    split: str
    cls: str
    rows: int
    nnz: int
    row_groups: int
    bytes: int
    sha256: str
    dataset: str = ""

    @property
    def url(self) -> str:
        return self.dataset.rstrip("/") + "/" + self.path

    def to_json(self) -> dict:
        """The manifest's record (the class under the key "class", no root)."""
        return {
            "path": self.path,
            "split": self.split,
            "class": self.cls,
            "rows": self.rows,
            "nnz": self.nnz,
            "row_groups": self.row_groups,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, rec: dict, dataset: str = "") -> ShardFile:
        return cls(
            path=rec["path"],
            split=rec["split"],
            cls=rec["class"],
            rows=int(rec["rows"]),
            nnz=int(rec["nnz"]),
            row_groups=int(rec["row_groups"]),
            bytes=int(rec["bytes"]),
            sha256=rec["sha256"],
            dataset=dataset,
        )


def schema(has_group: bool) -> pa.Schema:
    """The Arrow schema of a shard file."""
    fields = [
        pa.field("row_id", pa.int64(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),
        pa.field("indices", pa.list_(pa.field("item", pa.int32(), nullable=False))),
        pa.field("values", pa.list_(pa.field("item", pa.float32(), nullable=False))),
    ]
    if has_group:
        fields.append(pa.field("group", pa.string()))
    return pa.schema(fields)


@dataclass
class RowBlock:
    """Rows of a sparse dataset held in memory: CSR features plus per-row columns.

    Attributes
    ----------
    X : scipy.sparse.csr_matrix of shape (n_rows, n_cols), float32, int32 indices
    y : ndarray of shape (n_rows,), int8 in {+1, -1}
    row_id : ndarray of shape (n_rows,), int64
    group : ndarray of shape (n_rows,) of str, or None
    """

    X: sp.csr_matrix
    y: np.ndarray
    row_id: np.ndarray
    group: np.ndarray | None = None

    def __len__(self) -> int:
        return self.X.shape[0]

    def take(self, rows: np.ndarray) -> RowBlock:
        """Rows selected by an integer index array or boolean mask, order kept."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return RowBlock(
            X=self.X[rows],
            y=self.y[rows],
            row_id=self.row_id[rows],
            group=None if self.group is None else self.group[rows],
        )

    def slice(self, start: int, stop: int) -> RowBlock:
        """Rows ``start:stop`` without copying the features: the CSR arrays of the
        result are views of this block's (only the row offsets are new)."""
        X = self.X
        a, b = int(X.indptr[start]), int(X.indptr[stop])
        Xs = sp.csr_matrix(
            (X.data[a:b], X.indices[a:b], X.indptr[start : stop + 1] - a),
            shape=(stop - start, X.shape[1]),
            copy=False,
        )
        return RowBlock(
            X=Xs,
            y=self.y[start:stop],
            row_id=self.row_id[start:stop],
            group=None if self.group is None else self.group[start:stop],
        )

    @staticmethod
    def concat(blocks: list[RowBlock]) -> RowBlock:
        """Stack blocks row-wise (the widest block sets the number of columns)."""
        if len(blocks) == 1:
            return blocks[0]
        width = max(b.X.shape[1] for b in blocks)
        mats = [_widen(b.X, width) for b in blocks]
        X = sp.vstack(mats, format="csr", dtype=np.float32)
        X.indices = X.indices.astype(np.int32, copy=False)
        groups = [b.group for b in blocks]
        return RowBlock(
            X=X,
            y=np.concatenate([b.y for b in blocks]),
            row_id=np.concatenate([b.row_id for b in blocks]),
            group=None if groups[0] is None else np.concatenate(groups),
        )


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: every array of a :class:`RowSequence`'s lists has
    the one type the cached list kernels were compiled for (Arrow's are read-only)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _reused(buffers: dict, key: str, size: int, dtype) -> np.ndarray:
    """The first ``size`` entries of the kept array ``buffers[key]``, grown by a
    quarter beyond the need when too small (or of another dtype)."""
    have = buffers.get(key)
    if have is None or len(have) < size or have.dtype != dtype:
        have = buffers[key] = np.empty(size + size // 4 + 16, dtype=dtype)
    return have[:size]


class RowSequence:
    """Row blocks read as one sequence of rows without stacking them: the source that
    :func:`gather` copies chosen rows from, and that the SGD step kernels read rows
    from where they lie (a sampler's buffer of decoded row groups is never
    concatenated).

    The kernels take the blocks as numba typed lists. They are built by compiled,
    cached functions (:func:`bigrate.data._kernels.block_lists`): the typed list's own
    Python methods compile on their first use in every process, which a fresh
    cluster worker paid in its first round (0.7 s to make lists, 1.8 s more to copy and
    extend them)."""

    def __init__(self, blocks: list[RowBlock]):
        if not blocks:
            raise ValueError("a RowSequence needs at least one block")
        self.starts = np.zeros(len(blocks) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in blocks], out=self.starts[1:])
        self.width = max(b.X.shape[1] for b in blocks)
        self.y = np.concatenate([b.y for b in blocks])
        self.row_id = np.concatenate([b.row_id for b in blocks])
        groups = [b.group for b in blocks]
        self.group = None if groups[0] is None else np.concatenate(groups)
        self._arrays = [
            (
                _read_only(b.X.indptr.astype(np.int64)),
                _read_only(np.ascontiguousarray(b.X.indices, dtype=np.int32)),
                _read_only(np.ascontiguousarray(b.X.data, dtype=np.float32)),
            )
            for b in blocks
        ]
        self._lists()

    def _lists(self) -> None:
        from bigrate.data import _kernels as K

        self._ptrs, self._inds, self._vals = K.block_lists(*self._arrays[0])
        for arrays in self._arrays[1:]:
            K.append_block(self._ptrs, self._inds, self._vals, *arrays)

    @classmethod
    def joined(cls, seqs: list[RowSequence]) -> RowSequence:
        """The rows of ``seqs`` one sequence after the other, as one sequence whose
        blocks are theirs (the same arrays: no row is copied; only the labels and row
        ids are concatenated). Sequence k's position p is position
        ``offsets[k] + p`` of the result, ``offsets`` the start of each."""
        if not seqs:
            raise ValueError("joined needs at least one RowSequence")
        if len(seqs) == 1:
            return seqs[0]
        out = cls.__new__(cls)
        out.starts = np.concatenate(
            [[0]]
            + [
                s.starts[1:] + off
                for s, off in zip(seqs, cls.offsets(seqs), strict=True)
            ]
        ).astype(np.int64)
        out.width = max(s.width for s in seqs)
        out.y = np.concatenate([s.y for s in seqs])
        out.row_id = np.concatenate([s.row_id for s in seqs])
        out.group = (
            None if seqs[0].group is None else np.concatenate([s.group for s in seqs])
        )
        out._arrays = [a for s in seqs for a in s._arrays]
        out._lists()
        return out

    @staticmethod
    def offsets(seqs: list[RowSequence]) -> np.ndarray:
        """Where each of ``seqs`` starts in :meth:`joined` of them."""
        return np.concatenate([[0], np.cumsum([len(s) for s in seqs[:-1]])]).astype(
            np.int64
        )

    @property
    def blocks(self) -> tuple:
        """(indptr list, indices list, data list, starts): the sequence as the step
        kernels that read rows where they lie take it."""
        return self._ptrs, self._inds, self._vals, self.starts

    def __len__(self) -> int:
        return int(self.starts[-1])

    def row_nnz(self, rows: np.ndarray) -> int:
        """Non-zeros of the rows at positions ``rows`` (int64)."""
        from bigrate.data import _kernels as K

        return int(K.gathered_nnz(self._ptrs, self.starts, rows)) if len(rows) else 0


def gather(
    pieces: list[tuple[RowSequence, np.ndarray]], buffers: dict | None = None
) -> RowBlock:
    """One new block of the rows at positions ``rows`` of each ``(sequence, rows)``
    piece, the pieces one after the other and each piece's rows in the order given: a
    single copy of the rows taken (a compiled loop), however many blocks they come
    from.

    ``buffers``: a dict this function keeps the feature arrays in from call to call (the
    result's CSR arrays are views of them, valid until the next call with the same
    dict). A sampler that hands out chunk after chunk then writes into memory it has
    touched before instead of fresh pages (Dask's workers return freed memory to the
    system at once, so every fresh chunk page-faulted: a third of the copy's time)."""
    from bigrate.data import _kernels as K

    if not pieces:
        raise ValueError("gather needs at least one (sequence, rows) piece")
    pieces = [(s, np.asarray(r, dtype=np.int64)) for s, r in pieces]
    for s, r in pieces:
        if len(r) and (r.min() < 0 or r.max() >= len(s)):
            raise IndexError(
                f"rows to gather must lie in [0, {len(s)}), got {r.min()}..{r.max()}"
            )
    n = sum(len(r) for _, r in pieces)
    nnz = sum(s.row_nnz(r) for s, r in pieces)
    ptr_type = np.int32 if nnz < 2**31 else np.int64
    if buffers is None:
        out_ptr = np.empty(n + 1, dtype=ptr_type)
        out_indices = np.empty(nnz, dtype=np.int32)
        out_data = np.empty(nnz, dtype=np.float32)
    else:
        out_ptr = _reused(buffers, "indptr", n + 1, ptr_type)
        out_indices = _reused(buffers, "indices", nnz, np.int32)
        out_data = _reused(buffers, "data", nnz, np.float32)
    out_ptr[0] = 0
    row = nz = 0
    for s, r in pieces:
        if len(r):
            nz = K.gather_rows(s._ptrs, s._inds, s._vals, s.starts, r, out_ptr,
                               out_indices, out_data, row, nz)  # fmt: skip
            row += len(r)
    width = max(s.width for s, _ in pieces)
    X = sp.csr_matrix((out_data, out_indices, out_ptr), shape=(n, width), copy=False)
    return RowBlock(
        X=X,
        y=np.concatenate([s.y[r] for s, r in pieces]),
        row_id=np.concatenate([s.row_id[r] for s, r in pieces]),
        group=(
            None
            if pieces[0][0].group is None
            else np.concatenate([s.group[r] for s, r in pieces])
        ),
    )


def _widen(X: sp.csr_matrix, width: int) -> sp.csr_matrix:
    if X.shape[1] == width:
        return X
    return sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], width))


def block_to_table(block: RowBlock, has_group: bool) -> pa.Table:
    """Arrow table of a row block, built from the CSR arrays without per-row work."""
    X = block.X
    offsets = pa.array(X.indptr.astype(np.int32, copy=False), type=pa.int32())
    indices = pa.ListArray.from_arrays(
        offsets, pa.array(X.indices.astype(np.int32, copy=False), type=pa.int32())
    )
    values = pa.ListArray.from_arrays(
        offsets, pa.array(X.data.astype(np.float32, copy=False), type=pa.float32())
    )
    cols = [
        pa.array(block.row_id, type=pa.int64()),
        pa.array(block.y, type=pa.int8()),
        indices,
        values,
    ]
    if has_group:
        if block.group is None:
            raise ValueError("this dataset has a group column but the block has none")
        cols.append(pa.array(block.group, type=pa.string()))
    return pa.Table.from_arrays(cols, schema=schema(has_group))


def _list_parts(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets starting at 0, flat child values) of one Arrow list column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    offsets = np.asarray(col.offsets)
    start, end = int(offsets[0]), int(offsets[-1])
    flat = np.asarray(col.values)[start:end]
    if start:
        offsets = offsets - start
    return offsets, flat


_COLUMN_TYPES = {
    "row_id": pa.int64(),
    "label": pa.int8(),
    "indices": pa.list_(pa.int32()),
    "values": pa.list_(pa.float32()),
}


def _fail(message: str, path: str | None):
    from bigrate.errors import DataError

    raise DataError(message, path=path)


def check_block(
    offsets: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    labels: np.ndarray,
    row_id: np.ndarray,
    n_features: int,
    *,
    path: str | None = None,
    label: int | None = None,
    rows_checked: bool = False,
) -> None:
    """Check a decoded block before any compiled kernel indexes with it (vectorised,
    a few passes over the arrays): feature indices in [0, n_features), sorted and unique
    within every row, values finite, labels +1 / -1 (and ``label`` where the file holds
    one class). Raises :class:`~bigrate.errors.DataError` naming ``path`` and the row.
    ``rows_checked``: the decoder found the indices and values valid as it decoded them
    (:func:`bigrate.data.pages.read_row_group`), so only the rest is checked here."""
    from bigrate.data import _kernels as K

    nnz = len(indices)
    if len(offsets) != len(labels) + 1 or (len(offsets) and offsets[-1] != nnz):
        _fail("the rows' index lists do not match the row count", path)
    if rows_checked:
        status, k = K.ROWS_OK, -1
    else:
        status, k = K.check_rows(offsets, indices, values, n_features)
    if status != K.ROWS_OK:
        r = int(np.searchsorted(offsets, k, side="right")) - 1
        if status == K.INDEX_OUT_OF_RANGE:
            bad = indices[offsets[r] : offsets[r + 1]]
            j = int(bad[(bad < 0) | (bad >= n_features)][0])
            _fail(
                f"row_id {int(row_id[r])} has feature index {j}, outside "
                f"[0, {n_features}) (n_features in manifest.json): the manifest and "
                "the shards disagree; re-run the prep",
                path,
            )
        if status == K.INDEX_NOT_INCREASING:
            _fail(
                f"row_id {int(row_id[r])}: feature indices are not sorted and unique "
                "as the shard format requires",
                path,
            )
        _fail(f"row_id {int(row_id[r])} holds a NaN or infinite value", path)
    if label is not None:
        wrong = labels != label
    else:
        wrong = (labels != 1) & (labels != -1)
    if wrong.any():
        r = int(np.argmax(wrong))
        _fail(
            f"row_id {int(row_id[r])} has label {int(labels[r])}, expected "
            + (f"{label:+d} in this file" if label is not None else "+1 or -1"),
            path,
        )


def check_column_types(schema: pa.Schema, path: str | None = None) -> None:
    """Raise :class:`~bigrate.errors.DataError` naming ``path`` when a shard column
    present in ``schema`` has another type than the shard format's."""
    for name, typ in _COLUMN_TYPES.items():
        if name not in schema.names:
            continue
        got = schema.field(name).type
        same = (
            pa.types.is_list(got) and got.value_type == typ.value_type
            if pa.types.is_list(typ)
            else got == typ
        )
        if not same:
            _fail(
                f"column {name!r} has type {got}, the shard format requires {typ}",
                path,
            )


def arrays_to_block(
    offsets: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    y: np.ndarray,
    row_id: np.ndarray,
    n_features: int,
    *,
    group: np.ndarray | None = None,
    path: str | None = None,
    label: int | None = None,
    rows_checked: bool = False,
) -> RowBlock:
    """CSR row block of decoded shard columns, checked by :func:`check_block` first
    (``path`` names the file in errors; ``label`` is the class label every row of the
    file must have; ``rows_checked`` as there)."""
    check_block(offsets, indices, values, y, row_id, n_features, path=path, label=label,
                rows_checked=rows_checked)  # fmt: skip
    X = sp.csr_matrix(
        (values, indices, offsets), shape=(len(offsets) - 1, n_features), copy=False
    )
    return RowBlock(X=X, y=y, row_id=row_id, group=group)


def table_to_block(
    table: pa.Table | pa.RecordBatch,
    n_features: int,
    *,
    path: str | None = None,
    label: int | None = None,
) -> RowBlock:
    """CSR row block of an Arrow table or record batch in the shard schema, checked by
    :func:`check_block` (``path`` names the file in errors; ``label`` is the class
    label every row of the file must have)."""
    check_column_types(table.schema, path)
    offsets, indices = _list_parts(table.column("indices"))
    voffsets, values = _list_parts(table.column("values"))
    if len(voffsets) != len(offsets) or voffsets[-1] != offsets[-1]:
        _fail("shard columns 'indices' and 'values' have different lengths", path)
    if np.any(voffsets != offsets):
        _fail("shard columns 'indices' and 'values' differ in a row's length", path)
    group = None
    if "group" in table.schema.names:
        group = np.asarray(table.column("group").to_numpy(zero_copy_only=False))
    return arrays_to_block(
        offsets,
        indices,
        values,
        np.asarray(table.column("label").to_numpy()),
        np.asarray(table.column("row_id").to_numpy()),
        n_features,
        group=group,
        path=path,
        label=label,
    )
