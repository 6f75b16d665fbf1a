"""One-parameter paths in eta crossed with a lambda grid (the comparison of Gu et al.
Table 1): pieces against direct SMO solves, exact validation errors along the line,
the CV error of the returned pair against direct fits and against BPSP's exact map."""

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from bigrate import BPSPSearchCV
from bigrate.kernel.smo import cross_kernel
from bigrate.model_selection.bpsp import Partitioner
from bigrate.model_selection.bpsp.eta_path import (
    eta_path_cv,
    line_path,
    validation_steps,
)
from tests.model_selection.test_bpsp import _data, direct_cv_error


@pytest.mark.parametrize("lam", [0.05, 0.3, 1.0, 4.0])
def test_path_pieces_cover_the_line_and_match_direct_solves(lam):
    X, y = _data(30)
    Xv, yv = _data(20, seed=1)
    p = Partitioner(X, y, gamma=0.5)
    pieces = line_path(p, lam)
    assert len(pieces) > 3 and p.diag.unresolved_area == 0.0
    assert pieces[0].lo == 0.0 and pieces[-1].hi == 1.0
    assert all(a.hi == b.lo for a, b in zip(pieces, pieces[1:]))  # contiguous
    # followed by one-row moves, not re-solved at every breakpoint
    assert p.diag.direct_solves <= 3
    Kv = cross_kernel(Xv, X, "rbf", 0.5, 0.0, 3)
    edges, values = validation_steps(pieces, lam, Kv, y, yv, 3.0, 1.0)
    assert edges[0] == 0.0 and edges[-1] == 1.0 and len(values) == len(edges) - 1
    rng = np.random.default_rng(int(lam * 100))
    p.solve_tol = 1e-9
    for pc in [pieces[i] for i in rng.choice(len(pieces), 12, replace=False)]:
        eta = rng.uniform(pc.lo, pc.hi)
        x = np.array([1.0, lam, eta])
        a, bprime = pc.affine.alpha @ x, pc.affine.bprime @ x
        a_direct, b_direct = p.solve_at(lam, eta)
        assert np.abs(a - a_direct).max() <= 1e-5 * max(eta, 1 - eta)
        # the step function's validation error at eta is the direct solution's
        f_direct = Kv @ (a_direct * y) + b_direct
        unclear = np.abs(f_direct) <= 1e-6
        f = Kv @ (a * y) + bprime
        assert (np.sign(f[~unclear]) == np.sign(f_direct[~unclear])).all()
        wrong = np.where(f_direct > 0, 1.0, -1.0) != yv
        direct = (np.where(yv > 0, 3.0, 1.0) * wrong).sum()
        got = values[np.searchsorted(edges, eta, side="right") - 1]
        assert abs(got - direct) <= 3.0 * unclear.sum()


def test_cv_error_equals_direct_fits_and_is_never_below_bpsp():
    X, y = _data(45, seed=3)
    folds = list(StratifiedKFold(3, shuffle=True, random_state=1).split(X, y))
    r = eta_path_cv(X, y, folds, gamma=0.5, cost_fn=2.0, c_sum=(0.5, 20.0),
                    coarse=6, fine=4)  # fmt: skip
    assert r["paths"] == 10 and r["pieces"] > 10 * 3 * 3
    assert r["C_pos"] + r["C_neg"] == pytest.approx(1 / r["lambda"])
    direct = direct_cv_error(X, y, folds, r["C_pos"], r["C_neg"], 2.0)
    assert r["cv_error"] == pytest.approx(direct)
    # BPSP is exact over every C+ + C- <= 20, which holds each path's line
    s = BPSPSearchCV(gamma=[0.5], cv=folds, cost_fn=2.0, engine="local",
                     lambda_min=0.05, progress=False).fit(X, y)  # fmt: skip
    assert s.cv_error_ <= r["cv_error"] + 1e-12


def test_bad_input_is_refused():
    X, y = _data(20)
    with pytest.raises(ValueError, match="space='lambda_eta'"):
        line_path(Partitioner(X, y, space="c_pos_c_neg"), 0.5)
    with pytest.raises(ValueError, match="lam must be > 0"):
        line_path(Partitioner(X, y), 0.0)
    folds = list(StratifiedKFold(2).split(X, y))
    with pytest.raises(ValueError, match="c_sum"):
        eta_path_cv(X, y, folds, gamma=0.5, cost_fn=2.0, c_sum=(5.0, 1.0))
    with pytest.raises(ValueError, match="labels -1 and \\+1"):
        eta_path_cv(X, (y > 0).astype(float), folds, gamma=0.5, cost_fn=2.0)
