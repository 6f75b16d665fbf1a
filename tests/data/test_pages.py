"""Our decoder of the shard format's Parquet pages (bigrate.data.pages) against
pyarrow's decoding of the same files, its checks against the whole-block checks, and
its bytes flipped: every outcome is the same rows, a DataError naming the file, or
pyarrow's decoding of a layout it does not read, never a crash."""

import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from bigrate import ShardedDataset
from bigrate.data import _kernels as K
from bigrate.data import pages
from bigrate.data.format import RowBlock, _list_parts, block_to_table, schema
from bigrate.errors import DataError
from tests.conftest import REPO

N_FEATURES = 500


def _block(rng, rows, empty=0.1, long_rows=2):
    """Random rows with sorted unique indices, some empty, a few long (spanning
    pages)."""
    lens = rng.integers(1, 40, rows)
    lens[rng.random(rows) < empty] = 0
    lens[rng.choice(rows, long_rows, replace=False)] = N_FEATURES - 3
    indptr = np.r_[0, np.cumsum(lens)].astype(np.int32)
    indices = np.concatenate(
        [np.sort(rng.choice(N_FEATURES, n, replace=False)) for n in lens]
    ).astype(np.int32)
    X = sp.csr_matrix(
        (rng.standard_normal(indptr[-1]).astype(np.float32), indices, indptr),
        shape=(rows, N_FEATURES),
    )
    return RowBlock(X=X, y=np.ones(rows, np.int8), row_id=np.arange(rows) * 3)


def _write(path, table, compression="lz4", page=4096, row_group=300, **kw):
    """A file in the shard format's layout (no dictionary, PLAIN values, v1 pages),
    with small pages so that rows cross page boundaries."""
    with pq.ParquetWriter(
        path,
        table.schema,
        compression=compression,
        use_dictionary=False,
        data_page_size=page,
        **kw,
    ) as w:
        w.write_table(table, row_group_size=row_group)  # fmt: skip


def _pyarrow_parts(path, g):
    t = pq.ParquetFile(path).read_row_group(g)
    offsets, indices = _list_parts(t.column("indices"))
    _, values = _list_parts(t.column("values"))
    return (
        offsets,
        indices,
        values,
        t.column("label").to_numpy(),
        t.column("row_id").to_numpy(),
    )


def _ours(path, g):
    pf = pq.ParquetFile(path)
    cols = pages.layout(pf)
    assert cols is not None
    with open(path, "rb") as f:
        return pages.read_row_group(f, pf.metadata, g, cols, N_FEATURES)


@pytest.mark.parametrize("compression", ["lz4", "snappy", "zstd", "gzip", "none"])
@pytest.mark.parametrize("nullable", [True, False])
def test_decoder_matches_pyarrow(tmp_path, compression, nullable):
    rng = np.random.default_rng(len(compression) + nullable)
    table = block_to_table(_block(rng, 1000), has_group=False)
    if not nullable:  # required lists (max definition level 1) of required elements
        fields = [
            pa.field(f.name, pa.list_(pa.field("element", f.type.value_type, False)),
                     nullable=False)
            if pa.types.is_list(f.type) else f
            for f in table.schema
        ]  # fmt: skip
        table = table.cast(pa.schema(fields))
    path = tmp_path / "part.parquet"
    _write(path, table, compression)
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups == 4 and md.row_group(0).column(2).total_compressed_size
    for g in range(md.num_row_groups):
        *got, checked = _ours(path, g)
        assert checked
        want = _pyarrow_parts(path, g)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_null_lists_read_as_empty_rows(tmp_path):
    offsets = pa.array([0, 2, 2, 3, 3], pa.int32())
    mask = pa.array([False, True, False, False])
    table = pa.table({
        "row_id": pa.array([0, 1, 2, 3], pa.int64()),
        "label": pa.array([1, 1, 1, 1], pa.int8()),
        "indices": pa.ListArray.from_arrays(offsets, pa.array([1, 7, 3], pa.int32()),
                                            mask=mask),
        "values": pa.ListArray.from_arrays(offsets, pa.array([1, 2, 3], pa.float32()),
                                           mask=mask),
    }, schema=schema(False))  # fmt: skip
    path = tmp_path / "nulls.parquet"
    _write(path, table)
    offs, ind, val, *_, checked = _ours(path, 0)
    assert checked and offs.tolist() == [0, 2, 2, 3, 3] and ind.tolist() == [1, 7, 3]
    assert np.array_equal(offs, _pyarrow_parts(path, 0)[0])


