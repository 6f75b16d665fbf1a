"""One-parameter solution paths of the cost-sensitive SVM crossed with a grid: the
comparison Gu et al. (2015, Table 1) make for BPSP.

At a fixed lambda = 1 / (C+ + C-), the 2C-SVM's scaled dual (see
:mod:`bigrate.model_selection.bpsp`) is piecewise affine in eta = C+ / (C+ + C-): the
line lambda = const crosses the critical regions in intervals. :func:`line_path`
follows that line from eta = 0 to 1, one interval per partition, moving the row whose
inequality ends an interval (Theorem 3 on a line; a direct SMO solve where the move
does not hold). On each interval a validation row's decision value is affine in eta,
so the K-fold CV error is exact along the line; :func:`eta_path_cv` takes the lambdas
from a grid (coarse, then fine around the best), as a one-parameter path method would.
BPSP is exact in both parameters; this is exact in one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigrate.model_selection.bpsp.partition import _MOVE, Affine, Partitioner

PROBE = 1e-7  # how far past a breakpoint a failed move is repaired by a solve


@dataclass
class Piece:
    """The solution on lo <= eta <= hi at the path's lambda."""

    lo: float
    hi: float
    state: np.ndarray
    affine: Affine


def _interval(ineq, lam, tol):
    """The eta interval of a critical region on the line lambda = lam, and the rows
    whose upper bound ends it: a1 lam + a2 eta <= c + tol."""
    a2 = ineq[:, 1]
    rhs = ineq[:, 2] + tol - ineq[:, 0] * lam
    flat = np.abs(a2) <= 1e-13 * np.maximum(1.0, np.abs(rhs))
    if (rhs[flat] < 0).any():  # a constraint not involving eta that fails here
        return np.inf, -np.inf, np.zeros(0, int)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = rhs / a2
    up, down = (a2 > 0) & ~flat, (a2 < 0) & ~flat
    hi = bound[up].min() if up.any() else np.inf
    lo = bound[down].max() if down.any() else -np.inf
    ends = np.flatnonzero(up & (bound <= hi + 1e-12 * max(1.0, abs(hi))))
    return lo, hi, ends


def line_path(part: Partitioner, lam: float, max_pieces: int = 100_000) -> list[Piece]:
    """The exact solution path over eta in [0, 1] at lambda = ``lam`` for the
    training set of ``part`` (a Partitioner of the "lambda_eta" space; any lam > 0,
    i.e. C+ + C- = 1 / lam). Degenerate steps are counted in ``part.diag``."""
    if part.space.name != "lambda_eta":
        raise ValueError("line_path follows eta at fixed lambda: the Partitioner "
                         f"must use space='lambda_eta', not {part.space.name!r}")  # fmt: skip
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam!r}")
    pieces: list[Piece] = []
    eta, state = 0.0, None
    while eta < 1.0:
        ok = False
        if state is not None:  # the neighbour across the last breakpoint
            aff, ineq = part._system(state)
            lo, hi, ends = _interval(ineq, lam, part.tol)
            ok = lo <= eta + PROBE and hi > eta
        if not ok:  # repair just past the breakpoint: corrections, then a solve
            p = min(eta + PROBE, 1.0)
            for attempt in range(2):
                if state is None or attempt == 1:
                    a, bp = part.solve_at(lam, p)
                    part.diag.direct_solves += 1
                    state = part.state_from(a, bp, lam, p)
                state, _ = part.correct(state, lam, p)
                aff, ineq = part._system(state)
                lo, hi, ends = _interval(ineq, lam, part.tol)
                if lo <= p and hi > eta:
                    break
            else:  # nothing holds here: step over PROBE, counted
                part.diag.unresolved_pieces += 1
                part.diag.unresolved_area += p - eta
                hi, ends = p, np.zeros(0, int)
        if aff.singular:
            part.diag.singular_systems += 1
        hi = max(min(hi, 1.0), eta)
        pieces.append(Piece(eta, hi, state, aff))
        if len(pieces) > max_pieces:
            raise RuntimeError(
                f"line_path stopped at max_pieces={max_pieces} pieces at lambda={lam} "
                f"(eta reached {eta:.6g}); raise max_pieces"
            )
        if hi <= eta:  # no progress at this point: force a step
            hi = min(eta + PROBE, 1.0)
        eta = hi
        state = state.copy()
        for k in ends:  # Theorem 3: the rows whose inequality ends the interval move
            state[int(ineq[k, 3])] = _MOVE[int(ineq[k, 4])]
    part.diag.regions += len(pieces)
    return pieces


