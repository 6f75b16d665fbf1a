"""NeymanPearsonSVC(calibrate=...): the model is the NP-SVM of the rows not held out,
with only its threshold moved to the held-out negatives' quantile or umbrella order."""

import numpy as np
import pytest

from bigrate import NeymanPearsonSVC, load_model
from bigrate.metrics import calibrated_pfa, np_quantile_threshold, np_umbrella_order


def _data(n=240, seed=0):
    rng = np.random.default_rng(seed)
    X = np.r_[rng.normal(0.8, 1, (n // 2, 3)), rng.normal(-0.8, 1, (n // 2, 3))]
    y = np.r_[np.ones(n // 2), -np.ones(n // 2)]
    return X, y


def test_quantile_threshold_counts_exactly():
    rng = np.random.default_rng(3)
    for m in (1, 7, 19, 20, 40, 101):
        s = rng.standard_normal(m)
        for rho in (0.01, 0.05, 0.1, 0.5):
            t = np_quantile_threshold(s, rho, expected=False)
            k = int(np.floor(rho * m + 1e-9))
            assert (s > t).sum() == k  # no ties: exactly floor(rho m) above
            assert (s >= t).sum() == min(k + 1, m)  # and the next one is at t
            # expected=True: the most false alarms k with (k + 1) / (m + 1) <= rho
            k = int(np.floor(rho * (m + 1) + 1e-9)) - 1
            if k < 0:
                with pytest.raises(ValueError, match="needs at least"):
                    np_quantile_threshold(s, rho)
                continue
            t = np_quantile_threshold(s, rho)
            assert (s > t).sum() == k and (k + 1) / (m + 1) <= rho < (k + 2) / (m + 1)
    with pytest.raises(ValueError, match="no held-out"):
        np_quantile_threshold([], 0.1)


def test_expected_quantile_rule_keeps_mean_new_data_pfa_at_rho():
    """Over many draws of 20 held-out negatives, the new-data Pfa (here exact: the
    scores are uniform) averages <= rho with expected=True, and overshoots to about
    rho + (1 - rho) / 21 with the plain quantile."""
    rng = np.random.default_rng(0)
    for rho in (0.05, 0.1, 0.2):
        draws = rng.random((4000, 20))
        mean = {}
        for exp in (True, False):
            t = np.array([np_quantile_threshold(d, rho, expected=exp) for d in draws])
            mean[exp] = float(np.mean(1.0 - t))  # P(U > t) for new uniform scores
        assert mean[True] <= rho + 0.005
        assert mean[False] == pytest.approx(rho + (1 - rho) / 21, abs=0.006)


@pytest.mark.parametrize("how", ["quantile", "umbrella"])
def test_calibrated_model_is_the_np_svm_of_the_rest_with_a_moved_threshold(
    how, tmp_path
):
    X, y = _data()
    kw = dict(rho=0.1, gamma=0.5, random_state=0)
    cal = NeymanPearsonSVC(calibrate=how, calibration_fraction=0.5, **kw).fit(X, y)
    held = cal.calibration_rows_
    assert (y[held] < 0).all() and len(held) == cal.n_calibration_ == 60
    rest = np.setdiff1d(np.arange(len(y)), held)
    # trained for the mean false-alarm rate of the threshold 60 held-out negatives give
    assert cal.training_rho_ == calibrated_pfa(60, 0.1, 0.05, how) < 0.1
    kw["rho"] = cal.training_rho_
    plain = NeymanPearsonSVC(calibrate=None, **kw).fit(X[rest], y[rest])
    np.testing.assert_allclose(cal.dual_coef_, plain.dual_coef_)
    np.testing.assert_array_equal(cal.support_, rest[plain.support_])
    assert cal.intercept_[0] == pytest.approx(
        plain.intercept_[0] + cal.threshold_shift_
    )
    f = cal.decision_function(X[held])
    m = len(held)
    if how == "quantile":
        assert (f >= 0).sum() == int(np.floor(0.1 * (m + 1))) - 1
    else:  # positive above the k-th smallest held-out score
        assert (f >= 0).sum() == m - np_umbrella_order(m, 0.1, 0.05)
    back = load_model(cal.save(tmp_path / "m"))
    np.testing.assert_array_equal(back.decision_function(X), cal.decision_function(X))
    np.testing.assert_array_equal(back.calibration_rows_, held)


def test_umbrella_needs_enough_held_out_negatives():
    X, y = _data(n=80)
    with pytest.raises(ValueError, match="at least 59 held-out negatives"):
        NeymanPearsonSVC(rho=0.05, calibrate="umbrella", random_state=0).fit(X, y)


def test_umbrella_keeps_new_data_pfa_under_rho_most_of_the_time():
    """Over independent draws, the test Pfa exceeds rho in about delta of them or
    fewer (nproc's guarantee), where the uncalibrated fit exceeds it far more often."""
    rng = np.random.default_rng(11)
    Xt = np.r_[rng.normal(0.8, 1, (4000, 3)), rng.normal(-0.8, 1, (4000, 3))]
    yt = np.r_[np.ones(4000), -np.ones(4000)]
    over = {"umbrella": 0, None: 0}
    for seed in range(12):
        X, y = _data(n=400, seed=100 + seed)
        for how in over:
            c = NeymanPearsonSVC(rho=0.2, gamma=0.5, calibrate=how, calibration_fraction=0.5,
                                 random_state=seed).fit(X, y)  # fmt: skip
            over[how] += np.mean(c.decision_function(Xt)[yt < 0] >= 0) > 0.2
    assert over["umbrella"] <= 2 and over[None] >= 4, over
