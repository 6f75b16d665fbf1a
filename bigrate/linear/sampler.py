"""Class-balanced sampling, in memory and out of core.

A sampler hands the learner *chunks*: rows, their labels and an ``order`` of row
indices into them, the sequence of examples the SGD kernel visits. In memory the rows are
the CSR matrix itself; out of core they are the shuffle buffers' decoded row groups
where they lie (a :class:`~bigrate.data.format.RowSequence`), which the step kernels
read through the positions: a drawn row is never copied.

* Balanced (``balanced=True``): each step draws the positive class with probability 1/2;
  an **epoch** is 2 * max(n+, n-) steps, so the larger class is seen about once.
* Uniform (``balanced=False``): each step draws the positive class with probability
  n+ / n; an epoch is n steps.
* Pairs (q-value learner): each step takes one positive and one negative; an epoch is
  max(n+, n-) steps.

Within a class, rows come without replacement: in memory from a fresh seeded permutation
per pass over the class; out of core from a seeded shuffle buffer of at most
``buffer_rows`` rows per class, filled from the class's row groups taken in a freshly
shuffled order on every pass. When a chunk needs more rows than the buffer has left, the
rows left are kept, row groups are read until the buffer is full again (at most one pass
over the class), and the whole buffer is permuted: memory stays at about
``buffer_rows`` rows per class plus one Parquet row group. Both permutations go by blocks
(:func:`block_permutation`: ``block`` consecutive rows, the blocks in random order and the
rows of a block in random order, so that a block's rows stay in the CPU's caches while
they are visited or gathered; ``block = 1`` is a plain permutation).
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from bigrate.data import reader
from bigrate.data.format import RowBlock, RowSequence, gather


def holdout_score(row_id: np.ndarray, seed: int) -> np.ndarray:
    """Each row's deterministic hash of (row_id, seed), uniform in [0, 1): a row is
    held out for calibration when it is below the fraction (:func:`holdout_mask`)."""
    with np.errstate(over="ignore"):
        h = row_id.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h ^= np.uint64((seed * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF)
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def holdout_mask(row_id: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rows held out for calibration: a deterministic hash of (row_id, seed) below
    ``fraction``, the same in memory, streaming and on every worker."""
    if fraction <= 0:
        return np.zeros(len(row_id), dtype=bool)
    return holdout_score(row_id, seed) < fraction


def steps_per_epoch(n_pos: int, n_neg: int, mode: str) -> int:
    if mode == "balanced":
        return 2 * max(n_pos, n_neg)
    if mode == "uniform":
        return n_pos + n_neg
    if mode == "pairs":
        return max(n_pos, n_neg)
    raise ValueError(mode)


def _class_mask(
    rng: np.random.Generator, steps: int, mode: str, p_pos: float
) -> np.ndarray:
    """True where a step draws a positive."""
    if mode == "balanced":
        return rng.random(steps) < 0.5
    return rng.random(steps) < p_pos


def block_permutation(
    items: np.ndarray, rng: np.random.Generator, block: int
) -> np.ndarray:
    """``items`` in a random order by blocks of ``block`` consecutive items: the blocks
    in random order, the items of each block in random order within it."""
    n = len(items)
    if block <= 1 or n <= block:
        return rng.permutation(items)
    full = n // block
    blocks = list(rng.permuted(items[: full * block].reshape(full, block), axis=1))
    if n > full * block:
        blocks.append(rng.permutation(items[full * block :]))
    return np.concatenate([blocks[b] for b in rng.permutation(len(blocks))])


class _Cycle:
    """Indices 0..n-1 in a fresh seeded (block) permutation per pass, taken k at a
    time."""

    def __init__(self, items: np.ndarray, rng: np.random.Generator, block: int = 1):
        self.items, self.rng, self.block = items, rng, block
        self.perm = block_permutation(items, rng, block)
        self.pos = 0

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            if self.pos == len(self.perm):
                self.perm = block_permutation(self.items, self.rng, self.block)
                self.pos = 0
            m = min(k, len(self.perm) - self.pos)
            out.append(self.perm[self.pos : self.pos + m])
            self.pos += m
            k -= m
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