def validation_steps(pieces, lam, Kv, y_train, y_val, cost_fn, cost_fp=1.0):
    """The cost-weighted validation error along a path as a step function: edges
    (k + 1,) over [0, 1] and values (k,). On a piece, a validation row's decision
    value (sum_j a_j y_j K(x_j, x) + b') / lambda is affine in eta: its sign changes at
    one eta at most."""
    wrong_cost = np.where(y_val > 0, cost_fn, cost_fp)
    edges, values = [0.0], []
    for pc in pieces:
        if pc.hi <= pc.lo:
            continue
        H = Kv @ (pc.affine.alpha * y_train[:, None]) + pc.affine.bprime
        c0, c1 = H[:, 0] + H[:, 1] * lam, H[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            cross = -c0 / c1
        cross = np.unique(cross[(cross > pc.lo) & (cross < pc.hi)])
        e = np.concatenate([[pc.lo], cross, [pc.hi]])
        mid = (e[:-1] + e[1:]) / 2
        pred = np.where(c0[:, None] + c1[:, None] * mid > 0, 1.0, -1.0)
        values.extend(wrong_cost @ (pred != y_val[:, None]))
        edges.extend(e[1:])
    return np.array(edges), np.array(values, float)


def _sum_steps(steps):
    """Sum of step functions [(edges, values)] over [0, 1]."""
    edges = np.unique(np.concatenate([e for e, _ in steps]))
    mid = (edges[:-1] + edges[1:]) / 2
    total = np.zeros(len(mid))
    for e, v in steps:
        total += v[np.clip(np.searchsorted(e, mid, side="right") - 1, 0, len(v) - 1)]
    return edges, total


def eta_path_cv(X, y, cv, *, gamma, cost_fn, cost_fp=1.0, kernel="rbf", coef0=0.0,
                degree=3, c_sum=(0.02, 100.0), coarse=20, fine=20):  # fmt: skip
    """K-fold CV of the cost-sensitive SVM by exact paths in eta at a grid of
    lambda = 1 / (C+ + C-): ``coarse`` values of C+ + C- log-spaced over ``c_sum``,
    then ``fine`` values within one coarse step of the best. ``cv``: (train, test)
    index pairs; labels in {-1, +1}. Returns the best pair (the middle of the longest
    best interval), its CV error (cost-weighted errors per CV row, as BPSPSearchCV's
    cv_error_), the number of paths and of path pieces."""
    from bigrate.kernel.smo import cross_kernel

    X, y = np.asarray(X, float), np.asarray(y, float)
    if not (set(np.unique(y)) <= {-1.0, 1.0}):
        raise ValueError("y must hold labels -1 and +1")
    if not (0 < c_sum[0] < c_sum[1]):
        raise ValueError(f"c_sum must be (low, high) with 0 < low < high, got {c_sum}")
    folds = []
    for tr, te in cv:
        part = Partitioner(X[tr], y[tr], kernel=kernel, gamma=gamma, coef0=coef0,
                           degree=degree, lambda_min=1.0 / c_sum[1])  # fmt: skip
        Kv = cross_kernel(X[te], X[tr], kernel, gamma, coef0, degree)
        folds.append((part, Kv, y[tr], y[te]))
    n_val = sum(len(f[3]) for f in folds)

    def at(log_s):
        lam = 2.0**-log_s
        steps = []
        for part, Kv, ytr, yval in folds:
            steps.append(validation_steps(line_path(part, lam), lam, Kv, ytr, yval,
                                          cost_fn, cost_fp))  # fmt: skip
        return _sum_steps(steps)

    best = (np.inf, None, None, None)  # error, log2(C+ + C-), eta, interval length
    grid = np.linspace(np.log2(c_sum[0]), np.log2(c_sum[1]), coarse)
    step = grid[1] - grid[0] if coarse > 1 else 1.0
    paths = 0
    for stage in (grid, None):
        if stage is None:
            lo = max(best[1] - step, grid[0])
            hi = min(best[1] + step, grid[-1])
            stage = np.linspace(lo, hi, fine)
        for s in stage:
            edges, total = at(s)
            paths += 1
            width = np.diff(edges)
            k = int(np.lexsort((-width, total))[0])  # least error, then widest
            cand = (total[k], s, (edges[k] + edges[k + 1]) / 2, width[k])
            if (cand[0], -cand[3]) < (best[0], -(best[3] or 0.0)):
                best = cand
    lam, eta = 2.0 ** -best[1], best[2]
    diag = [f[0].diag.as_dict() for f in folds]
    return {
        "cv_error": float(best[0] / n_val),
        "lambda": float(lam), "eta": float(eta),
        "C_pos": float(eta / lam), "C_neg": float((1 - eta) / lam),
        "paths": paths, "pieces": sum(d["regions"] for d in diag),
        "direct_solves": sum(d["direct_solves"] for d in diag),
        "unresolved_length": sum(d["unresolved_area"] for d in diag),
    }  # fmt: skip
