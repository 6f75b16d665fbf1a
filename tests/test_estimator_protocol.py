"""One check suite over every estimator the package exports: scikit-learn's estimator
checks, and ours (saved and loaded as plain data with identical scores, predict agrees
with decision_function, unfitted use raises NotFittedError)."""

import json
import warnings

import numpy as np
import pytest
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

import bigrate
from bigrate import (
    AUMLinearClassifier,
    BigrateWarning,
    BPSPSearchCV,
    CostSensitiveSVC,
    NeymanPearsonSGD,
    NeymanPearsonSVC,
    NPSearchCV,
    QuantilePathSVC,
    QValueSGD,
    RateConstrainedClassifier,
    load_model,
)
from bigrate.constrained import churn, error_rate, positive_rate


def _instances():
    """Small, fast configurations of every exported estimator."""
    return [
        NeymanPearsonSGD(epochs=2, random_state=0),
        NeymanPearsonSGD(epochs=2, init="logistic", random_state=0),
        QValueSGD(epochs=2, random_state=0),
        QValueSGD(epochs=2, init="logistic", random_state=0),
        CostSensitiveSVC(C_pos=1.0, C_neg=2.0),
        NeymanPearsonSVC(rho=0.2, max_iter=20, random_state=0),
        AUMLinearClassifier(max_iter=20, random_state=0),
        RateConstrainedClassifier(mm_iterations=3),
        QuantilePathSVC(),
        NPSearchCV(
            NeymanPearsonSGD(epochs=2, random_state=0),
            {"alpha": [1e-4, 1e-2]},
            rho=0.1,
            cv=2,
            engine="local",
            progress=False,
        ),
        BPSPSearchCV(  # linear kernel, C+ + C- <= 1.1: the exact partition stays small
            kernel="linear",
            cv=2,
            engine="local",
            lambda_min=0.9,
            spaces=["lambda_eta"],
            progress=False,
        ),
    ]


def test_every_exported_estimator_is_checked():
    exported = {
        name
        for name in bigrate.__all__
        if isinstance(getattr(bigrate, name), type)
        and issubclass(getattr(bigrate, name), BaseEstimator)
    }
    assert exported == {type(e).__name__ for e in _instances()}


@parametrize_with_checks(_instances())  # no check is expected to fail
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BigrateWarning)  # short fits on tiny data
        check(estimator)


