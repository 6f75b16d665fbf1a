"""The samplers' promises, checked by their statistics: each step draws the positive class
with probability 1/2 (balanced) or n+/n (uniform), within binomial bounds, in memory and
streaming; rows of a class come without replacement (in memory every row exactly once per
pass over its class, streaming evenly through the shuffle buffer); and on a Dask cluster
the steps of the workers together are balanced."""

import numpy as np
import pytest

from bigrate.linear.sampler import InMemorySampler, ShardSampler
from tests.linear.test_sgd_estimators import write_dataset

N_POS, N_NEG = 300, 2700
Z = 5.0  # binomial bound in standard deviations (a false alarm about once in 3.5 M)


def _data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N_POS + N_NEG, 3))
    y = np.r_[np.ones(N_POS), -np.ones(N_NEG)].astype(np.int8)
    return X, y


def _within(k: int, n: int, p: float) -> bool:
    return abs(k - n * p) <= Z * np.sqrt(n * p * (1 - p))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    X, y = _data()
    return write_dataset(tmp_path_factory.mktemp("s") / "ds", X, y, row_group_size=256)


def _draws_in_memory(mode, steps, chunk=4096, block=1):
    import scipy.sparse as sp

    X, y = _data()
    s = InMemorySampler(sp.csr_matrix(X), y, mode, 7, block=block)
    out = []
    while sum(map(len, out)) < steps:
        _, yy, order = s.next(min(chunk, steps - sum(map(len, out))))
        out.append(order)
    order = np.concatenate(out)
    return order, y[order]


def _draws_streaming(ds, mode, steps, buffer_rows, chunk=4096):
    s = ShardSampler(ds, mode, 7, buffer_rows=buffer_rows, batch_rows=512)
    ids, labels = [], []
    while sum(map(len, ids)) < steps:
        X, yy, order = s.next(min(chunk, steps - sum(map(len, ids))))
        ids.append(s.last_row_ids)
        # pairs: order is (positives' positions, negatives' positions)
        labels.append(yy[np.concatenate(order)] if mode == "pairs" else yy[order])
    return np.concatenate(ids), np.concatenate(labels)


@pytest.mark.parametrize("block", [1, 64])
@pytest.mark.parametrize("mode,p_pos", [("balanced", 0.5), ("uniform", N_POS / 3000)])
def test_class_frequency_in_memory(mode, p_pos, block):
    steps = 60_000
    _, y = _draws_in_memory(mode, steps, block=block)
    assert _within(int((y > 0).sum()), steps, p_pos), (y > 0).mean()


@pytest.mark.parametrize("mode,p_pos", [("balanced", 0.5), ("uniform", N_POS / 3000)])
def test_class_frequency_streaming(shards, mode, p_pos):
    steps = 60_000
    _, y = _draws_streaming(shards, mode, steps, buffer_rows=1000)
    assert _within(int((y > 0).sum()), steps, p_pos), (y > 0).mean()


