"""BPSPSearchCV: the exact cost-weighted K-fold CV error of the cost-sensitive SVM over
every (C+, C-) (Gu et al. 2015), one engine task per (gamma, space, fold), the folds'
error maps superposed exactly and the best region's centre refitted."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
import shapely
import shapely.geometry
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate.base import RateClassifierMixin
from bigrate.engines import open_engine
from bigrate.model_selection.bpsp.geometry import (
    REPAIR_GRIDS,
    dissolve,
    largest,
    parts,
    superpose,
)
from bigrate.model_selection.bpsp.partition import (
    SPACES,
    Diagnostics,
    Partitioner,
    invariant_cells,
    merge_duplicates,
)

# ---------------------------------------------------------------- the estimator


def _fold_map(data, train, test, params):
    """One task: the partition on the training rows and its invariant regions on the
    test rows, dissolved by cost-weighted error; geometry as WKB (plain data)."""
    import time

    X, y = data
    t0 = time.perf_counter()
    Xt, yt, weight = merge_duplicates(X[train], y[train])
    part = Partitioner(
        Xt, yt, kernel=params["kernel"], gamma=params["gamma"],
        coef0=params["coef0"], degree=params["degree"],
        lambda_min=params["lambda_min"], max_regions=params["max_regions"],
        method=params["method"], space=params["space"], weight=weight,
    )  # fmt: skip
    regions = part.run()
    from bigrate.kernel.smo import cross_kernel

    Kv = cross_kernel(X[test], Xt, params["kernel"], params["gamma"],
                      params["coef0"], params["degree"])  # fmt: skip
    pairs = []
    for r in regions:
        pairs += invariant_cells(r, Kv, yt, y[test], params["cost_fn"],
                                 params["cost_fp"])  # fmt: skip
    dmap = dissolve(pairs, part.diag)
    distinct = len({r.state.tobytes() for r in regions})
    return {
        "map": [(v, shapely.to_wkb(g)) for v, g in dmap.items()],
        "diagnostics": {**part.diag.as_dict(), "distinct_partitions": distinct,
                        "merged_rows": int(len(train) - len(yt)),
                        "invariant_cells": len(pairs),
                        "seconds": time.perf_counter() - t0},
    }  # fmt: skip


class BPSPSearchCV(RateClassifierMixin, BaseEstimator):
    """Exact K-fold cross-validation of the cost-sensitive SVM over every (C+, C-)
    with C+ + C- >= 1 / lambda_max (Gu et al. 2015): the (lambda, eta) rectangle
    [lambda_min, 1] x [0, 1] (lambda = 1 / (C+ + C-), eta = C+ / (C+ + C-)) is
    partitioned into the critical regions of each training fold, each refined by the
    sign pattern on its validation fold; superposing the folds gives the CV error of
    every parameter pair as polygons, and the centre of the best one is returned.

    Parameters
    ----------
    kernel, gamma, coef0, degree : as CostSensitiveSVC; ``gamma`` may be a list (one
        partition per value).
    cv : int >= 2 or an iterable of (train, test) index arrays
    cost_fn, cost_fp : float > 0
        Validation cost of a positive predicted negative / a negative predicted
        positive (the paper's C(-,+) and C(+,-)).
    engine : {"ray", "dask", "local"}; address: an existing cluster (None: embedded Ray on
        127.0.0.1). One task per (fold, gamma); the data go to the object store once.
    lambda_min : float in (0, 1)
        Smallest lambda (largest C+ + C- = 1 / lambda_min) searched.
    max_regions : int
        Per fold and gamma: stop with an error beyond this many regions.
    run_dir : path or None
        Where the partition is saved (``bpsp_partition.json``, GeoJSON-like, and the
        CV-error map ``bpsp_cv_error.png``).
    method : {"neighbours", "theorem2"}
        "theorem2": Algorithm 1 with Theorem 2's pieces (each critical region met in
        several pieces). "neighbours": each critical region once, whole, reached from
        its neighbours (Theorem 3), gaps seeded by direct solves and overlaps given to
        the earlier region (about 4x fewer regions, 2x faster). Both partition the
        rectangle exactly.

    spaces : list of {"lambda_eta", "c_pos_c_neg"}
        The (lambda, eta) rectangle (C+ + C- from 1 to 1 / lambda_min) and the (C+, C-)
        lower triangle (C+ + C- <= 1); both by default: all of C+ + C- <= 1/lambda_min.

    Attributes
    ----------
    best_params_ (gamma, space, lambda, eta, C_pos, C_neg), cv_error_ (cost-weighted
    errors per validation row), partition_ (per gamma and space: [{"cv_error",
    "geometry"}] in that space's coordinates), diagnostics_ (the same keys, per fold),
    best_estimator_ (CostSensitiveSVC refitted on all rows).
    """

    _accepts_sparse = False  # the partition works on a dense kernel matrix

    _parameter_constraints: dict = {
        "kernel": [StrOptions({"linear", "rbf", "poly"})],
        "gamma": "no_validation",
        "coef0": [Real],
        "degree": [Interval(Integral, 1, None, closed="left")],
        "cv": "no_validation",
        "cost_fn": [Interval(Real, 0, None, closed="neither")],
        "cost_fp": [Interval(Real, 0, None, closed="neither")],
        "engine": [StrOptions({"ray", "dask", "local"})],
        "address": [str, None],
        "lambda_min": [Interval(Real, 0, 1, closed="neither")],
        "max_regions": [Interval(Integral, 1, None, closed="left")],
        "run_dir": "no_validation",
        "random_state": ["random_state"],
        "progress": ["boolean"],
        "method": [StrOptions({"neighbours", "theorem2"})],
        "spaces": "no_validation",
    }

    def __init__(self, *, kernel="rbf", gamma="scale", coef0=0.0, degree=3, cv=5,
                 cost_fn=1.0, cost_fp=1.0, engine="ray", address=None,
                 lambda_min=1e-3, max_regions=20_000, run_dir=None, random_state=0,
                 progress=True, method="neighbours",
                 spaces=("lambda_eta", "c_pos_c_neg")):  # fmt: skip
        self.kernel = kernel
        self.gamma = gamma
        self.coef0 = coef0
        self.degree = degree
        self.cv = cv
        self.cost_fn = cost_fn
        self.cost_fp = cost_fp
        self.engine = engine
        self.address = address
        self.lambda_min = lambda_min
        self.max_regions = max_regions
        self.run_dir = run_dir
        self.random_state = random_state
        self.progress = progress
        self.method = method
        self.spaces = spaces

    def _splits(self, X, y):
        from bigrate.model_selection.sweep import cv_splits

        return cv_splits(self.cv, y, self.random_state, fraction=False, min_folds=2)

    def _gammas(self, X):
        from bigrate.kernel.smo import resolve_gamma

        raw = self.gamma if isinstance(self.gamma, (list, tuple)) else [self.gamma]
        out = []
        for g in raw:
            if isinstance(g, str) and g in ("scale", "auto"):
                out.append(resolve_gamma(g, X))
            elif isinstance(g, Real) and g > 0:
                out.append(float(g))
            else:
                raise ValueError(
                    f"gamma must be a float > 0, 'scale', 'auto' or a list of them; "
                    f"got {g!r}"
                )
        return out

    def fit(self, X, y):
        from bigrate.base import binary_classes
        from bigrate.kernel.svc import CostSensitiveSVC
        from bigrate.progress import Progress

        self._validate_params()
        X, y = validate_data(self, X, y, dtype=np.float64)
        yy = binary_classes(self, y).astype(float)
        splits = self._splits(X, yy)
        gammas = self._gammas(X)
        bad = [sp for sp in self.spaces if sp not in SPACES] or not len(self.spaces)
        if bad:
            raise ValueError(
                f"spaces must be a non-empty list of {sorted(SPACES)}, got "
                f"{self.spaces!r}"
            )
        base = {"kernel": self.kernel, "coef0": float(self.coef0),
                "degree": int(self.degree), "lambda_min": float(self.lambda_min),
                "max_regions": int(self.max_regions), "cost_fn": float(self.cost_fn),
                "cost_fp": float(self.cost_fp), "method": self.method}  # fmt: skip
        spaces = list(dict.fromkeys(self.spaces))
        tasks = [(g, sp, k) for g in range(len(gammas)) for sp in spaces
                 for k in range(len(splits))]  # fmt: skip
        bar = Progress("BPSP folds", total=len(tasks), enabled=self.progress)
        results = {}
        with open_engine(self.engine, self.address) as eng:
            handle = eng.put((X, yy))
            args = [(handle, splits[k][0], splits[k][1],
                     {**base, "gamma": gammas[g], "space": sp})
                    for g, sp, k in tasks]  # fmt: skip
            for j, res in eng.map(_fold_map, args):
                g, sp, k = tasks[j]
                if isinstance(res, Exception):
                    raise RuntimeError(
                        f"BPSP task (gamma={gammas[g]:g}, {sp}, fold {k}) failed: {res}"
                    ) from res
                results[tasks[j]] = res
                bar.update(1)
        bar.close()
        n_val = sum(len(te) for _, te in splits)
        self.partition_, self.diagnostics_ = {}, {}
        best = None
        for g, gamma in enumerate(gammas):
            self.partition_[gamma], self.diagnostics_[gamma] = {}, {}
            for sp in spaces:
                maps = [
                    {v: shapely.from_wkb(w) for v, w in results[(g, sp, k)]["map"]}
                    for k in range(len(splits))
                ]
                fix = Diagnostics()
                total = superpose(maps, fix)
                if fix.geometry_repairs:
                    warnings.warn(
                        f"gamma={gamma:g}, {sp}: {fix.geometry_repairs} overlays of "
                        f"the fold superposition were repaired on a grid of "
                        f"{REPAIR_GRIDS[-1]:g} or finer (GEOS topology errors)",
                        stacklevel=2,
                    )
                cells = sorted(((v / n_val, geom) for v, geom in total.items()),
                               key=lambda t: t[0])  # fmt: skip
                self.partition_[gamma][sp] = [
                    {"cv_error": e, "geometry": shapely.geometry.mapping(geom)}
                    for e, geom in cells
                ]
                self.diagnostics_[gamma][sp] = [
                    results[(g, sp, k)]["diagnostics"] for k in range(len(splits))
                ]
                if best is None or cells[0][0] < best[0]:
                    best = (cells[0][0], gamma, sp, cells[0][1])
        err, gamma, sp, geom = best
        piece = largest(geom)
        centre = piece.centroid
        if not piece.contains(centre):
            centre = piece.representative_point()
        c_pos, c_neg = SPACES[sp].costs(centre.x, centre.y)
        self.cv_error_ = float(err)
        self.best_params_ = {"gamma": gamma, "space": sp, "lambda": 1 / (c_pos + c_neg),
                             "eta": c_pos / (c_pos + c_neg), "C_pos": c_pos,
                             "C_neg": c_neg}  # fmt: skip
        self.best_estimator_ = CostSensitiveSVC(
            C_pos=max(c_pos, 1e-12), C_neg=max(c_neg, 1e-12),
            kernel=self.kernel, gamma=gamma, coef0=self.coef0, degree=self.degree,
        ).fit(X, y)  # fmt: skip
        if self.run_dir is not None:
            self._save()
        return self

    def decision_function(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.decision_function(X)

    def predict(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)

    def plot(self, path, gamma=None):
        """The CV-error map as PNG: the (lambda, eta) rectangle, and every searched
        space over (log2 C+, log2 C-) (edges densified before the change of
        coordinates, which bends them)."""
        from matplotlib.collections import PolyCollection

        from bigrate._plot import pyplot, save_png

        gamma = self.best_params_["gamma"] if gamma is None else gamma
        fig, axes = pyplot().subplots(1, 2, figsize=(10, 4))
        for ax, log_c in zip(axes, (False, True), strict=True):
            polys, vals = [], []
            for sp, cells in self.partition_[gamma].items():
                if not log_c and sp != "lambda_eta":
                    continue
                for c in cells:
                    geom = shapely.geometry.shape(c["geometry"])
                    for part in parts(geom):
                        xy = np.array(shapely.segmentize(part, 0.01).exterior.coords)
                        if log_c:
                            xy = np.clip(xy, 1e-4, None)
                            if sp == "lambda_eta":
                                eta = np.clip(xy[:, 1], 1e-4, 1 - 1e-4)
                                xy = np.c_[eta / xy[:, 0], (1 - eta) / xy[:, 0]]
                            xy = np.log2(xy)
                        polys.append(xy)
                        vals.append(c["cv_error"])
            if not polys:
                ax.set_axis_off()
                continue
            pc = PolyCollection(polys, array=np.array(vals), cmap="viridis",
                                edgecolors="none")  # fmt: skip
            ax.add_collection(pc)
            ax.autoscale()
            bp = self.best_params_
            best = ((np.log2(max(bp["C_pos"], 1e-4)), np.log2(max(bp["C_neg"], 1e-4)))
                    if log_c else (bp["lambda"], bp["eta"]))  # fmt: skip
            ax.plot(*best, "r*", ms=12)
            ax.set_xlabel("log2 C+" if log_c else "lambda = 1 / (C+ + C-)")
            ax.set_ylabel("log2 C-" if log_c else "eta = C+ / (C+ + C-)")
            fig.colorbar(pc, ax=ax, label="CV error")
        fig.suptitle(f"BPSP CV error (gamma {gamma:.4g}), best {self.cv_error_:.4f}")
        return save_png(fig, path)

    def _save(self):
        import json
        from pathlib import Path

        from bigrate.files import atomic_write_text

        out = {
            "best_params": self.best_params_,
            "cv_error": self.cv_error_,
            "partition": [
                {"gamma": g, "space": sp, "cells": cells}
                for g, per in self.partition_.items()
                for sp, cells in per.items()
            ],
            "diagnostics": [
                {"gamma": g, "space": sp, "folds": d}
                for g, per in self.diagnostics_.items()
                for sp, d in per.items()
            ],
        }
        path = Path(self.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / "bpsp_partition.json", json.dumps(out) + "\n")
        self.plot(path / "bpsp_cv_error.png")
