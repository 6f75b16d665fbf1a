"""Our own decoder of the shard format's Parquet data pages, checking as it copies.

pyarrow decodes a list column by materialising its repetition and definition levels
value by value (about 6 ns a non-zero for ``indices`` and ``values`` together, read
included, four times the cost of decompressing their pages), and the checks then read
the decoded block once more, out of the caches. The shard format writes those columns
plainly (PLAIN values, RLE / bit-packed levels, version 1 data pages, no dictionary), so
a row group is read here as: its pages' headers parsed (Thrift's compact protocol, a
few pages a column), each page decompressed by pyarrow's codec, the row offsets found
from the repetition levels run by run, and the values copied out of the page by a
compiled loop that checks them in the same pass (indices in range and increasing within
their rows, values finite). Only that layout is read here: :func:`read_row_group` raises
:class:`Unsupported` for anything else (another writer's layout, a dictionary page, a
version 2 page, a codec not mapped below) and for bytes that do not decode, and the
reader then decodes the row group with pyarrow and checks it as a whole. Every
position this module and its kernels derive from a file's bytes is checked against
the buffer before it is read.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from bigrate.data import _kernels as K
from bigrate.errors import DataError

#: Parquet codec name (as pyarrow's metadata gives it) -> pyarrow codec; pyarrow names
#: the LZ4_RAW codec "LZ4" (and the older Hadoop-framed LZ4 "LZ4_HADOOP", not read here)
_CODECS = {
    "UNCOMPRESSED": None,
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "ZSTD": "zstd",
    "BROTLI": "brotli",
    "LZ4": "lz4_raw",
}
#: shard column -> (its leaf column's path, physical type, dtype, repeated?)
_LEAVES = {
    "row_id": ("row_id", "INT64", np.int64, False),
    "label": ("label", "INT32", np.int32, False),
    "indices": ("indices.list.element", "INT32", np.int32, True),
    "values": ("values.list.element", "FLOAT", np.float32, True),
}
_DATA_PAGE = 0
_PLAIN = 0
_RLE = 3


_local = threading.local()


def _empty(n: int, dtype) -> np.ndarray:
    """An uninitialised array from pyarrow's memory pool, which keeps freed memory for
    the next row group; NumPy's allocations of this size are fresh pages, faulted in
    anew, in a process whose malloc returns freed memory at once (Dask's workers)."""
    dtype = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(max(n, 1) * dtype.itemsize), dtype)[:n]


def _read(f, start: int, size: int) -> memoryview:
    """``size`` bytes of ``f`` from ``start``, into a buffer this thread reuses (what
    comes out of a row group is copied out of it before the next read). Not a memory
    map: a file truncated while mapped would end the process with SIGBUS, where a read
    gives a short count and a clear error."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        buf = _local.buf = np.empty(max(size, 1 << 20), np.uint8)
    view = memoryview(buf)[:size]
    f.seek(start)
    got = f.readinto(view) if hasattr(f, "readinto") else None
    if got is None:
        data = f.read(size)
        got = len(data)
        view[:got] = data
    if got != size:
        raise Unsupported("file shorter than its column chunks")
    return view


class _Chunk(NamedTuple):
    """One column chunk of a row group, as the file's footer describes it."""

    start: int  # its first page header, within the bytes read for the row group
    length: int  # bytes, headers included
    n_levels: int  # levels (values, with empty and null lists) in its pages
    max_def: int
    codec: pa.Codec | None
    most: int  # bytes of all its pages decompressed: no page can be larger


class Unsupported(Exception):
    """This row group is not in the layout read here (or its bytes do not decode):
    decode it with pyarrow instead."""


def layout(parquet_file) -> dict | None:
    """{shard column: (leaf column index, max definition level)} of a file whose
    schema this decoder reads, else None."""
    schema = parquet_file.schema
    by_path = {schema.column(i).path: i for i in range(len(schema))}
    out = {}
    for name, (leaf, physical, _, repeated) in _LEAVES.items():
        i = by_path.get(leaf)
        if i is None:
            return None
        col = schema.column(i)
        if col.physical_type != physical or col.max_repetition_level != int(repeated):
            return None
        # a list of required elements: 1 (a required list) or 2 (a nullable one)
        if col.max_definition_level not in ((1, 2) if repeated else (0,)):
            return None
        out[name] = (i, col.max_definition_level)
    return out