def _blobs(n=120, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = np.r_[rng.normal(0.8, 1, (n, d)), rng.normal(-0.8, 1, (n, d))]
    y = np.r_[np.ones(n, int), np.zeros(n, int)]  # labels {0, 1}: 1 is positive
    return X, y


def _fitted(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BigrateWarning)
        return est.fit(X, y)


@pytest.mark.parametrize("est", _instances(), ids=lambda e: type(e).__name__)
def test_unfitted_use_raises_not_fitted(est, tmp_path):
    X, _ = _blobs(5)
    for call in (est.predict, est.decision_function):
        with pytest.raises(NotFittedError):
            call(X)
    with pytest.raises(NotFittedError):
        est.save(tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("est", _instances(), ids=lambda e: type(e).__name__)
def test_save_load_round_trip_gives_identical_scores(est, tmp_path):
    X, y = _blobs()
    est = _fitted(est, X, y)
    est.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    assert meta["class"].endswith(type(est).__name__)
    with np.load(tmp_path / "m" / "arrays.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    back = load_model(tmp_path / "m")
    assert type(back) is type(est)
    assert back.get_params(deep=False).keys() == est.get_params(deep=False).keys()
    np.testing.assert_array_equal(back.decision_function(X), est.decision_function(X))
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    np.testing.assert_array_equal(back.classes_, est.classes_)
    # saving again over it replaces the model atomically
    back.save(tmp_path / "m")
    np.testing.assert_array_equal(
        load_model(tmp_path / "m").decision_function(X), est.decision_function(X)
    )


@pytest.mark.parametrize("est", _instances(), ids=lambda e: type(e).__name__)
def test_predict_agrees_with_decision_function(est):
    """predict is classes_[1] exactly where the score is >= 0 (the package's convention,
    the one Pfa counts with)."""
    X, y = _blobs(seed=1)
    est = _fitted(est, X, y)
    f = est.decision_function(X)
    np.testing.assert_array_equal(est.predict(X), est.classes_[(f >= 0).astype(int)])


@pytest.mark.parametrize("est", _instances(), ids=lambda e: type(e).__name__)
def test_every_estimator_predicts_a_score_of_zero_positive(est):
    """The tie convention is one and the same: a row scoring exactly 0 is predicted
    positive (classes_[1]) by every estimator, as Pfa counts it a false alarm. The
    scores are set (the model that computes them replaced by fixed ones) to hold an
    exact zero, which no fit gives on purpose."""
    from bigrate.metrics import Confusion

    X, y = _blobs(seed=1)
    est = _fitted(est, X, y)
    fixed = np.array([-1.0, -0.0, 0.0, 1e-300, 2.0])
    scored = getattr(est, "best_estimator_", est)  # searches predict through it
    scored.decision_function = lambda X, *args: fixed
    got = est.predict(X[:5])
    np.testing.assert_array_equal(got, est.classes_[[0, 1, 1, 1, 1]])
    # the false alarms Pfa counts are exactly the negatives predicted positive
    c = Confusion.of(np.full(5, -1), fixed)
    assert c.false_alarms == int(np.sum(got == est.classes_[1]))


def test_every_exported_estimator_is_a_job():
    """The job registry names every estimator the package exports, and each one's
    declared promise is a parameter it has and a metric sweeps know."""
    from bigrate.metrics import SELECT
    from bigrate.runner.registry import ESTIMATORS

    exported = {
        name
        for name in bigrate.__all__
        if isinstance(getattr(bigrate, name), type)
        and issubclass(getattr(bigrate, name), BaseEstimator)
    }
    assert set(ESTIMATORS) == exported
    for name, e in ESTIMATORS.items():
        cls = e.load()
        assert cls is getattr(bigrate, name)
        assert cls._sweep_select in SELECT
        assert e.fit in ("rounds", "task", "search", "sweep")
        assert e.data in ("shards", "sparse", "dense")
        assert set(e.kinds) <= {"train", "sweep", "crossfit", "evaluate"}
        # what a job does with it follows from what the class can do
        assert (e.fit == "rounds") == hasattr(cls, "start_stream")
        assert (e.fit == "search") == hasattr(cls, "assemble")
        if cls._rate_target is not None:
            assert cls._rate_target in cls().get_params()
    targets = {type(est).__name__: est.rate_target() for est in _instances()}
    assert targets["NeymanPearsonSGD"] == {"rho": 0.05}
    assert targets["QValueSGD"] == {"q": 0.01}
    assert targets["NPSearchCV"] == {"rho": 0.1}
    assert targets["CostSensitiveSVC"] == {} == targets["AUMLinearClassifier"]


def test_constraints_with_masks_and_baselines_round_trip(tmp_path):
    """The vocabulary (masks, a churn baseline model, an init model) saves as plain data
    and the loaded learner refits to the same model."""
    X, y = _blobs(seed=2)
    g = np.where(np.arange(len(y)) % 2 == 0, "A", "B")
    base = NeymanPearsonSGD(rho=0.2, epochs=3, random_state=0).fit(X, y)
    mask = np.arange(len(y)) < 50
    est = RateConstrainedClassifier(
        objective=error_rate(),
        constraints=[
            positive_rate(group="A") >= 0.8 * positive_rate(group="B"),
            churn(baseline=base, mask=mask) <= 0.3,
        ],
        init=base,
        mm_iterations=3,
    )
    est.fit(X, y, groups=g)
    est.save(tmp_path / "rc")
    back = load_model(tmp_path / "rc")
    np.testing.assert_array_equal(back.decision_function(X), est.decision_function(X))
    sub = back.constraints[1].expr.terms[0].subset
    np.testing.assert_array_equal(sub.mask, mask)
    np.testing.assert_array_equal(
        sub.baseline.decision_function(X), base.decision_function(X)
    )
    again = back.fit(X, y, groups=g)
    np.testing.assert_allclose(
        again.decision_function(X), est.decision_function(X), rtol=1e-10, atol=1e-10
    )


def test_a_value_that_is_not_plain_data_is_refused_by_name(tmp_path):
    class Deployed:  # not a bigrate or scikit-learn estimator
        def decision_function(self, X):
            return X[:, 0]

    X, y = _blobs(seed=3)
    est = RateConstrainedClassifier(
        constraints=[churn(baseline=Deployed()) <= 0.3], mm_iterations=2
    ).fit(X, y)
    with pytest.raises(TypeError, match=r"constraints\[0\].*baseline.*Deployed"):
        est.save(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    assert not list(tmp_path.iterdir())  # no temporary directory left behind


def test_the_readme_glossary_names_every_parameter():
    """Every parameter of every estimator a job can name is in the README's glossary,
    with the estimators it belongs to in the same row."""
    import re

    from bigrate.linear import NeymanPearsonSGD
    from bigrate.runner.registry import ESTIMATORS
    from tests.conftest import REPO

    text = (REPO / "README.md").read_text()
    start = text.index("### Parameters: one glossary")
    section = text[start : text.index("\n## ", start)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split(" | ")]
        if line.startswith("| `") and len(cells) == 3:
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[2]
    missing = []
    for est_name, e in ESTIMATORS.items():
        cls = e.load()
        est = cls(NeymanPearsonSGD(), {}) if est_name == "NPSearchCV" else cls()
        for p in est.get_params(deep=False):
            if p not in rows or est_name not in rows[p] and "all" not in rows[p]:
                missing.append(f"{est_name}.{p}")
    assert not missing, missing