def test_other_layouts_are_left_to_pyarrow(tmp_path):
    """A dictionary-encoded file (pyarrow's default) is not read here: Unsupported, and
    the reader decodes it with pyarrow to the same rows."""
    table = block_to_table(_block(np.random.default_rng(5), 200), has_group=False)
    path = tmp_path / "dict.parquet"
    pq.write_table(table, path, row_group_size=100)
    with pytest.raises(pages.Unsupported):
        _ours(path, 0)


# -- the checks ------------------------------------------------------------------
def test_page_checks_agree_with_the_whole_block_check():
    """Chained over random page splits (rows crossing them, empty rows), the copy that
    checks gives the whole-block check's verdict on every kind of defect."""
    rng = np.random.default_rng(0)
    for trial in range(400):
        b = _block(rng, 60, empty=0.2, long_rows=1)
        indptr, indices = b.X.indptr, b.X.indices.copy()
        kind = trial % 5
        p = int(rng.integers(indices.size))
        if kind == 1:
            indices[p] = N_FEATURES + int(rng.integers(3))
        elif kind == 2:
            indices[p] = -1 - int(rng.integers(3))
        elif kind == 3 and p > 0:
            indices[p] = indices[p - 1]  # a duplicate, or a legal row start
        elif kind == 4 and p > 0:
            indices[p - 1], indices[p] = indices[p], indices[p - 1]
        want = K.indices_ok(indptr, indices, N_FEATURES)
        cuts = np.r_[0, rng.integers(0, indices.size, 4), indices.size]
        if trial % 2:  # a page boundary right at the defect
            cuts = np.r_[cuts, p]
        cuts = np.unique(cuts)
        out = np.empty_like(indices)
        ok = True
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            # the rows starting in this page: those whose first element is in it,
            # and empty rows at its position (as the decoder records them)
            r0 = int(np.searchsorted(indptr[:-1], lo, side="left"))
            r1 = int(np.searchsorted(indptr[:-1], hi, side="left"))
            ok &= K.copy_indices_checked(indices[lo:hi], out, lo, indptr, r0, r1,
                                         N_FEATURES)  # fmt: skip
        assert np.array_equal(out, indices)
        assert bool(ok) == bool(want), (trial, kind)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_values_check_finds_non_finite_values(bad):
    v = np.linspace(-3, 3, 1001).astype(np.float32)
    out = np.empty_like(v)
    assert pages._copy_values(v, out) and np.array_equal(out, v)
    v[517] = bad
    assert not pages._copy_values(v, out)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    from bigrate.data.prep import prep_synth

    d = tmp_path_factory.mktemp("pages") / "clean"
    prep_synth(d, rows=3000, features=300, row_group_size=500, progress=False)
    return d


def _first_train_file(d):
    ds = ShardedDataset(d)
    return ds, next(f for f in ds.files("train", "pos"))


