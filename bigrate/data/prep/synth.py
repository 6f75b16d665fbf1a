"""A seeded synthetic text-classification set shaped like RCV1-v2.

RCV1-v2 (Lewis et al. 2004) has 804,414 documents, 47,236 features, about 76 non-zeros a
row, L2-normalised log-TF-IDF values and a heavy-tailed word popularity. The generator:

* feature popularity p_j proportional to 1 / (rank_j + 10)^zipf over a seeded random
  permutation of the feature ids (so popular words are not the low indices);
* for each row a document length L ~ lognormal with mean ``nnz`` draws, L word draws
  from p, a word drawn t times gets (1 + log t) * idf_j with idf_j = log(1 / p_j);
  rows are L2-normalised;
* a sparse linear teacher w* (``teacher_nnz`` Gaussian weights on popular-ish words);
  the score <w*, x> is thresholded at the quantile (estimated on a seeded pilot sample)
  that makes the share of negatives ``neg_fraction`` after a share ``label_noise`` of
  labels is flipped, so the Bayes error is not zero and learning is meaningful.

Rows are generated in fixed blocks of ``block_rows``, each from its own seed, and
written straight to shards by a pool of threads (the numba kernel and the Parquet writer
release the GIL): the matrix is never built whole and the output does not depend on the
number of threads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from bigrate.data._kernels import sparse_dot_rows, synth_rows
from bigrate.data.format import DEFAULT_ROW_GROUP_SIZE, DEFAULT_ROWS_PER_FILE, RowBlock
from bigrate.data.prep.common import Progress
from bigrate.data.split import StratifiedSplitter, parse_fractions
from bigrate.data.writer import DatasetWriter

RCV1_ROWS = 804_414
RCV1_FEATURES = 47_236


@dataclass
class SynthSpec:
    rows: int = RCV1_ROWS
    features: int = RCV1_FEATURES
    nnz: float = 76.0
    neg_fraction: float = 0.15
    label_noise: float = 0.01
    zipf: float = 1.1
    teacher_nnz: int = 300
    seed: int = 0

    def validate(self) -> None:
        if self.rows < 2:
            raise ValueError(f"rows must be >= 2, got {self.rows}")
        if self.features < 2:
            raise ValueError(f"features must be >= 2, got {self.features}")
        if not 1 <= self.nnz <= self.features:
            raise ValueError(f"nnz must be in [1, features], got {self.nnz}")
        if not 0 < self.neg_fraction < 1:
            raise ValueError(f"neg_fraction must be in (0, 1), got {self.neg_fraction}")
        if not 0 <= self.label_noise < 0.5:
            raise ValueError(f"label_noise must be in [0, 0.5), got {self.label_noise}")
        if self.zipf <= 0:
            raise ValueError(f"zipf must be > 0, got {self.zipf}")


class SynthGenerator:
    """Deterministic generator of row blocks for a :class:`SynthSpec`."""

    def __init__(self, spec: SynthSpec):
        spec.validate()
        self.spec = spec
        rng = np.random.default_rng([spec.seed, 1])
        d = spec.features
        perm = rng.permutation(d)
        p_rank = 1.0 / (np.arange(d) + 10.0) ** spec.zipf
        p_rank /= p_rank.sum()
        p = np.empty(d)
        p[perm] = p_rank
        self.p = p
        self.cdf = np.cumsum(p)
        self.cdf[-1] = 1.0
        self.idf = np.log(1.0 / p).astype(np.float32)
        k = min(spec.teacher_nnz, d)
        # teacher weights on words of the top half of popularity, so they occur
        top = perm[: max(k, d // 2)]
        support = rng.choice(top, size=k, replace=False)
        self.w = np.zeros(d)
        self.w[support] = rng.standard_normal(k)
        sigma = 0.6
        # repeated draws of popular words merge, so draw ~12% more than the target
        # number of distinct words a row
        self.mu = np.log(spec.nnz * 1.12) - sigma**2 / 2
        self.sigma = sigma
        pilot = self._features(
            np.random.default_rng([spec.seed, 2]), min(20_000, 10 * spec.rows)
        )
        scores = sparse_dot_rows(pilot.indptr, pilot.indices, pilot.data, self.w)
        # flipping a share e of labels moves the negative share q to q (1 - 2e) + e
        e = spec.label_noise
        q = min(max((spec.neg_fraction - e) / (1 - 2 * e), 0.0), 1.0)
        self.threshold = float(np.quantile(scores, q))

    def _features(self, rng: np.random.Generator, n: int) -> sp.csr_matrix:
        lengths = np.maximum(1, np.rint(rng.lognormal(self.mu, self.sigma, n))).astype(
            np.int64
        )
        lengths = np.minimum(lengths, self.spec.features)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        draws = np.searchsorted(self.cdf, rng.random(int(ptr[-1])), side="right")
        draws = np.minimum(draws, self.spec.features - 1).astype(np.int32)
        out_idx = np.empty(int(ptr[-1]), dtype=np.int32)
        out_val = np.empty(int(ptr[-1]), dtype=np.float32)
        out_ptr = np.empty(n + 1, dtype=np.int64)
        used = synth_rows(draws, ptr, self.idf, out_idx, out_val, out_ptr)
        return sp.csr_matrix(
            (out_val[:used], out_idx[:used], out_ptr), shape=(n, self.spec.features)
        )

    def block(self, index: int, start: int, n: int) -> RowBlock:
        """Rows ``start .. start + n - 1``, the ``index``-th block (its own seed)."""
        rng = np.random.default_rng([self.spec.seed, 3, index])
        X = self._features(rng, n)
        score = sparse_dot_rows(X.indptr, X.indices, X.data, self.w)
        y = np.where(score > self.threshold, 1, -1).astype(np.int8)
        flip = rng.random(n) < self.spec.label_noise
        y[flip] = -y[flip]
        X.indptr = X.indptr.astype(np.int32)
        return RowBlock(X=X, y=y, row_id=np.arange(start, start + n, dtype=np.int64))


def prep_synth(
    out,
    *,
    rows: int = RCV1_ROWS,
    features: int = RCV1_FEATURES,
    nnz: float = 76.0,
    neg_fraction: float = 0.15,
    label_noise: float = 0.01,
    seed: int = 0,
    split: str | dict = "train=0.8,val=0.1,test=0.1",
    block_rows: int = 65_536,
    jobs: int | None = None,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    compression: str = "lz4",
    overwrite: bool = False,
    progress: bool = True,
    name: str | None = None,
    command: str | None = None,
) -> dict:
    """Generate an RCV1-shaped dataset straight into shards; returns the manifest.

    Each block of ``block_rows`` rows is split (exactly stratified within the block,
    seeded) and written as part file number ``block`` of each (split, class), so the
    result is the same for any ``jobs``.
    """
    spec = SynthSpec(
        rows=rows,
        features=features,
        nnz=nnz,
        neg_fraction=neg_fraction,
        label_noise=label_noise,
        seed=seed,
    )
    fractions = parse_fractions(split)
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    gen = SynthGenerator(spec)
    jobs = jobs or min(4, os.cpu_count() or 1)
    nblocks = -(-rows // block_rows)
    prog = Progress("prep synth", total=rows, enabled=progress)

    def make(b: int) -> int:
        start = b * block_rows
        n = min(block_rows, rows - start)
        block = gen.block(b, start, n)
        splitter = StratifiedSplitter(fractions, seed=seed * 1_000_003 + b)
        pieces = splitter.push(block) + splitter.finish()
        by_split: dict[str, list[RowBlock]] = {}
        for s, piece in pieces:
            by_split.setdefault(s, []).append(piece)
        for s, parts in by_split.items():
            merged = RowBlock.concat(parts)
            merged = merged.take(np.argsort(merged.row_id, kind="stable"))
            for cls, lab in (("pos", 1), ("neg", -1)):
                sel = merged.y == lab
                if sel.any():
                    w.write_part(s, cls, b, merged.take(sel))
        return n

    with DatasetWriter(
        out,
        splits=list(fractions),
        overwrite=overwrite,
        row_group_size=row_group_size,
        rows_per_file=max(rows_per_file, row_group_size),
        compression=compression,
    ) as w:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for n in pool.map(make, range(nblocks)):
                prog.update(n)
        prog.close("done")
        return w.commit(
            n_features=features,
            label_mapping={
                "positive": ["1"],
                "negative": ["-1"],
                "note": "synthetic: +1 above the teacher's threshold",
            },
            preprocessing={
                "l2_normalize": True,
                "split": {
                    "fractions": fractions,
                    "seed": int(seed),
                    "method": "exact per-class stratification within each block",
                },
                "synthetic": {
                    **spec.__dict__,
                    "block_rows": block_rows,
                    "score_threshold": gen.threshold,
                },
            },
            sources=[],
            command=command,
            name=name,
        )
