"""RowBlock: zero-copy row slices, and stacking slices of blocks of different widths."""

import numpy as np
import scipy.sparse as sp

from bigrate.data.format import RowBlock


def _block(rng, n, d, density=0.1, with_group=False):
    X = sp.random(n, d, density=density, format="csr", random_state=rng,
                  dtype=np.float32)  # fmt: skip
    X.indices = X.indices.astype(np.int32)
    X.indptr = X.indptr.astype(np.int32)
    y = rng.choice(np.array([-1, 1], dtype=np.int8), n)
    group = np.array([f"g{i % 3}" for i in range(n)]) if with_group else None
    return RowBlock(X=X, y=y, row_id=rng.integers(0, 10**9, n), group=group)


def _same(a: RowBlock, b: RowBlock):
    assert a.X.shape == b.X.shape
    assert (a.X != b.X).nnz == 0
    np.testing.assert_array_equal(a.X.indptr, b.X.indptr)
    np.testing.assert_array_equal(a.X.indices, b.X.indices)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.row_id, b.row_id)
    if a.group is None:
        assert b.group is None
    else:
        np.testing.assert_array_equal(a.group, b.group)


def test_slice_is_a_view_with_the_rows_of_take():
    rng = np.random.default_rng(0)
    blk = _block(rng, 300, 40, with_group=True)
    for start, stop in ((0, 300), (0, 1), (17, 211), (299, 300), (120, 120)):
        s = blk.slice(start, stop)
        _same(s, blk.take(np.arange(start, stop)))
        if stop - start > 1:  # (scipy copies a one-row matrix's arrays)
            assert np.shares_memory(s.X.data, blk.X.data)  # no copy of the features
            assert np.shares_memory(s.X.indices, blk.X.indices)
        assert s.X.indices.dtype == np.int32 and s.X.data.dtype == np.float32


def test_concat_of_slices_and_widths_matches_scipy_vstack():
    rng = np.random.default_rng(1)
    blocks = [_block(rng, n, d) for n, d in ((50, 30), (0, 30), (80, 45), (1, 10))]
    parts = [blocks[0].slice(10, 40), blocks[1], blocks[2].slice(5, 80), blocks[3]]
    got = RowBlock.concat(parts)
    width = 45
    want = sp.vstack(
        [sp.csr_matrix((p.X.data, p.X.indices, p.X.indptr), shape=(len(p), width))
         for p in parts], format="csr")  # fmt: skip
    assert got.X.shape == (sum(len(p) for p in parts), width)
    assert (got.X != want).nnz == 0
    assert got.X.indices.dtype == np.int32 and got.X.data.dtype == np.float32
    assert got.X.has_sorted_indices
    np.testing.assert_array_equal(got.y, np.concatenate([p.y for p in parts]))
    np.testing.assert_array_equal(got.row_id, np.concatenate([p.row_id for p in parts]))
    # the stacked arrays are new: changing them leaves the sources alone
    got.X.data[:] = -7.0
    assert not np.any(blocks[0].X.data == -7.0)


def test_gather_copies_chosen_rows_of_several_blocks_in_order():
    """gather over RowSequences equals stacking every block and taking the rows, for
    rows in any order (repeats, runs within one block, jumps between blocks), several
    pieces one after another, different widths, the group column, empty rows and
    empty pieces; positions outside a sequence are refused."""
    import pytest

    from bigrate.data.format import RowSequence, gather

    rng = np.random.default_rng(3)
    for with_group in (False, True):
        blocks = [_block(rng, n, d, with_group=with_group)
                  for n, d in ((50, 30), (1, 30), (120, 45), (7, 10), (64, 45))]  # fmt: skip
        blocks[2].X.data[:] = 0  # explicit zeros are rows' entries too
        blocks[0].X = sp.csr_matrix(
            (
                blocks[0].X.data,
                blocks[0].X.indices,
                blocks[0].X.indptr.astype(np.int64),
            ),
            shape=blocks[0].X.shape,
        )  # int64 row offsets next to int32 ones
        a, b = RowSequence(blocks[:3]), RowSequence(blocks[3:])
        assert len(a) == 171 and len(b) == 71
        whole_a, whole_b = RowBlock.concat(blocks[:3]), RowBlock.concat(blocks[3:])
        ra = np.r_[rng.integers(0, 171, 200), np.arange(60, 90), [170, 0, 50, 50]]
        rb = rng.permutation(71)
        got = gather([(a, ra), (b, np.array([], dtype=np.int64)), (b, rb), (a, ra[:5])])
        want = RowBlock.concat(
            [whole_a.take(ra), _widen_to(whole_b.take(rb), 45), whole_a.take(ra[:5])]
        )
        _same(got, want)
        assert got.X.dtype == np.float32 and got.X.indices.dtype == np.int32
    with pytest.raises(IndexError, match=r"\[0, 171\)"):
        gather([(a, np.array([0, 171]))])
    with pytest.raises(IndexError):
        gather([(a, np.array([-1]))])