def test_prepped_shards_are_read_by_our_decoder(clean, monkeypatch):
    """Every row group of a dataset made by `bigrate prep` is decoded here, to the
    same rows as pyarrow's."""
    ds = ShardedDataset(clean)
    ours = RowBlock.concat(list(ds.iter_batches("train", batch_rows=700)))
    calls = []
    real = ShardedDataset._arrow_batches

    def counted(self, *a):
        calls.append(a)
        yield from real(self, *a)

    monkeypatch.setattr(pages, "layout", lambda pf: None)
    monkeypatch.setattr(ShardedDataset, "_arrow_batches", counted)
    theirs = RowBlock.concat(list(ds.iter_batches("train", batch_rows=700)))
    assert len(calls) == len(ds.files("train"))  # all by pyarrow this time
    for a, b in [(ours.X.indptr, theirs.X.indptr), (ours.X.indices, theirs.X.indices),
                 (ours.X.data, theirs.X.data), (ours.y, theirs.y),
                 (ours.row_id, theirs.row_id)]:  # fmt: skip
        assert a.dtype == b.dtype and np.array_equal(a, b)
    monkeypatch.undo()
    calls.clear()
    monkeypatch.setattr(ShardedDataset, "_arrow_batches", counted)
    list(ds.iter_batches("train"))
    assert calls == []


def test_bad_rows_in_the_shard_layout_are_named(clean, tmp_path):
    """Defects written in the layout our decoder reads (so its checks, not pyarrow's
    path, see them first): the reader names the file and the row."""
    d = tmp_path / "ds"
    shutil.copytree(clean, d)
    ds, f = _first_train_file(d)
    victim = d / f.path
    t = pq.read_table(victim)
    idx = t.column("indices").to_pylist()
    vals = t.column("values").to_pylist()
    r = next(i for i, row in enumerate(idx) if len(row) >= 3)
    rid = t.column("row_id")[r].as_py()
    n = ds.n_features
    cases = [
        ("not sorted and unique", lambda i, v: i[r].reverse()),
        ("not sorted and unique", lambda i, v: i[r].__setitem__(1, i[r][0])),
        (rf"feature index {n}, outside", lambda i, v: i[r].__setitem__(-1, n)),
        ("feature index -2, outside", lambda i, v: i[r].__setitem__(0, -2)),
        ("NaN or infinite", lambda i, v: v[r].__setitem__(1, float("nan"))),
        ("NaN or infinite", lambda i, v: v[r].__setitem__(2, float("-inf"))),
    ]
    for message, corrupt in cases:
        i2, v2 = [list(x) for x in idx], [list(x) for x in vals]
        corrupt(i2, v2)
        bad = t.set_column(2, "indices", pa.array(i2, pa.list_(pa.int32())))
        bad = bad.set_column(3, "values", pa.array(v2, pa.list_(pa.float32())))
        _write(victim, bad, page=2048, row_group=500)
        with pytest.raises(DataError, match=rf"{f.path}: row_id {rid}.*{message}"):
            list(ShardedDataset(d).iter_batches("train", "pos"))


FUZZ = r"""
import sys, numpy as np
from bigrate import ShardedDataset
from bigrate.errors import DataError
d, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
clean = open(path, "rb").read()
rng = np.random.default_rng(seed)
outcomes = {"rows": 0, "error": 0}
ds = ShardedDataset(d)
shard = next(f for f in ds.files("train", "pos"))
for trial in range(150):
    data = bytearray(clean)
    for _ in range(int(rng.integers(1, 4))):
        k = int(rng.integers(4, len(data) - 8))
        data[k] ^= int(rng.integers(1, 256))
    open(path, "wb").write(bytes(data))
    try:
        for b in ds.iter_file(shard):
            X = b.X
            assert X.indices.min(initial=0) >= 0
            assert X.indices.max(initial=0) < ds.n_features
            assert np.isfinite(X.data).all() and X.indptr[-1] == X.indices.size
        outcomes["rows"] += 1
    except DataError as e:
        assert shard.path in str(e), e
        outcomes["error"] += 1
print(outcomes)
"""


