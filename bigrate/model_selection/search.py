"""NPSearchCV: every (parameter point, fold) fit as an engine task, scored by the NP
criterion of Gasso et al. sec. 5.4, J_val = Pnd + max(0, Pfa - rho) / rho, the best refit.

The data go to the workers once (Ray's object store, or Dask's scatter); each finished
fit is saved in a run directory (one JSON file a task and ``results.parquet`` rewritten
atomically), so a sweep interrupted at any point resumes with the same ``run_dir`` and
skips what is done. A task that raises is recorded with its error and the sweep goes on;
a task whose worker dies is retried by the engine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.model_selection import ParameterGrid
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate.base import RateClassifierMixin, binary_classes
from bigrate.engines import open_engine
from bigrate.model_selection.sweep import (
    SharedFolds,
    c_chains,
    cv_splits,
    fit_fold,
    fit_fold_path,
    run_sweep,
    select_best,
)
from bigrate.rundir import MemoryStore, RunDir


class NPSearchCV(RateClassifierMixin, BaseEstimator):
    """Grid search for Neyman-Pearson classifiers, selected by J_val.

    Parameters
    ----------
    estimator : estimator
        A bigrate (or scikit-learn) classifier with fit / decision_function.
    param_grid : dict or list of dicts
    rho : float in (0, 1), optional
        The false-alarm target of J_val; also set on the estimator when it has ``rho``.
        Default: the estimator's ``rho``.
    cv : int, float in (0, 1), or iterable of (train, test) index arrays, default 5
        K stratified folds, a validation fraction (one split), or explicit splits.
    engine : {"ray", "dask", "local"}, default "ray"
    address : str, optional
        Existing cluster; None starts one bound to 127.0.0.1 (``n_workers`` CPUs).
    run_dir : path, optional
        Where finished fits are kept (:class:`~bigrate.rundir.RunDir`); an existing one
        is resumed. None keeps them in memory and writes nothing.
    refit : bool, default True
    random_state : int, default 0
        Seed of the folds.
    warm_start : bool, default False
        Grid points that differ only in ``C`` run as one task per fold, in increasing
        C, each fit warm-started from the previous one (its duals, multiplier and kernel
        cache: the estimator's own ``warm_start``, e.g. :class:`NeymanPearsonSVC`).
        Fewer, longer tasks; a non-convex fit may end at another local solution than
        from a cold start.

    Attributes
    ----------
    best_params_, best_score_, best_estimator_, classes_, n_failed_
    cv_results_ : dict of arrays
        ``params``, ``mean_J_val`` / ``std_J_val``, ``mean_pfa`` / ``std_pfa``,
        ``mean_pnd`` / ``std_pnd`` over the folds, ``rank_J_val`` (1 = best) and
        ``status`` ("ok" or "failed").

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import NeymanPearsonSGD, NPSearchCV
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(1, 1, (200, 2)), rng.normal(-1, 1, (200, 2))]
    >>> y = np.r_[np.ones(200), -np.ones(200)]
    >>> s = NPSearchCV(NeymanPearsonSGD(random_state=0), {"alpha": [1e-4, 1e-2]},
    ...                rho=0.1, cv=3, engine="local", progress=False).fit(X, y)
    >>> sorted(s.best_params_)
    ['alpha']
    """

    _job_fit = "sweep"  # a job runs it as a sweep of the estimator it searches
    _job_kinds = ()
    _sweep_select = "J_val"

    def rate_target(self) -> dict:
        """``{"rho": ...}``: the search's ``rho``, or its estimator's."""
        rho = self.rho if self.rho is not None else self.estimator.get_params()["rho"]
        return {"rho": float(rho)}

    def __init__(
        self,
        estimator,
        param_grid,
        *,
        rho=None,
        cv=5,
        engine="ray",
        address=None,
        n_workers=None,
        run_dir=None,
        refit=True,
        random_state=0,
        progress=True,
        warm_start=False,
    ):
        self.estimator = estimator
        self.param_grid = param_grid
        self.rho = rho
        self.cv = cv
        self.engine = engine
        self.address = address
        self.n_workers = n_workers
        self.run_dir = run_dir
        self.refit = refit
        self.random_state = random_state
        self.progress = progress
        self.warm_start = warm_start

    def _splits(self, X, y):
        return cv_splits(self.cv, y, self.random_state)

    def fit(self, X, y):
        rho = (
            self.rho if self.rho is not None else self.estimator.get_params().get("rho")
        )
        if rho is None or not 0 < rho < 1:
            raise ValueError(f"rho must be in (0, 1), got {rho}")
        base = clone(self.estimator)
        if "rho" in base.get_params():
            base.set_params(rho=rho)
        points = list(ParameterGrid(self.param_grid))
        for p in points:  # unknown parameter names fail here, before any work
            clone(base).set_params(**p)
        X, y = validate_data(
            self, X, y, accept_sparse="csr", dtype="numeric", ensure_all_finite=True
        )
        binary_classes(self, y)
        splits = self._splits(X, y)
        chains = self._chains(base, points)
        store = self._store(points, rho)
        params0 = base.get_params(deep=False)
        try:
            with open_engine(
                self.engine, self.address, n_workers=self.n_workers, dashboard=False
            ) as eng:
                folds = SharedFolds(eng, lambda: (X, y, splits))

                def task_args(i, k):
                    return (type(base), {**params0, **points[i]}, *folds(k),
                            {"rho": rho})  # fmt: skip

                def chain_args(ps, k):
                    *_, handle_, tr, te, target = task_args(ps[0], k)
                    return (type(base), [{**params0, **points[i]} for i in ps],
                            handle_, tr, te, target)  # fmt: skip

                table = run_sweep(
                    eng, store, points, len(splits), fit_fold, task_args,
                    select="J_val", progress=self.progress, chains=chains,
                    chain_task=fit_fold_path, chain_args=chain_args,
                )  # fmt: skip
            self._collect(table, store.results(), points)
        finally:
            store.unlock()
        if self.refit:
            self.best_estimator_ = clone(base).set_params(**self.best_params_).fit(X, y)
            self.classes_ = self.best_estimator_.classes_
        self.run_dir_ = None if store.path is None else str(store.path)
        return self

    def _chains(self, base, points):
        """With ``warm_start``: the points grouped by everything but C, each group in
        increasing C (None without it)."""
        if not self.warm_start:
            return None
        if "warm_start" not in base.get_params():
            raise ValueError(
                f"warm_start=True needs an estimator with a warm_start parameter "
                f"(e.g. NeymanPearsonSVC); {type(base).__name__} has none"
            )
        return c_chains(points, base.get_params().get("C"))

    def _store(self, points, rho):
        if self.run_dir is None:
            return MemoryStore()
        cfg = {
            "job": {
                "kind": "npsearchcv",
                "estimator": type(self.estimator).__name__,
                "points": [{k: str(v) for k, v in p.items()} for p in points],
                "rho": rho,
                "cv": str(self.cv),
                "name": "npsearchcv",
                "engine": self.engine,
                "address": self.address,
            }
        }
        path = Path(self.run_dir)
        if (path / "config.json").exists():
            run = RunDir.open(path)
            run.lock()
            run.event("resumed")
            return run
        path.mkdir(parents=True, exist_ok=True)
        run = RunDir(path)
        run.lock()
        run.write_json("config.json", cfg)
        (path / "results").mkdir(exist_ok=True)
        return run

    def _collect(self, table, results, points):
        keys = ("J_val", "pfa", "pnd")
        res = {"params": points}
        for key in keys:
            for stat in ("mean", "std"):
                res[f"{stat}_{key}"] = np.array(
                    [r.get(f"{stat}_{key}", np.nan) if r["complete"] else np.nan
                     for r in table]
                )  # fmt: skip
        res["status"] = np.array(["ok" if r["complete"] else "failed" for r in table])
        best = select_best(table, "J_val")
        order = np.argsort(np.where(np.isnan(res["mean_J_val"]), np.inf,
                                    res["mean_J_val"]), kind="stable")  # fmt: skip
        rank = np.empty(len(points), int)
        rank[order] = np.arange(1, len(points) + 1)
        res["rank_J_val"] = rank
        self.cv_results_ = res
        self.n_failed_ = sum(1 for r in results.values() if r["status"] != "ok")
        self.best_index_ = int(best["point"])
        self.best_params_ = points[self.best_index_]
        self.best_score_ = float(best["mean_J_val"])

    def decision_function(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.decision_function(X)

    def predict(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)
