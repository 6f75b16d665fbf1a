"""Warm starts along C: NeymanPearsonSVC(warm_start=True) refits from its previous
solution on the same data only, and NPSearchCV(warm_start=True) runs the points that
differ only in C as one chain per fold, recording each point as its own task."""

import json

import numpy as np
import pytest
from sklearn.datasets import make_classification

from bigrate import CostSensitiveSVC, NeymanPearsonSVC, NPSearchCV


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(n_samples=400, n_features=8, weights=[0.35, 0.65],
                               random_state=3)  # fmt: skip
    return X, np.where(y == 1, 1, -1)


def test_refit_along_c_starts_from_the_previous_solution(data):
    X, y = data
    n_pos = int((y > 0).sum())
    est = NeymanPearsonSVC(rho=0.1, gamma=0.2, C=0.3 * n_pos, warm_start=True)
    assert not est.fit(X, y).warm_started_
    first_steps = est.n_iter_
    # the same C again: already at a DC fixed point, Pfa in the band at once
    est.fit(X, y)
    assert est.warm_started_ and est.n_iter_ <= 2 < first_steps
    # (calibrated: trained for the held-out threshold's rate, training_rho_)
    assert abs(est.history_[-1]["pfa"] - est.training_rho_) <= est.epsilon + 1e-12
    for mult in (1.0, 3.0, 10.0):
        est.set_params(C=mult * n_pos).fit(X, y)
        assert est.warm_started_ and est.converged_
        assert est.history_[-1]["pfa"] <= est.training_rho_ + est.epsilon + 1e-12
        cold = NeymanPearsonSVC(rho=0.1, gamma=0.2, C=mult * n_pos).fit(X, y)
        assert not cold.warm_started_
        # the kernel rows of the previous fit serve this one from its first solve
        # (a cold fit computes about half of them again)
        assert est.history_[0]["cache_hit_rate"] > 0.95
        assert cold.history_[0]["cache_hit_rate"] < 0.8
        # about as good as the cold fit (a non-convex problem: not identical)
        assert est.history_[-1]["pnd"] <= cold.history_[-1]["pnd"] + 0.03
    # other rows, labels or kernel: a cold start, and the old cache is dropped
    assert not est.fit(X[:-1], y[:-1]).warm_started_
    assert not est.set_params(gamma=0.3).fit(X[:-1], y[:-1]).warm_started_
    # without warm_start nothing is kept
    plain = NeymanPearsonSVC(rho=0.1, gamma=0.2).fit(X, y)
    assert plain._warm is None and not plain.fit(X, y).warm_started_


def test_search_runs_c_chains_and_resumes_their_rest(data, tmp_path):
    X, y = data
    n_pos = int((y > 0).sum() * 2 / 3)  # positives in a training fold, about
    grid = {"C": [3.0 * n_pos, 0.3 * n_pos, 1.0 * n_pos], "gamma": [0.1, 0.5]}
    kw = dict(rho=0.1, cv=3, engine="local", progress=False, refit=False)
    run = tmp_path / "run"
    base = NeymanPearsonSVC(calibrate=None)  # this small a fold has too few negatives
    warm = NPSearchCV(base, grid, warm_start=True, run_dir=run, **kw).fit(X, y)
    cold = NPSearchCV(base, grid, **kw).fit(X, y)
    recs = {}
    for f in (run / "results").glob("point-*-fold-*.json"):
        r = json.loads(f.read_text())
        recs[(r["point"], r["fold"])] = r
    assert len(recs) == 6 * 3 and all(r["status"] == "ok" for r in recs.values())
    # in each chain (one gamma, one fold) the smallest C starts cold, the others warm
    for (p, k), r in recs.items():
        smallest = r["params"]["C"] == min(grid["C"])
        assert r["warm_started"] is (not smallest), (p, k, r["params"])
    assert warm.n_failed_ == 0
    # a non-convex problem: warm and cold fits may differ point by point, the selected
    # point is as good
    assert warm.best_score_ <= cold.best_score_ + 0.02
    # resume after losing two records of one chain: only those are fitted again
    done = sorted(recs)
    lost = [k for k in done if recs[k]["params"]["gamma"] == 0.5 and k[1] == 1]
    lost = [k for k in lost if recs[k]["params"]["C"] != min(grid["C"])]
    assert len(lost) == 2
    keep = {k: (run / "results" / f"point-{k[0]:05d}-fold-{k[1]:03d}.json").stat().st_mtime_ns
            for k in done if k not in lost}  # fmt: skip
    for p, k in lost:
        (run / "results" / f"point-{p:05d}-fold-{k:03d}.json").unlink()
    again = NPSearchCV(base, grid, warm_start=True, run_dir=run, **kw).fit(X, y)
    for k, t in keep.items():
        path = run / "results" / f"point-{k[0]:05d}-fold-{k[1]:03d}.json"
        assert path.stat().st_mtime_ns == t
    for p, k in lost:  # the rest of the chain, from a cold start at its first point
        r = json.loads(
            (run / "results" / f"point-{p:05d}-fold-{k:03d}.json").read_text()
        )
        assert r["status"] == "ok"
    assert again.best_params_ == warm.best_params_


def test_warm_start_needs_an_estimator_that_has_it(data):
    X, y = data
    with pytest.raises(ValueError, match="warm_start parameter"):
        NPSearchCV(CostSensitiveSVC(), {"C_neg": [1.0]}, rho=0.1, engine="local",
                   warm_start=True, progress=False).fit(X, y)  # fmt: skip