class InMemorySampler:
    """Sampler over a CSR matrix in memory: chunks index the full matrix, no copies."""

    def __init__(
        self,
        X: sp.csr_matrix,
        y: np.ndarray,
        mode: str,
        seed,
        *,
        rows: np.ndarray | None = None,
        block: int = 1,
    ):
        self.X, self.y, self.mode = X, y, mode
        self.rng = np.random.default_rng(seed)
        rows = np.arange(len(y)) if rows is None else rows
        pos = rows[y[rows] > 0]
        neg = rows[y[rows] < 0]
        self.n_pos, self.n_neg = len(pos), len(neg)
        self.pos = _Cycle(pos.astype(np.int64), self.rng, block)
        self.neg = _Cycle(neg.astype(np.int64), self.rng, block)

    def next(self, steps: int):
        """(X, y, order) for ``steps`` steps; with mode 'pairs', order is (pos, neg)."""
        if self.mode == "pairs":
            return self.X, self.y, (self.pos.take(steps), self.neg.take(steps))
        is_pos = _class_mask(
            self.rng, steps, self.mode, self.n_pos / (self.n_pos + self.n_neg)
        )
        order = np.empty(steps, dtype=np.int64)
        k = int(is_pos.sum())
        order[is_pos] = self.pos.take(k)
        order[~is_pos] = self.neg.take(steps - k)
        return self.X, self.y, order


class RowGroupCache:
    """A per-process LRU cache of decoded row groups with a byte budget.

    Distributed rounds read the same row groups epoch after epoch; a worker keeps the
    ones it owns decoded while they fit in ``budget_mb`` and reads the rest from storage
    again (out of core). Keys carry the file's sha256, so a rewritten file is not served
    stale.
    """

    def __init__(self, budget_mb: float = 0.0):
        from collections import OrderedDict

        self.budget = int(budget_mb * 2**20)
        self.items: OrderedDict = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _size(b: RowBlock) -> int:
        return (
            b.X.data.nbytes
            + b.X.indices.nbytes
            + b.X.indptr.nbytes
            + b.y.nbytes
            + b.row_id.nbytes
        )

    def holds(self, shard, rg: int) -> bool:
        return (shard.path, shard.sha256, rg) in self.items

    def get(self, ds, shard, rg: int, batch_rows: int, fetched=None) -> RowBlock | None:
        """Row group ``rg`` of ``shard``, decoded (``fetched``: its bytes' future from
        :meth:`ShardedDataset.prefetch`, when one was started)."""
        key = (shard.path, shard.sha256, rg)
        hit = self.items.get(key)
        if hit is not None:
            self.items.move_to_end(key)
            self.hits += 1
            return hit
        self.misses += 1
        ahead = None if fetched is None else {rg: fetched}
        blocks = list(ds.iter_file(shard, batch_rows, row_groups=[rg], fetched=ahead))
        if not blocks:
            return None
        block = RowBlock.concat(blocks)
        size = self._size(block)
        if size <= self.budget:
            self.items[key] = block
            self.nbytes += size
            while self.nbytes > self.budget:
                _, old = self.items.popitem(last=False)
                self.nbytes -= self._size(old)
        return block


def decoded_bytes(units: list) -> float:
    """Memory the decoded row groups ``units`` take (float32 values and int32 indices
    and row offsets, int8 labels, int64 row ids: what :class:`RowGroupCache` counts),
    from the manifest's counts (a file's row groups taken as equal)."""
    return sum((8 * f.nnz + 13 * f.rows) / max(f.row_groups, 1) + 4 for f, _ in units)


def cached_classes(own_pos: list, own_neg: list, cache_mb: float) -> tuple:
    """The classes whose row groups a worker (or an in-process streamed fit) keeps
    decoded across rounds and passes: smallest first, while all of that class's row
    groups of the worker fit in ``cache_mb`` together. A class that does not fit whole
    is not cached at all: its row groups are read once an epoch in a fresh order, so an
    LRU cache would only evict the small class's row groups, which are read again and
    again, to keep ones not read again this epoch."""
    budget, out = cache_mb * 2**20, []
    sizes = sorted(
        (decoded_bytes(u), c) for c, u in (("pos", own_pos), ("neg", own_neg))
    )
    for size, cls in sizes:
        if size <= budget:
            out.append(cls)
            budget -= size
    return tuple(out)


# Decoded row groups an in-process streamed fit keeps across passes (MiB), of the
# classes that fit whole (:func:`cached_classes`): the minority class, drawn as often
# as the majority under balanced sampling, is then read and decoded once a fit, not
# once a pass (on object storage, downloaded once). The same default as a distributed
# fit's on workers without a memory limit.
STREAM_CACHE_MB = 1024.0

_PROCESS_CACHE = RowGroupCache(0.0)


def process_cache(budget_mb: float) -> RowGroupCache:
    """This process's row-group cache, resized to ``budget_mb``."""
    _PROCESS_CACHE.budget = int(budget_mb * 2**20)
    while _PROCESS_CACHE.nbytes > _PROCESS_CACHE.budget and _PROCESS_CACHE.items:
        _, old = _PROCESS_CACHE.items.popitem(last=False)
        _PROCESS_CACHE.nbytes -= RowGroupCache._size(old)
    return _PROCESS_CACHE