def test_flipped_bytes_never_crash_the_decoder(clean, tmp_path):
    """Random bytes of a shard flipped, 150 times: each read yields checked rows or a
    DataError naming the file (run in a child process, so that a crash would show as
    its exit code)."""
    d = tmp_path / "ds"
    shutil.copytree(clean, d)
    _, f = _first_train_file(d)
    p = subprocess.run([sys.executable, "-c", FUZZ, str(d), str(d / f.path), "7"],
                       cwd=REPO, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "'error'" in p.stdout


def test_threads_reading_at_once_get_the_same_rows(clean, monkeypatch):
    """The decoder's read buffer is per thread: four threads streaming the same split
    at once each get the rows one thread gets alone, all decoded here (a shared buffer
    overwritten under a thread shows as pages that do not decode, left to pyarrow)."""
    from concurrent.futures import ThreadPoolExecutor

    ds = ShardedDataset(clean)
    left = []
    real = ShardedDataset._arrow_batches

    def counted(self, *a):
        left.append(a)
        yield from real(self, *a)

    monkeypatch.setattr(ShardedDataset, "_arrow_batches", counted)

    def one(_):
        b = RowBlock.concat(list(ds.iter_batches("train", batch_rows=333)))
        return b.X.indptr, b.X.indices, b.X.data, b.row_id

    alone = one(None)
    with ThreadPoolExecutor(4) as ex:
        for got in ex.map(one, range(8)):
            assert all(np.array_equal(a, b) for a, b in zip(got, alone))
    assert left == []


@pytest.mark.parametrize(
    "header",
    [
        # a list of 2**40 booleans in a field we skip: refused, not looped over
        bytes([0x15, 0x00, 0x19, 0xF1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20]),
        # structs nested 20 deep
        bytes([0x1C] * 20 + [0x00] * 21),
        # the uncompressed size a struct instead of an integer
        bytes([0x15, 0x00, 0x1C, 0x00, 0x15, 0x02, 0x2C, 0x15, 0x02, 0x15, 0x00,
               0x00, 0x00]),
        # a header cut short
        bytes([0x15, 0x00, 0x15]),
    ],
)  # fmt: skip
def test_malformed_page_headers_are_refused(header):
    with pytest.raises(pages.Unsupported, match="list longer|nested|sizes|runs past"):
        pages._page_header(memoryview(header), 0)


def test_a_page_larger_than_its_column_chunk_is_refused():
    # a data page of 1 level, PLAIN, claiming 2**30 bytes decompressed
    header = bytes([0x15, 0x00, 0x15, 0x80, 0x80, 0x80, 0x80, 0x08, 0x15, 0x08,
                    0x2C, 0x15, 0x02, 0x15, 0x00, 0x00, 0x00])  # fmt: skip
    buf = memoryview(header + bytes(4))
    assert pages._page_header(buf, 0)[1] == 2**30
    with pytest.raises(pages.Unsupported, match="page sizes"):
        chunk = pages._Chunk(0, len(buf), 1, 0, pa.Codec("lz4_raw"), 4096)
        list(pages._pages(buf, chunk))


def test_a_label_outside_int8_is_named(clean, tmp_path):
    """The label column is int32 in the file (int8 by annotation): a value that does
    not fit int8, written into an uncompressed page, is a DataError naming the row,
    not a value cast around to another label."""
    d = tmp_path / "ds"
    shutil.copytree(clean, d)
    ds, f = _first_train_file(d)
    victim = d / f.path
    t = pq.read_table(victim)
    _write(victim, t, compression="none", row_group=500)
    md = pq.ParquetFile(victim).metadata
    col = md.row_group(0).column(t.schema.get_field_index("label"))
    data = bytearray(victim.read_bytes())
    *_, at = pages._page_header(memoryview(bytes(data)), col.data_page_offset)
    data[at + 4 * 3 : at + 4 * 4] = (300).to_bytes(4, "little")  # the 4th row's label
    victim.write_bytes(bytes(data))
    rid = t.column("row_id")[3].as_py()
    with pytest.raises(DataError, match=rf"{f.path}: row_id {rid} has label 300"):
        list(ShardedDataset(d).iter_batches("train", "pos"))