@pytest.mark.parametrize("block", [1, 64])
def test_every_row_once_per_pass_in_memory(block):
    order, y = _draws_in_memory("balanced", 40_000, block=block)
    for cls in (1, -1):
        rows = order[y == cls]
        n = N_POS if cls > 0 else N_NEG
        for k in range(len(rows) // n):  # every complete pass over the class
            assert np.array_equal(np.sort(rows[k * n : (k + 1) * n]),
                                  np.arange(n) if cls > 0 else np.arange(N_POS, 3000))  # fmt: skip


def test_block_permutation_visits_blocks_whole_in_random_orders():
    """Blocks of consecutive items, each visited as one run in a random inner order,
    the blocks in a random order; a fresh order on every call; block 1 = permutation."""
    from bigrate.linear.sampler import block_permutation

    rng = np.random.default_rng(0)
    items = np.arange(10, 1010)  # 1000 items: 15 blocks of 64 and one of 40
    orders = [block_permutation(items, rng, 64) for _ in range(200)]
    firsts, inner = set(), 0
    for o in orders:
        assert np.array_equal(np.sort(o), items)
        blocks = (o - 10) // 64
        runs = blocks[np.r_[True, blocks[1:] != blocks[:-1]]]
        assert len(runs) == 16 and len(set(runs.tolist())) == 16  # each block one run
        firsts.add(int(runs[0]))
        inner += int(np.any(np.diff(o[blocks == runs[0]]) < 0))
    assert len(firsts) == 16  # every block comes first in some pass
    assert inner >= 190  # rows inside a block are shuffled
    assert not np.array_equal(block_permutation(items, rng, 1), items)


@pytest.mark.parametrize("block", [1, 64])
@pytest.mark.parametrize("buffer_rows", [100, 1000, 4096])
def test_streaming_draws_every_row_once_per_pass(shards, buffer_rows, block):
    """Streaming, a class's rows come without replacement through the shuffle buffer:
    every pass over the class's row groups reads each row once, and each row read is
    drawn once or is still waiting in the buffer. So, exactly, for every row: times
    drawn + copies left in the buffer = passes that have read its row group."""
    ds = shards
    s = ShardSampler(ds, "balanced", 7, buffer_rows=buffer_rows, batch_rows=512,
                     shuffle_block=block)  # fmt: skip
    drawn = []
    for steps in (777, 4096, 50, 3000, 4096, 4096, 123):
        X, yy, order = s.next(steps)
        drawn.append(s.last_row_ids)
    drawn = np.concatenate(drawn)
    for stream in (s.pos, s.neg):
        counts = np.zeros(3000, int)
        np.add.at(counts, drawn, 1)
        waiting = np.zeros(3000, int)
        np.add.at(waiting, stream.waiting_row_ids(), 1)
        unread = {(u[0].path, u[1]) for u in stream.queue}  # this pass, not yet read
        checked = 0
        for shard, rg in stream.units:
            ids = np.concatenate(
                [b.row_id for b in ds.iter_file(shard, 512, row_groups=[rg])]
            )
            reads = stream.passes - ((shard.path, rg) in unread)
            np.testing.assert_array_equal(counts[ids] + waiting[ids], reads)
            checked += len(ids)
        assert checked in (N_POS, N_NEG) and stream.passes >= 2


def test_streaming_buffer_is_shuffled_by_blocks(shards):
    """With ``shuffle_block`` the shuffle buffer keeps each block of consecutive rows
    together (in a random order inside it): 64 neighbouring buffer rows then come from a
    short stretch of a row group (row ids close together), where a plain permutation
    spreads them over the whole buffer."""

    def spans(block):
        s = ShardSampler(shards, "balanced", 7, buffer_rows=2048, batch_rows=512,
                         shuffle_block=block)  # fmt: skip
        s.next(16)
        ids = s.neg.buf.row_id[s.neg.perm]  # the buffer in draw order
        w = ids[: len(ids) // 64 * 64].reshape(-1, 64)
        return np.median(w.max(1) - w.min(1)), ids

    blocked, ids = spans(64)
    plain, _ = spans(1)
    assert blocked < plain / 4, (blocked, plain)
    assert len(np.unique(ids)) == len(ids)  # still each row once in the buffer
    assert not np.all(np.diff(ids[:64]) > 0)  # and shuffled inside a block


def test_pairs_draw_one_of_each_class(shards):
    ids, y = _draws_streaming(shards, "pairs", 3000, buffer_rows=4096)
    assert (y[:3000] > 0).all() and (y[3000:] < 0).all()


# the labels here are independent of the rows (only the draws are tested): the fit's
# warning that its training Pfa is above rho is right, and not what this test is about
@pytest.mark.filterwarnings("ignore::bigrate.BigrateWarning")
def test_distributed_rounds_are_balanced_on_dask(shards):
    """The steps of both workers of a real Dask cluster, summed from the round results:
    positives and negatives each drawn with probability 1/2."""
    from bigrate import NeymanPearsonSGD
    from bigrate.engines import open_engine
    from bigrate.linear import fit_distributed
    from tests.linear.test_distributed import _Recording

    with open_engine("dask", n_workers=2, dashboard=False) as eng:
        rec = _Recording(eng)
        fit_distributed(NeymanPearsonSGD(rho=0.1, epochs=4, random_state=0, calibrate=None), shards,
                        rec, progress=False)  # fmt: skip
    stats = sum(total.stats for _, _, total in rec.rounds)
    n_neg, n_pos = int(stats[0]), int(stats[3])
    assert n_neg + n_pos == 4 * 2 * N_NEG  # 4 epochs of 2 max(n+, n-) steps
    assert _within(n_pos, n_pos + n_neg, 0.5), (n_pos, n_neg)
