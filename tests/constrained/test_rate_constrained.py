"""Dataset constraints: Table 2 metrics against brute-force counts, the ramp majoriser's
properties, MM monotonicity, and constraints met on real (adult) and synthetic data."""

import warnings

import numpy as np
import pytest
from sklearn.svm import LinearSVC

from bigrate import BigrateWarning, RateConstrainedClassifier
from bigrate.constrained import (
    churn,
    count_false_negatives,
    count_false_positives,
    count_true_negatives,
    count_true_positives,
    coverage,
    demographic_parity,
    egregious,
    equal_opportunity,
    error_rate,
    false_negative_rate,
    false_positive_rate,
    negative_rate,
    positive_rate,
    recall,
    true_negative_rate,
)
from bigrate.constrained.classifier import _Compiled, _Data, _hinge_terms, ramp


def _toy(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    g = np.where(rng.random(n) < 0.4, "A", "B")
    X[g == "A", 0] -= 1.0
    y = np.where(X[:, 0] + 0.4 * rng.standard_normal(n) > 0, 1, -1)
    return X, y, g


def _value(expr, X, y, g, z, deterministic=True, datasets=None):
    data = _Data(X, y, g, datasets, 1.0)
    return _Compiled(expr, data, "t").value(z, deterministic)


def test_table2_metrics_match_brute_force_counts():
    X, y, g = _toy()
    rng = np.random.default_rng(1)
    z = rng.standard_normal(len(y))
    pos = z > 0
    A = g == "A"
    brute = {
        "coverage": pos.mean(),
        "pos_A": pos[A].mean(),
        "neg_A": (~pos[A]).mean(),
        "recall": pos[y > 0].mean(),
        "fpr": pos[y < 0].mean(),
        "tnr": (~pos[y < 0]).mean(),
        "fnr": (~pos[y > 0]).mean(),
        "tp": (pos & (y > 0)).sum(),
        "fp": (pos & (y < 0)).sum(),
        "tn": (~pos & (y < 0)).sum(),
        "fn": (~pos & (y > 0)).sum(),
        "error": (pos != (y > 0)).mean(),
        "error_A": (pos[A] != (y[A] > 0)).mean(),
    }
    ours = {
        "coverage": coverage(),
        "pos_A": positive_rate(group="A"),
        "neg_A": negative_rate(group="A"),
        "recall": recall(),
        "fpr": false_positive_rate(),
        "tnr": true_negative_rate(),
        "fnr": false_negative_rate(),
        "tp": count_true_positives(),
        "fp": count_false_positives(),
        "tn": count_true_negatives(),
        "fn": count_false_negatives(),
        "error": error_rate(),
        "error_A": error_rate(group="A"),
    }
    for k, expr in ours.items():
        assert _value(expr, X, y, g, z) == pytest.approx(brute[k], abs=1e-12), k
    # churn against a baseline model, on an unlabeled dataset
    base = LinearSVC().fit(X, y)
    U = rng.standard_normal((50, 3))
    zU = rng.standard_normal(50)
    data = _Data(X, y, g, {"u": U}, 1.0)
    zall = np.r_[z, zU]
    got = _Compiled(churn(baseline=base, dataset="u"), data, "t").value(zall, True)
    assert got == pytest.approx(((zU > 0) != (base.decision_function(U) > 0)).mean())
    # demographic parity and equal opportunity as constraints (value <= 0 iff met)
    dp = demographic_parity("A", "B", 0.8)
    want = 0.8 * pos[~A].mean() - pos[A].mean()
    assert _value(dp.expr, X, y, g, z) == pytest.approx(want)
    eo = equal_opportunity("A", "B", 0.5)
    want = 0.5 * pos[~A & (y > 0)].mean() - pos[A & (y > 0)].mean()
    assert _value(eo.expr, X, y, g, z) == pytest.approx(want)


def test_ramp_bounds_are_tight_at_the_current_point_and_upper_bounds_elsewhere():
    X, y, g = _toy(n=200)
    rng = np.random.default_rng(2)
    data = _Data(X, y, g, None, 1.0)
    for expr in (error_rate(), positive_rate(group="A") - 0.3 * negative_rate()):
        comp = _Compiled(expr, data, "t")
        for _ in range(20):
            z0 = 2 * rng.standard_normal(len(y))
            A, c = comp.bound(z0, len(y))
            assert _hinge_terms(A, z0) + c == pytest.approx(comp.value(z0), abs=1e-12)
            z1 = z0 + rng.standard_normal(len(y)) * rng.uniform(0.01, 3)
            assert _hinge_terms(A, z1) + c >= comp.value(z1) - 1e-12


def test_negative_coefficients_are_normalised_to_positive_terms():
    X, y, g = _toy(n=100)
    data = _Data(X, y, g, None, 1.0)
    comp = _Compiled(
        positive_rate(group="B") * 0.8 - positive_rate(group="A"), data, "t"
    )
    assert all(w > 0 for _, _, w in comp.terms) and comp.const == -1.0
    z = np.random.default_rng(0).standard_normal(100)
    assert comp.value(z) == pytest.approx(
        0.8 * ramp(z[g == "B"]).mean() - ramp(z[g == "A"]).mean()
    )


def test_mm_objective_never_increases_from_a_feasible_start():
    X, y, g = _toy()
    clf = RateConstrainedClassifier(
        constraints=[positive_rate(group="A") >= 0.4 * positive_rate(group="B")],
        mm_iterations=6,
        inner_tol=1e-6,
    ).fit(X, y, groups=g)
    assert clf.coef_[0, 0] > 0.2  # a non-trivial solution (0.7 leaves near-constants)
    f = [h["objective"] for h in clf.history_]
    assert all(b <= a + 1e-4 for a, b in zip(f, f[1:])), f
    assert f[-1] < f[0]
    assert clf.history_[-1]["constraints"][0] <= 1e-3


def test_two_constraints_by_cutting_planes():
    X, y, g = _toy()
    cons = [
        positive_rate(group="A") >= 0.7 * positive_rate(group="B"),
        coverage() <= 0.4,
    ]
    clf = RateConstrainedClassifier(constraints=cons, mm_iterations=4).fit(
        X, y, groups=g
    )
    assert max(clf.history_[-1]["constraints"]) <= 1e-3
    assert len(clf.multipliers_) == 2 and (clf.multipliers_ >= 0).all()


def test_demographic_parity_ratio_08_met_on_adult_training_data(shared_data):
    """Shared data, like every other test that needs it: missing data fails loudly."""
    from bigrate.datasets import load_adult

    X, y, sex = load_adult(shared_data)["train"]
    idx = np.random.default_rng(0).permutation(len(y))[:1500]
    X, y, sex = X[idx], y[idx], sex[idx]
    c = positive_rate(group="Female") >= 0.8 * positive_rate(group="Male")
    clf = RateConstrainedClassifier(constraints=[c], mm_iterations=3).fit(
        X, y, groups=sex
    )
    # met by the randomised rule (ramp rates) and by the deterministic one
    assert clf.evaluate(c, X, y, groups=sex, deterministic=False) <= 1e-3
    p = clf.predict(X) == 1
    assert p[sex == "Female"].mean() >= 0.8 * p[sex == "Male"].mean() - 0.01
    plain = RateConstrainedClassifier(mm_iterations=3).fit(X, y)
    q = plain.predict(X) == 1
    assert q[sex == "Female"].mean() < 0.8 * q[sex == "Male"].mean()  # it binds


def test_churn_constraint_against_a_given_model_is_met():
    X, y, g = _toy(n=400, seed=3)
    rng = np.random.default_rng(4)
    U = rng.standard_normal((300, 3))
    deployed = LinearSVC().fit(X[:100] + 0.5, y[:100])  # a shifted old model
    c = churn(baseline=deployed, dataset="traffic") <= 0.05
    clf = RateConstrainedClassifier(constraints=[c], mm_iterations=5).fit(
        X, y, datasets={"traffic": U}
    )
    assert clf.evaluate(c, X, y, datasets={"traffic": U}, deterministic=False) <= 1e-3
    free = RateConstrainedClassifier(mm_iterations=5).fit(X, y)
    assert free.evaluate(c, X, y, datasets={"traffic": U}) > 0.0


def test_recall_and_churn_from_the_deployed_model_as_start():
    """Sec. 4.2 in small: errors on D1 + false positives on D2, recall on D2 at least
    the deployed model's, churn on unlabeled D3 at most 3%; MM starts from the
    deployed model (nearly feasible for both: its ramp recall is a little below its
    0/1 recall), and the answer beats it on the objective."""
    from types import SimpleNamespace

    from bigrate.constrained import count_false_positives, recall

    X, y, _ = _toy(n=900, seed=5)
    deployed = LinearSVC(C=0.01).fit(X[:100] + 0.3, y[:100])
    X1, y1, X2, y2, X3 = X[100:400], y[100:400], X[400:650], y[400:650], X[650:]
    r0 = (deployed.predict(X2)[y2 == 1] == 1).mean()
    objective = (300 * error_rate() + count_false_positives(dataset="D2")) * (1 / 550)
    cons = [recall(dataset="D2") >= r0, churn(baseline=deployed, dataset="D3") <= 0.03]
    start = SimpleNamespace(
        coef_=4 * deployed.coef_, intercept_=4 * deployed.intercept_
    )
    data = {"D2": {"X": X2, "y": y2}, "D3": X3}
    clf = RateConstrainedClassifier(
        objective=objective, constraints=cons, mm_iterations=5, init=start
    ).fit(X1, y1, datasets=data)
    h = clf.history_
    assert max(h[0]["constraints"]) <= 0.01  # the start is (nearly) feasible
    assert max(h[-1]["constraints"]) <= 1e-3
    assert h[-1]["objective"] < h[0]["objective"] - 0.01
    # deterministic rates on the training data: recall kept, churn within target
    assert (clf.predict(X2)[y2 == 1] == 1).mean() >= r0 - 0.02
    assert (clf.predict(X3) != deployed.predict(X3)).mean() <= 0.04


def test_infeasible_specification_is_reported_with_the_smallest_violation():
    X, y, g = _toy(n=150)
    e = np.zeros(150, bool)
    e[:40] = True
    with pytest.warns(BigrateWarning, match="violated by"):
        clf = RateConstrainedClassifier(
            constraints=[egregious(mask=e), coverage() <= 0.0],
            mm_iterations=2,
            max_multiplier=100.0,
        ).fit(X, y)
    assert max(clf.constraint_values_) > 0


def test_predictions_and_randomised_rule():
    X, y, g = _toy()
    clf = RateConstrainedClassifier(mm_iterations=3).fit(X, y)
    np.testing.assert_array_equal(
        clf.predict(X), clf.classes_[(clf.decision_function(X) >= 0).astype(int)]
    )
    r = clf.set_params(randomized=True, random_state=0)
    assert np.isin(r.predict(X), clf.classes_).all()
    np.testing.assert_allclose(clf.predict_proba(X).sum(1), 1.0)


def test_bad_input_is_caught_before_training():
    X, y, g = _toy(n=60)
    with pytest.raises(ValueError, match="absent"):
        RateConstrainedClassifier(constraints=[positive_rate(group="C") >= 0.1]).fit(
            X, y, groups=g
        )
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        _ = positive_rate(group="A") >= 1.5
    with pytest.raises(ValueError, match="churn needs baseline"):
        churn(baseline=None)
    with pytest.raises(ValueError, match="empty"):
        RateConstrainedClassifier(constraints=[positive_rate(dataset="u") <= 0.5]).fit(
            X, y, datasets={"u": np.zeros((0, 3))}
        )
    with pytest.raises(ValueError, match="not given to fit"):
        RateConstrainedClassifier(
            constraints=[positive_rate(dataset="nope") <= 0.5]
        ).fit(X, y)
    with pytest.raises(ValueError, match="unlabeled"):
        RateConstrainedClassifier(constraints=[recall(dataset="u") >= 0.5]).fit(
            X, y, datasets={"u": X}
        )
    with pytest.raises(ValueError, match="alpha"):
        RateConstrainedClassifier(alpha=0).fit(X, y)
    with pytest.raises(TypeError, match="constraints\\[0\\]"):
        RateConstrainedClassifier(constraints=[positive_rate()]).fit(X, y)


def test_plot(tmp_path):
    from bigrate.constrained import plot_target_vs_achieved

    recs = [{"target": t, "train": t + 0.01, "test": t - 0.02} for t in (0.5, 0.8)]
    out = plot_target_vs_achieved(recs, tmp_path / "p.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_no_warning_when_constraints_are_met():
    X, y, g = _toy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", BigrateWarning)
        RateConstrainedClassifier(
            constraints=[coverage() <= 0.45], mm_iterations=3
        ).fit(X, y)


# ----------------------------------------------------------- streamed from shards
def _shards(path, X, y, g, row_group_size=64):
    import scipy.sparse as sp

    from bigrate.data.format import RowBlock
    from bigrate.data.reader import ShardedDataset
    from bigrate.data.writer import DatasetWriter

    with DatasetWriter(
        path, splits=("train",), row_group_size=row_group_size,
        rows_per_file=2 * row_group_size, has_group=True,
    ) as w:  # fmt: skip
        w.append("train", RowBlock(
            X=sp.csr_matrix(X.astype(np.float32)), y=y.astype(np.int8),
            row_id=np.arange(len(y)), group=g.astype(object),
        ))  # fmt: skip
        w.commit(n_features=X.shape[1], label_mapping={}, preprocessing={}, sources=[])
    return ShardedDataset(path)


def test_streamed_shards_solve_the_same_problem_as_in_memory(tmp_path, monkeypatch):
    """Block-wise passes over shards (many small blocks) reach the same MM iterates as
    the in-memory solver on the same rows (positives, then negatives)."""
    from bigrate.data.format import RowBlock

    X, y, g = _toy(n=400)
    ds = _shards(tmp_path / "ds", X, y, g)
    rows = RowBlock.concat(
        [ds.to_csr(classes=c, order="file", with_group=True) for c in ("pos", "neg")]
    )
    # kappa 0.4: on this toy a higher target leaves only near-constant classifiers
    cons = [positive_rate(group="A") >= 0.4 * positive_rate(group="B")]
    kw = dict(constraints=cons, mm_iterations=4, inner_tol=1e-4)
    mem = RateConstrainedClassifier(**kw).fit(
        rows.X.toarray().astype(np.float64), rows.y, groups=rows.group
    )
    assert mem.coef_[0, 0] > 0.2  # not a trivial solution
    streamed = RateConstrainedClassifier(batch_rows=50, **kw).fit(ds)
    a, b = mem.history_[-1], streamed.history_[-1]
    assert b["objective"] == pytest.approx(a["objective"], abs=5e-3)
    assert b["constraints"][0] <= 1e-3
    # reading the shards on every pass (no cache) is the same computation; the
    # solves are capped at a few passes (uncapped, they read 8 tiny files ~30,000
    # times, a minute of file opening)
    from bigrate.constrained import classifier

    one = dict(kw, mm_iterations=1, inner_tol=1e-2)
    with monkeypatch.context() as m:
        m.setattr(classifier._InnerSolver, "MAX_PASSES", 25)
        kept = RateConstrainedClassifier(batch_rows=50, **one).fit(ds)
        reread = RateConstrainedClassifier(batch_rows=50, cache_mb=0, **one).fit(ds)
    np.testing.assert_array_equal(kept.coef_, reread.coef_)
    # in memory, the block-wise solver solves the same problems (its inexact solves
    # stop elsewhere, so the MM iterates agree to the tolerances, not exactly)
    blocks = RateConstrainedClassifier(solver="blocks", **kw).fit(
        rows.X.toarray().astype(np.float64), rows.y, groups=rows.group
    )
    c = blocks.history_[-1]
    assert c["objective"] == pytest.approx(a["objective"], abs=5e-3)
    assert c["constraints"][0] <= 1e-3
    # evaluation streams too
    value = streamed.evaluate(cons[0], ds, split="train")
    z = streamed.decision_function(rows.X) > 0
    assert value == pytest.approx(
        0.4 * z[rows.group == "B"].mean() - z[rows.group == "A"].mean()
    )


def test_churn_on_an_unlabeled_sharded_dataset(tmp_path):
    X, y, g = _toy(n=500, seed=3)
    Xu, _, gu = _toy(n=300, seed=4)
    base = LinearSVC(C=0.01).fit(X[:100], y[:100])
    unl = _shards(tmp_path / "unl", Xu, np.where(Xu[:, 0] > 0, 1, -1), gu)
    c = churn(baseline=base, dataset="unl") <= 0.05
    clf = RateConstrainedClassifier(constraints=[c], batch_rows=64).fit(
        X, y, datasets={"unl": unl}
    )
    changed = (clf.predict(Xu) != base.predict(Xu)).mean()
    assert clf.history_[-1]["constraints"][0] <= 1e-3 and changed <= 0.07


def test_shard_input_errors(tmp_path):
    X, y, g = _toy(n=200)
    ds = _shards(tmp_path / "ds", X, y, g)
    c = [positive_rate(group="A") >= 0.7 * positive_rate(group="B")]
    with pytest.raises(ValueError, match="y and groups must be None"):
        RateConstrainedClassifier(constraints=c).fit(ds, y)
    with pytest.raises(ValueError, match='solver="dcd" keeps every dataset'):
        RateConstrainedClassifier(constraints=c, solver="dcd").fit(ds)
    with pytest.raises(ValueError, match="split 'test' is not in this dataset"):
        RateConstrainedClassifier(constraints=c, split="test").fit(ds)
    with pytest.raises(ValueError, match="groups comes from the shards"):
        RateConstrainedClassifier(constraints=c).fit(
            X, y, groups=g, datasets={"u": {"X": ds, "groups": g}}
        )