# -- Thrift compact protocol (page headers) -------------------------------------------
def _varint(b: bytes, p: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        x = b[p]
        p += 1
        value |= (x & 0x7F) << shift
        if x < 0x80:
            return value, p
        shift += 7
        if shift > 63:
            raise Unsupported("varint too long")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(b: bytes, p: int, t: int, depth: int, in_list: bool = False) -> int:
    if t in (1, 2):  # a boolean field carries its value in the type; a list's, a byte
        return p + in_list
    if t == 3:
        return p + 1
    if t in (4, 5, 6):
        return _varint(b, p)[1]
    if t == 7:
        return p + 8
    if t == 8:
        n, p = _varint(b, p)
        return p + n
    if t in (9, 10):
        h = b[p]
        p += 1
        n, et = h >> 4, h & 15
        if n == 15:
            n, p = _varint(b, p)
        if n > len(b) - p:  # every element takes a byte at least
            raise Unsupported("list longer than the bytes left")
        for _ in range(n):
            p = _skip(b, p, et, depth, True)
        return p
    if t == 12:
        return _struct(b, p, depth + 1)[1]
    raise Unsupported(f"Thrift type {t}")


def _struct(b: bytes, p: int, depth: int = 0) -> tuple[dict, int]:
    """The integer and struct fields of a compact-protocol struct (others skipped)."""
    if depth > 8:  # a page header nests three deep
        raise Unsupported("structs nested too deep")
    out: dict = {}
    fid = 0
    while True:
        h = b[p]
        p += 1
        if h == 0:
            return out, p
        t, delta = h & 15, h >> 4
        if delta:
            fid += delta
        else:
            v, p = _varint(b, p)
            fid = _zigzag(v)
        if t in (5, 6):
            v, p = _varint(b, p)
            out[fid] = _zigzag(v)
        elif t == 12:
            out[fid], p = _struct(b, p, depth + 1)
        else:
            p = _skip(b, p, t, depth)


def _page_header(b: bytes, p: int) -> tuple[int, int, int, int, int]:
    """(page type, uncompressed size, compressed size, level count, position of the
    page's data) of the page header at ``p``."""
    try:
        h, p = _struct(b, p)
    except IndexError:
        raise Unsupported("page header runs past the column chunk") from None
    dp = h.get(5, {})
    if not isinstance(dp, dict) or h.get(1) != _DATA_PAGE:
        raise Unsupported(f"page type {h.get(1)}")
    if dp.get(2) != _PLAIN or dp.get(3, _RLE) != _RLE or dp.get(4, _RLE) != _RLE:
        raise Unsupported("page encodings")
    sizes = h.get(2), h.get(3), dp.get(1)
    if not all(isinstance(v, int) for v in sizes):
        raise Unsupported("page sizes")
    return (h[1], *sizes, p)


def _section(page: np.ndarray, p: int) -> tuple[int, int]:
    """(start, end) of the length-prefixed level section at ``p`` of a page."""
    if p + 4 > len(page):
        raise Unsupported("level section past the page")
    n = int.from_bytes(page[p : p + 4].tobytes(), "little")
    if n > len(page) - p - 4:
        raise Unsupported("level section past the page")
    return p + 4, p + 4 + n


def _all_elements(page: np.ndarray, start: int, end: int, n: int, max_def: int) -> bool:
    """Is the definition-level section ``page[start:end]`` one run of ``max_def`` over
    the page's ``n`` levels (no empty or null list: how a writer stores a page of rows
    with at least one element each)?"""
    head = page[start : min(end, start + 11)].tobytes()
    try:
        h, q = _varint(head, 0)
        return h & 1 == 0 and h >> 1 >= n and head[q] == max_def
    except IndexError:
        return False


def _pages(buf, c: _Chunk):
    """(level count, decompressed bytes) of each data page of the column chunk ``c``
    (a corrupt header cannot make us allocate more than the chunk's total)."""
    pos, end = c.start, c.start + c.length
    k = 0
    while k < c.n_levels:
        _, usize, csize, nv, pos = _page_header(buf, pos)
        if (
            not 0 < nv <= c.n_levels - k
            or not 0 <= csize <= end - pos
            or not 0 <= usize <= c.most
        ):
            raise Unsupported("page sizes")
        raw = buf[pos : pos + csize]
        pos += csize
        if c.codec is None:
            page = np.frombuffer(raw, np.uint8)
        else:
            try:
                page = np.frombuffer(c.codec.decompress(raw, usize), np.uint8)
            except (pa.ArrowException, ValueError, OSError):
                raise Unsupported("page does not decompress") from None
        if len(page) != usize:
            raise Unsupported("page size")
        yield nv, page
        k += nv
    if pos != end:
        raise Unsupported("column chunk length")


def _required(buf, c: _Chunk, rows: int, dtype) -> np.ndarray:
    """The values of a required column of ``rows`` values (pages of PLAIN values)."""
    if c.n_levels != rows:
        raise Unsupported("column length")
    values = _empty(rows, dtype)
    out = values.view(np.uint8)
    filled = 0
    for nv, page in _pages(buf, c):
        if len(page) != nv * values.itemsize:
            raise Unsupported("values' length")
        out[filled : filled + len(page)] = page
        filled += len(page)
    return values


def _copy_indices(src, out, lo, offsets, r0, r1, n_features) -> bool:
    """Copy one page's indices into ``out[lo:]``, checking them in the same pass (in
    range, increasing within their rows, which are ``offsets[r0:r1]``)."""
    return K.copy_indices_checked(src, out, lo, offsets, r0, r1, n_features)


def _copy_values(src, out) -> bool:
    """Copy one page's float32 values into ``out``, checking in the same pass that
    they are finite."""
    return K.copy_bits_below(
        src.view(np.int32), out.view(np.int32), np.int32(0x7FFFFFFF),
        np.int32(0x7F800000),
    )  # fmt: skip


def _list_column(buf, c: _Chunk, rows: int, dtype, n_features: int) -> tuple:
    """(row offsets, indices, each page's (level count, level bytes, element count),
    all indices valid) of the ``indices`` list column. A page whose levels are all
    elements (the common case) is read run by run from its repetition levels; others
    have their levels expanded first. Each page's indices are checked as they are
    copied out (the result's last item is False when one is not valid: the caller then
    walks the block to name the row)."""
    offsets = _empty(rows + 1, np.int32)
    values = _empty(c.n_levels, dtype)
    size = values.itemsize
    row = nnz = 0
    levels = []
    ok = True
    for nv, page in _pages(buf, c):
        row0 = row
        r0, r1 = _section(page, 0)
        d0, d1 = _section(page, r1)
        if _all_elements(page, d0, d1, nv, c.max_def):
            row = K.dense_list_rows(page, r0, r1, nv, offsets, row, nnz)
            present = nv
        else:
            rep = np.empty(nv, np.uint8)
            dfn = np.empty(nv, np.uint8)
            if (
                K.expand_levels(page, r0, r1, 1, rep) < 0
                or K.expand_levels(page, d0, d1, c.max_def.bit_length(), dfn) < 0
            ):
                raise Unsupported("levels")
            row, after = K.list_rows(rep, dfn, c.max_def, offsets, row, nnz)
            present = after - nnz
        if row < 0 or len(page) - d1 != present * size:
            raise Unsupported("levels or values' length")
        src = page[d1:].view(dtype)
        ok &= _copy_indices(src, values, nnz, offsets, row0, row, n_features)
        nnz += present
        levels.append((nv, page[:d1], present))
    offsets[rows] = nnz
    if row != rows or offsets[0] != 0 or nnz >= 2**31:
        raise Unsupported("rows")
    return offsets, values[:nnz], levels, ok


def _sibling(buf, c: _Chunk, levels: list, nnz: int, dtype) -> tuple:
    """(elements, all finite) of the ``values`` list column, whose pages must carry the
    same levels, byte for byte, as ``levels`` (those of ``indices``): the same rows, so
    only its values are read, each page checked as it is copied out. Raises
    :class:`Unsupported` otherwise (pyarrow then compares the rows)."""
    values = _empty(nnz, dtype)
    filled = i = 0
    ok = True
    for nv, page in _pages(buf, c):
        if i == len(levels) or levels[i][0] != nv:
            raise Unsupported("pages differ")
        _, lv, present = levels[i]
        m = len(lv)
        if len(page) - m != present * values.itemsize or not np.array_equal(
            page[:m], lv
        ):
            raise Unsupported("levels differ")
        ok &= _copy_values(page[m:].view(dtype), values[filled : filled + present])
        filled += present
        i += 1
    if i != len(levels) or filled != nnz:
        raise Unsupported("levels differ")
    return values, ok


def _chunks(metadata, g: int, cols: dict) -> tuple[dict, int, int]:
    """The column chunks of row group ``g`` as the footer describes them, and the byte
    range [lo, hi) of the file that holds them all."""
    rg = metadata.row_group(g)
    found = {}
    for name, (i, max_def) in cols.items():
        c = rg.column(i)
        if c.has_dictionary_page or c.num_values < 0:
            raise Unsupported("dictionary page")
        if c.compression not in _CODECS:
            raise Unsupported(f"codec {c.compression}")
        codec = _CODECS[c.compression]
        found[name] = (c.data_page_offset, c.total_compressed_size, c.num_values,
                       max_def, None if codec is None else pa.Codec(codec),
                       c.total_uncompressed_size)  # fmt: skip
    lo = min(start for start, *_ in found.values())
    hi = max(start + length for start, length, *_ in found.values())
    if lo < 0 or hi <= lo:
        raise Unsupported("column chunk offsets")
    lo -= lo % 4096  # reading from the page cache at an unaligned offset is 2x slower
    return found, lo, hi


def row_group_range(metadata, g: int, cols: dict) -> tuple[int, int]:
    """The bytes [lo, hi) of the file that :func:`read_row_group` reads for row group
    ``g``: one ranged request fetches them from object storage."""
    return _chunks(metadata, g, cols)[1:]


class RangeBuffer:
    """The bytes [lo, lo + len(data)) of a file, fetched already, read as the file:
    what :func:`read_row_group` takes in place of an open file."""

    def __init__(self, lo: int, data: bytes):
        self.lo, self.data, self.pos = lo, memoryview(data), lo

    def seek(self, pos: int) -> None:
        self.pos = pos

    def readinto(self, view) -> int:
        a = self.pos - self.lo
        if a < 0:
            return 0
        got = self.data[a : a + len(view)]
        view[: len(got)] = got
        self.pos += len(got)
        return len(got)


def read_row_group(f, metadata, g: int, cols: dict, n_features: int,
                   path: str | None = None) -> tuple:  # fmt: skip
    """(offsets, indices, values, labels, row_ids, rows checked) of row group ``g`` read
    from the open binary file ``f`` (``cols`` from :func:`layout`); raises
    :class:`Unsupported` when the row group is not in the layout read here or does not
    decode, and :class:`~bigrate.errors.DataError` naming ``path`` for a label that
    does not fit the format's int8. "Rows checked" is True when every index was found
    in [0, n_features) and increasing within its row and every value finite, page by
    page as they were decoded; the labels' values are checked by the caller."""
    rows = metadata.row_group(g).num_rows
    found, lo, hi = _chunks(metadata, g, cols)
    buf = _read(f, lo, hi - lo)
    ch = {name: _Chunk(start - lo, *rest) for name, (start, *rest) in found.items()}
    row_id = _required(buf, ch["row_id"], rows, np.int64)
    labels = _required(buf, ch["label"], rows, np.int32)
    offsets, indices, levels, ok = _list_column(buf, ch["indices"], rows, np.int32,
                                                n_features)  # fmt: skip
    values, finite = _sibling(buf, ch["values"], levels, len(indices), np.float32)
    wide = (labels < -128) | (labels > 127)
    if wide.any():
        r = int(np.argmax(wide))
        raise DataError(
            f"row_id {int(row_id[r])} has label {int(labels[r])}, which does not fit "
            "the shard format's int8 labels (expected +1 or -1)",
            path=path,
        )
    return offsets, indices, values, labels.astype(np.int8), row_id, ok and finite