def _widen_to(blk: RowBlock, width: int) -> RowBlock:
    X = sp.csr_matrix((blk.X.data, blk.X.indices, blk.X.indptr),
                      shape=(blk.X.shape[0], width))  # fmt: skip
    return RowBlock(X=X, y=blk.y, row_id=blk.row_id, group=blk.group)


def test_gather_reads_read_only_arrow_buffers(tmp_path):
    """Blocks decoded from Parquet hold read-only views of Arrow's buffers: a
    RowSequence of them gathers without copying them first and without numba's
    read-only cast warning."""
    import warnings

    import pyarrow.parquet as pq

    from bigrate.data.format import RowSequence, block_to_table, gather, table_to_block

    rng = np.random.default_rng(5)
    blk = _block(rng, 200, 25)
    pq.write_table(block_to_table(blk, False), tmp_path / "b.parquet")
    back = table_to_block(pq.read_table(tmp_path / "b.parquet"), 25)
    assert not back.X.indices.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seq = RowSequence([back, blk])
        rows = rng.integers(0, 400, 300)
        _same(gather([(seq, rows)]), RowBlock.concat([back, blk]).take(rows))
    assert np.shares_memory(seq._inds[0], back.X.indices)


def test_gather_into_kept_buffers_reuses_them_and_stays_exact():
    """With a buffers dict, successive gathers write into the same memory (grown when
    a larger chunk needs it) and every result is still exactly the rows asked for.
    (scipy copies a view of less than half its base array, so much smaller chunks
    than the kept buffers get their own copy: a sampler's chunks are of one size.)"""
    from bigrate.data.format import RowSequence, gather

    rng = np.random.default_rng(8)
    blocks = [_block(rng, 80, 20), _block(rng, 90, 20)]
    seq, whole = RowSequence(blocks), RowBlock.concat(blocks)
    kept: dict = {}
    shared = grown = 0
    for n in (40, 36, 44, 160, 150, 10):
        rows = rng.integers(0, 170, n)
        before = kept.get("indices")
        got = gather([(seq, rows)], kept)
        _same(got, whole.take(rows))
        if kept["indices"] is before and 2 * got.X.nnz > len(before):
            assert np.shares_memory(got.X.indices, before)  # no fresh arrays
            assert np.shares_memory(got.X.data, kept["data"])
            shared += 1
        grown += kept["indices"] is not before
    assert shared >= 3 and grown == 2  # the first call, and for 160 rows
    assert len(kept["indices"]) >= got.X.nnz


def test_joined_sequences_hold_the_rows_of_each_at_their_offsets_without_copies():
    from bigrate.data.format import RowSequence, gather

    rng = np.random.default_rng(7)
    blocks = [_block(rng, n, 30) for n in (50, 0, 80, 33)]
    a, b = RowSequence(blocks[:2]), RowSequence(blocks[2:])
    c = RowSequence([_widen_to(_block(rng, 20, 12), 12)])
    j = RowSequence.joined([a, b, c])
    off = RowSequence.offsets([a, b, c])
    assert off.tolist() == [0, 50, 163] and len(j) == 183 and j.width == 30
    for seq, o in ((a, 0), (b, 50), (c, 163)):
        rows = rng.integers(0, len(seq), 40)
        _same(gather([(j, o + rows)]), _widen_to(gather([(seq, rows)]), 30))
    assert np.shares_memory(j._inds[3], blocks[3].X.indices)  # the blocks themselves
    assert RowSequence.joined([a]) is a