class _ShardClassStream:
    """Rows of one class streamed from its shard row groups through a shuffle buffer."""

    def __init__(
        self,
        dataset,
        units,
        buffer_rows: int,
        batch_rows: int,
        rng: np.random.Generator,
        holdout: tuple[float, int] | None,
        cache: RowGroupCache | None = None,
        block: int = 1,
    ):
        if not units:
            raise ValueError("empty shard list: this class has no row groups to read")
        self.ds, self.units = dataset, list(units)
        self.block = block
        self.buffer_rows, self.batch_rows = buffer_rows, batch_rows
        self.rng, self.holdout = rng, holdout
        self.cache = cache if cache is not None else RowGroupCache(0.0)
        self.queue: list = []
        # the buffer's rows as read (``buf``) and the positions of its rows still to be
        # drawn, in draw order (``perm[at:]``): drawing gathers rows, it copies none
        self.buf: RowSequence | None = None
        self.perm = np.empty(0, dtype=np.int64)
        self.at = 0
        self.passes = 0
        self.read_s = 0.0  # reading, decoding and checking row groups
        self.ahead: dict = {}  # (file, row group) -> future of its bytes (object storage)

    def _read_unit(self) -> tuple[RowBlock, np.ndarray | None] | None:
        """The next row group of this pass and the positions of its rows that are not
        held out (None: all of them)."""
        if not self.queue:
            self.queue = [self.units[i] for i in self.rng.permutation(len(self.units))]
            self.passes += 1
        shard, rg = self.queue.pop()
        fetched = self.ahead.pop((shard.path, rg), None)
        self._read_ahead()
        t = time.perf_counter()
        block = self.cache.get(self.ds, shard, rg, self.batch_rows, fetched)
        self.read_s += time.perf_counter() - t
        if block is None:
            return None
        keep = None
        if self.holdout is not None:
            keep = np.flatnonzero(~holdout_mask(block.row_id, *self.holdout))
        return block, keep

    def _read_ahead(self, depth: int | None = None) -> None:
        """Keep the next ``depth`` row groups of this pass that are not cached being
        fetched in the background (object storage: a request's latency overlaps the
        steps on the rows before it; on a local disk nothing is started)."""
        depth = reader.READ_AHEAD if depth is None else depth
        if depth <= 0:
            return
        for shard, rg in self.queue[-depth:]:
            key = (shard.path, rg)
            if key not in self.ahead and not self.cache.holds(shard, rg):
                fut = self.ds.prefetch(shard, rg)
                if fut is None:
                    return
                self.ahead[key] = fut

    def waiting_row_ids(self) -> np.ndarray:
        """The ``row_id`` of the buffer's rows not drawn yet, in the order they will be."""
        if self.buf is None:
            return np.empty(0, dtype=np.int64)
        return self.buf.row_id[self.perm[self.at :]]

    def _refill(self) -> None:
        """Keep the rows not yet drawn, add row groups (at most one pass over the class)
        up to ``buffer_rows`` rows, and permute them (by blocks of ``block`` rows: the
        rows of a block are then gathered from one stretch of memory)."""
        parts, items, start = [], [], 0
        if self.buf is not None and self.at < len(self.perm):
            parts.append(gather([(self.buf, self.perm[self.at :])]))
            start = len(parts[0])
            items.append(np.arange(start))
        have = start
        read = 0
        while have < self.buffer_rows and read < len(self.units):
            got = self._read_unit()
            read += 1
            if got is None:
                continue
            b, keep = got
            kept = len(b) if keep is None else len(keep)
            if kept:
                parts.append(b)
                items.append(start + (np.arange(len(b)) if keep is None else keep))
                start += len(b)
                have += kept
        if have == 0:
            raise ValueError(
                "this class has no rows left after the calibration hold-out"
            )
        self.buf = RowSequence(parts)
        self.perm = block_permutation(np.concatenate(items), self.rng, self.block)
        self.at = 0

    def take(self, k: int) -> list[tuple[RowSequence, np.ndarray]]:
        """The next ``k`` rows as (buffer, row positions) pieces (a chunk reads them where
        they lie: :meth:`ShardSampler.next`)."""
        out = []
        while k > 0:
            left = len(self.perm) - self.at
            if left < k:
                self._refill()
                left = len(self.perm) - self.at
            m = min(k, left)
            out.append((self.buf, self.perm[self.at : self.at + m]))
            self.at += m
            k -= m
        return out


def row_group_units(files) -> list:
    """(shard file, row group) pairs: the unit of out-of-core reading and of work
    assignment to workers."""
    return [(f, g) for f in files for g in range(f.row_groups)]


