"""Per-feature standardisation of dense features: statistics streamed over the train
split only, the map stored in the manifest and applied to every split (and, through a
saved model, to the data it later scores).

A feature j is mapped to ``(x_j - mean_j) / scale_j`` where ``mean_j`` and ``scale_j``
(the population standard deviation, 1 for a constant feature) come from the train rows.
Sparse rows store only their non-zeros; an absent entry is a zero and counts as one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from bigrate.errors import DataError


class RunningMoments:
    """Count, mean and sum of squared deviations of every feature over the rows of
    the CSR blocks given to :meth:`update`. Each block's moments are computed about
    its own mean (no cancellation in sum-of-squares form) and merged exactly (Chan,
    Golub and LeVeque's pairwise update)."""

    def __init__(self, n_features: int):
        self.d = int(n_features)
        self.n = 0
        self.mean = np.zeros(self.d)
        self.m2 = np.zeros(self.d)

    def update(self, X: sp.csr_matrix) -> None:
        nb = X.shape[0]
        if nb == 0:
            return
        if X.shape[1] > self.d:
            raise ValueError(f"block has {X.shape[1]} features, expected {self.d}")
        idx = X.indices
        val = X.data.astype(np.float64)
        mean_b = np.bincount(idx, weights=val, minlength=self.d) / nb
        dev = val - mean_b[idx]
        present = np.bincount(idx, minlength=self.d)
        # the block's absent entries are zeros, each mean_b away from the mean
        m2_b = np.bincount(idx, weights=dev * dev, minlength=self.d)
        m2_b += (nb - present) * mean_b * mean_b
        n = self.n + nb
        delta = mean_b - self.mean
        self.mean += delta * (nb / n)
        self.m2 += m2_b + delta * delta * (self.n * nb / n)
        self.n = n

    def standardizer(self) -> Standardizer:
        if self.n == 0:
            raise DataError("no train rows to compute the standardisation from")
        std = np.sqrt(self.m2 / self.n)
        # a feature constant on the train rows is only centred
        tiny = std <= 1e-12 * np.maximum(1.0, np.abs(self.mean))
        scale = np.where(tiny, 1.0, std)
        return Standardizer(mean=self.mean.copy(), scale=scale, n_rows=self.n)


@dataclass
class Standardizer:
    """The per-feature map ``x -> (x - mean) / scale``."""

    mean: np.ndarray
    scale: np.ndarray
    n_rows: int = 0

    @property
    def n_features(self) -> int:
        return len(self.mean)

    def to_json(self) -> dict:
        return {
            "method": "(x - mean) / scale; mean and population std of the train split",
            "rows": int(self.n_rows),
            "mean": [float(v) for v in self.mean],
            "scale": [float(v) for v in self.scale],
        }

    @classmethod
    def from_json(cls, rec, n_features: int, where: str) -> Standardizer:
        """Validated: ``where`` names the file the record came from in errors."""
        if not isinstance(rec, dict):
            raise DataError(f"'standardize' must be an object, got {type(rec).__name__}",
                            path=where)  # fmt: skip
        try:
            mean = np.asarray(rec["mean"], dtype=np.float64)
            scale = np.asarray(rec["scale"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"'standardize' needs numeric lists 'mean' and 'scale' ({e})",
                path=where,
            ) from None
        for name, a in (("mean", mean), ("scale", scale)):
            if a.shape != (n_features,):
                raise DataError(
                    f"standardize.{name} has {a.size} values, expected one per feature "
                    f"({n_features})",
                    path=where,
                )
            if not np.isfinite(a).all():
                raise DataError(f"standardize.{name} has non-finite values", path=where)
        if (scale <= 0).any():
            raise DataError("standardize.scale must be positive", path=where)
        return cls(mean=mean, scale=scale, n_rows=int(rec.get("rows", 0)))

    def same_as(self, other: Standardizer | None) -> bool:
        return (
            other is not None
            and other.n_features == self.n_features
            and np.array_equal(other.mean, self.mean)
            and np.array_equal(other.scale, self.scale)
        )

    def apply(self, X: sp.csr_matrix, dtype=np.float32) -> sp.csr_matrix:
        """Standardised rows (every feature present unless it comes out exactly 0).
        Done in slices of about a million cells, so a block's dense copy stays small."""
        d = self.n_features
        if X.shape[1] != d:
            raise ValueError(f"rows have {X.shape[1]} features, expected {d}")
        step = max(1, (1 << 20) // max(d, 1))
        out = []
        for a in range(0, X.shape[0], step):
            dense = X[a : a + step].toarray().astype(np.float64)
            dense -= self.mean
            dense /= self.scale
            out.append(sp.csr_matrix(dense.astype(dtype)))
        if not out:
            return sp.csr_matrix((0, d), dtype=dtype)
        return sp.vstack(out, format="csr", dtype=dtype)

    def invert(self, X: sp.csr_matrix) -> sp.csr_matrix:
        """Raw rows back from standardised ones (float64)."""
        inv = Standardizer(mean=-self.mean / self.scale, scale=1.0 / self.scale)
        return inv.apply(X, dtype=np.float64)


def convert(
    X: sp.csr_matrix, have: Standardizer | None, want: Standardizer | None
) -> sp.csr_matrix:
    """Rows stored under map ``have`` (None: raw) expressed under map ``want``."""
    if want is None and have is None:
        return X
    if want is not None and want.same_as(have):
        return X
    raw = have.invert(X) if have is not None else X
    return want.apply(raw) if want is not None else raw.astype(np.float32)
