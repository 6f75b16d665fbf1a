"""NPSearchCV: every (parameter point, fold) fit as an engine task, scored by the NP
criterion of Gasso et al. sec. 5.4, J_val = Pnd + max(0, Pfa - rho) / rho, the best refit.

The data go to the workers once (Ray's object store, or Dask's scatter); each finished
fit is saved in a run directory (one JSON file a task and ``results.parquet`` rewritten
atomically), so a sweep interrupted at any point resumes with the same ``run_dir`` and
skips what is done. A task that raises is recorded with its error and the sweep goes on;
a task whose worker dies is retried by the engine.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.model_selection import ParameterGrid, StratifiedKFold, train_test_split
from sklearn.utils.validation import check_is_fitted


def _fit_score(
    module: str, cls: str, params: dict, data, train, test, rho: float
) -> dict:
    """One task: fit on ``train`` rows, J_val on ``test`` rows (runs on a worker)."""
    from bigrate.metrics import Confusion

    X, y = data
    est = getattr(importlib.import_module(module), cls)(**params)
    t = time.perf_counter()
    est.fit(X[train], y[train])
    yt = np.where(y[test] == est.classes_[1], 1, -1)
    c = Confusion.of(yt, est.decision_function(X[test]))
    return {
        "metrics": {"pfa": c.pfa, "pnd": c.pnd, "J_val": c.j_val(rho)},
        "seconds": time.perf_counter() - t,
    }


class NPSearchCV(BaseEstimator):
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
        Where finished fits are kept; an existing one is resumed.
    refit : bool, default True
    random_state : int, default 0
        Seed of the folds.

    Attributes
    ----------
    best_params_, best_score_, best_estimator_, cv_results_ (dict of arrays: params,
    mean_J_val, mean_pfa, mean_pnd, status), n_failed_
    """

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

    def _splits(self, X, y):
        if isinstance(self.cv, (int, np.integer)):
            if self.cv < 2:
                raise ValueError(f"cv must be >= 2 folds, got {self.cv}")
            return list(
                StratifiedKFold(
                    int(self.cv), shuffle=True, random_state=self.random_state
                ).split(X, y)
            )
        if isinstance(self.cv, float):
            if not 0 < self.cv < 1:
                raise ValueError(
                    f"cv as a validation fraction must be in (0, 1), got {self.cv}"
                )
            idx = np.arange(len(y))
            tr, te = train_test_split(
                idx, test_size=self.cv, stratify=y, random_state=self.random_state
            )
            return [(tr, te)]
        return [(np.asarray(a), np.asarray(b)) for a, b in self.cv]

    def _engine(self):
        if self.engine == "ray":
            from bigrate.engines.ray import RayEngine

            return RayEngine(self.address, n_workers=self.n_workers)
        if self.engine == "dask":
            from bigrate.engines.dask import DaskEngine

            return DaskEngine(self.address, n_workers=self.n_workers, dashboard=False)
        if self.engine == "local":
            from bigrate.engines.local import LocalEngine

            return LocalEngine()
        raise ValueError(
            f"engine must be 'ray', 'dask' or 'local', got {self.engine!r}"
        )

    def fit(self, X, y):
        from bigrate.progress import Progress
        from bigrate.runner.rundir import RunDir

        rho = (
            self.rho if self.rho is not None else self.estimator.get_params().get("rho")
        )
        if rho is None or not 0 < rho < 1:
            raise ValueError(f"rho must be in (0, 1), got {rho}")
        base = clone(self.estimator)
        if "rho" in base.get_params():
            base.set_params(rho=rho)
        points = list(ParameterGrid(self.param_grid))
        for p in points:
            clone(base).set_params(
                **p
            )  # unknown parameter names fail here, before work
        y = np.asarray(y)
        splits = self._splits(X, y)
        run = self._run(RunDir, points, rho)
        done = run.results()
        todo = [
            (i, k)
            for i in range(len(points))
            for k in range(len(splits))
            if (i, k) not in done
        ]
        total = len(points) * len(splits)
        bar = Progress("fits", total=total, done=len(done), enabled=self.progress)
        mod, cls = type(base).__module__, type(base).__qualname__
        params0 = base.get_params(deep=False)
        try:
            with self._engine() as eng:
                if todo:
                    handle = eng.put((X, y))
                    args = [
                        (
                            mod,
                            cls,
                            {**params0, **points[i]},
                            handle,
                            splits[k][0],
                            splits[k][1],
                            rho,
                        )
                        for i, k in todo
                    ]
                    for j, res in eng.map(_fit_score, args):
                        i, k = todo[j]
                        rec = {"point": i, "fold": k, "params": points[i]}
                        if isinstance(res, Exception):
                            rec.update(
                                status="failed",
                                error=str(res)[:2000],
                                traceback=getattr(res, "tb", ""),
                            )
                            run.event("task_failed", point=i, fold=k)
                        else:
                            rec.update(status="ok", **res)
                            run.event("task_done", point=i, fold=k)
                        run.save_result(i, k, rec)
                        run.write_results_table()
                        ok = [
                            r["metrics"]["J_val"]
                            for r in run.results().values()
                            if r["status"] == "ok"
                        ]
                        bar.update(1, f"best fold J_val {min(ok):.4g}" if ok else "")
            bar.close()
            self._collect(run.results(), points, len(splits))
        finally:
            run.unlock()
        if self.refit:
            self.best_estimator_ = clone(base).set_params(**self.best_params_).fit(X, y)
            self.classes_ = self.best_estimator_.classes_
        self.run_dir_ = str(run.path)
        return self

    def _run(self, RunDir, points, rho):
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
        if self.run_dir is None:
            import tempfile

            parent = Path(tempfile.mkdtemp(prefix="bigrate-npsearch-"))
            return RunDir.create(parent, "npsearchcv", None, cfg)
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

    def _collect(self, results, points, n_folds):
        mean_j, mean_pfa, mean_pnd, status = [], [], [], []
        for i in range(len(points)):
            recs = [results.get((i, k)) for k in range(n_folds)]
            good = [r for r in recs if r is not None and r["status"] == "ok"]
            if len(good) == n_folds:
                mean_j.append(np.mean([r["metrics"]["J_val"] for r in good]))
                mean_pfa.append(np.mean([r["metrics"]["pfa"] for r in good]))
                mean_pnd.append(np.mean([r["metrics"]["pnd"] for r in good]))
                status.append("ok")
            else:
                mean_j.append(np.nan)
                mean_pfa.append(np.nan)
                mean_pnd.append(np.nan)
                status.append("failed")
        self.cv_results_ = {
            "params": points,
            "mean_J_val": np.array(mean_j),
            "mean_pfa": np.array(mean_pfa),
            "mean_pnd": np.array(mean_pnd),
            "status": np.array(status),
        }
        self.n_failed_ = sum(1 for r in results.values() if r["status"] != "ok")
        if not np.isfinite(self.cv_results_["mean_J_val"]).any():
            raise RuntimeError(
                "every parameter point failed; see the run directory's "
                "results/ for the errors"
            )
        best = int(np.nanargmin(self.cv_results_["mean_J_val"]))
        self.best_index_ = best
        self.best_params_ = points[best]
        self.best_score_ = float(self.cv_results_["mean_J_val"][best])

    def decision_function(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.decision_function(X)

    def predict(self, X):
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X)