class ShardSampler:
    """Out-of-core sampler over the shards of one split (or of given row-group units).

    Each chunk is the rows drawn where they lie in the class buffers: a
    :class:`~bigrate.data.format.RowSequence` joining the buffers the chunk draws from
    (their blocks, not copies of their rows), its labels by position, and the
    positions in step order, which the step kernels read rows through
    (:func:`~bigrate.linear.steps.run_steps`); no row is copied into a chunk. A chunk
    is valid until the next call of :meth:`next`. The drawn rows' ``row_id``s in step
    order are kept in ``last_row_ids`` for replay and tests. ``cache`` keeps decoded
    row groups of the classes in ``cached`` across samplers (see
    :class:`RowGroupCache`).
    """

    def __init__(
        self,
        dataset,
        mode: str,
        seed,
        *,
        split: str = "train",
        units=None,
        buffer_rows: int = 65_536,
        batch_rows: int = 32_768,
        holdout: tuple[float, int] | None = None,
        cache: RowGroupCache | None = None,
        shuffle_block: int = 1,
        cached: tuple = ("pos", "neg"),
    ):
        self.ds, self.mode = dataset, mode
        self.rng = np.random.default_rng(seed)
        if units is None:
            units = row_group_units(dataset.files(split))
        pos = [u for u in units if u[0].cls == "pos"]
        neg = [u for u in units if u[0].cls == "neg"]
        if not pos or not neg:
            raise ValueError(
                f"{dataset.path}: the shards given hold {len(pos)} positive and {len(neg)} "
                "negative row groups; both classes are needed"
            )
        self.n_pos = sum(f.rows for f in {u[0] for u in pos})
        self.n_neg = sum(f.rows for f in {u[0] for u in neg})
        self.pos = _ShardClassStream(
            dataset, pos, buffer_rows, batch_rows, self.rng, holdout,
            cache if "pos" in cached else None, shuffle_block,
        )  # fmt: skip
        self.neg = _ShardClassStream(
            dataset, neg, buffer_rows, batch_rows, self.rng, holdout,
            cache if "neg" in cached else None, shuffle_block,
        )  # fmt: skip
        self.last_row_ids: np.ndarray | None = None
        self.gather_s = 0.0  # assembling chunks (joining the buffers they draw from)
        self._joined: tuple = ((), None)  # the buffers last joined, and their join

    @property
    def read_s(self) -> float:
        """Seconds spent reading, decoding and checking row groups (cache misses)."""
        return self.pos.read_s + self.neg.read_s

    def _chunk(self, *draws) -> tuple[RowSequence, list[np.ndarray]]:
        """The join of the buffers that ``draws`` (lists of (buffer, positions)
        pieces, from :meth:`_ShardClassStream.take`) take rows from, and each draw's
        positions in it. Consecutive chunks draw from the same two buffers until one
        class refills, so the join is kept and made again only then."""
        t = time.perf_counter()
        seqs: list = []
        for pieces in draws:
            for seq, _ in pieces:
                if not any(seq is s for s in seqs):
                    seqs.append(seq)
        kept, joined = self._joined
        if len(kept) != len(seqs) or any(
            a is not b for a, b in zip(kept, seqs, strict=True)
        ):
            joined = RowSequence.joined(seqs)
            self._joined = (tuple(seqs), joined)
        at = {
            id(s): off for s, off in zip(seqs, RowSequence.offsets(seqs), strict=True)
        }
        where = [
            np.concatenate([at[id(seq)] + rows for seq, rows in pieces])
            if pieces
            else np.empty(0, dtype=np.int64)
            for pieces in draws
        ]
        self.gather_s += time.perf_counter() - t
        return joined, where

    def next(self, steps: int):
        """(rows, y, order) for ``steps`` steps: ``rows`` a RowSequence, ``y`` its
        labels by position and ``order`` the positions in step order (with mode
        'pairs', a tuple: the positives' and the negatives')."""
        if self.mode == "pairs":
            rows, (p, n) = self._chunk(self.pos.take(steps), self.neg.take(steps))
            self.last_row_ids = rows.row_id[np.concatenate([p, n])]
            return rows, rows.y, (p, n)
        is_pos = _class_mask(
            self.rng, steps, self.mode, self.n_pos / (self.n_pos + self.n_neg)
        )
        k = int(is_pos.sum())
        rows, (p, n) = self._chunk(self.pos.take(k), self.neg.take(steps - k))
        order = np.empty(steps, dtype=np.int64)
        order[is_pos] = p
        order[~is_pos] = n
        self.last_row_ids = rows.row_id[order]
        return rows, rows.y, order
