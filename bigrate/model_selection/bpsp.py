"""Bi-parameter space partition (BPSP) of the cost-sensitive SVM (Gu et al. 2015),
restated in ``../shared/docs/algorithms.md`` sec. 5.

The 2C-SVM with costs (C+, C-) is written with lambda = 1 / (C+ + C-) and eta =
C+ / (C+ + C-): the dual is min 1/(2 lambda) a^T Q a - sum(a), y^T a = 0,
0 <= a_i <= box_i(eta) = (1 - y_i + 2 y_i eta) / 2 (eta for a positive, 1 - eta for a
negative), with Q_ij = y_i y_j K(x_i, x_j). Scaled gradients g~_i = sum_j Q_ij a_j +
y_i b' (b' = lambda b) sort the rows into a partition pi = (M, E, R): g~ = lambda on M,
g~ <= lambda on E (a = box), g~ >= lambda on R (a = 0).

For a fixed partition, a_M and b' solve the bordered system

    [0    y_M^T ] [b' ]   [ -y_E^T a_E(eta)        ]
    [y_M  Q_MM  ] [a_M] = [ lambda 1 - Q_ME a_E(eta)],   a_E(eta) = (1 - y_E)/2 + y_E eta,

whose right side is affine in (lambda, eta): so are a, b' and every g~ (eq. 9-11).
The set of (lambda, eta) keeping pi, its critical region (eq. 12-14), is a convex
polygon: the rectangle cut by 0 <= a_M <= box(eta), g~_E <= lambda and g~_R >= lambda.

Algorithm 1 with Theorem 2: the region R0 = CR(pi) n X of a convex piece X is recorded;
the rest of X is split, one facet i of R0 at a time, into the convex pieces
X n {facet i violated} n {facets j < i held}; each piece touches R0 along facet i, and
by Theorem 3 the partition across that facet differs from pi by the one row the facet
belongs to. A piece whose guessed partition does not hold there (degenerate crossings:
several rows change at once) is seeded by a direct solve (our SMO) at one of its
points, the partition then corrected by an active-set loop. The default method
("neighbours") records each critical region once, whole, and walks to the neighbour
across each facet (Theorem 3) breadth-first; a move is first checked at a point just
across the facet, and where the region's solution carried there breaks several rows
(a degenerate crossing) they all move. Gaps are seeded by direct solves and
overlapping regions (non-unique solutions) give the overlap to the earlier one.

The (C+, C-) triangle C+ + C- <= 1 is partitioned the same way in the 2C-SVM's own
dual (boxes C+ / C-, margin level 1), where the solution is affine in (C+, C-): see
:class:`Space`. Polygons are shapely's, overlays on a fixed precision grid.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import shapely
import shapely.geometry
from shapely.geometry import Polygon, box
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import validate_data

R_SET, M_SET, E_SET = 0, 1, 2
GRID = 1e-12  # precision grid of shapely's unions and overlays (parameters are O(1))
REPAIR_GRIDS = (1e-10, 1e-8)  # coarser grids tried when GEOS gives up on GRID


def overlay(op, *geoms, diag=None):
    """``op(*geoms)`` (a shapely set operation) on the precision grid GRID. On thin,
    nearly coincident regions GEOS can still give up ("TopologyException: unable to
    assign free hole to a shell", seen on breast-cancer fold 0); the inputs are then
    repaired (make_valid) and snapped to a coarser grid (a shift of 1e-10 in lambda or
    eta, far below any region's width that matters), and the repair is counted in
    ``diag.geometry_repairs``."""
    try:
        return op(*geoms, grid_size=GRID)
    except shapely.errors.GEOSException as e:
        err = e
    for grid in REPAIR_GRIDS:
        fixed = [shapely.set_precision(shapely.make_valid(g), grid) for g in geoms]
        try:
            out = op(*fixed, grid_size=grid)
        except shapely.errors.GEOSException as e:
            err = e
            continue
        if diag is not None:
            diag.geometry_repairs += 1
        return out
    raise err


@dataclass(frozen=True)
class Space:
    """A parametrisation (p1, p2) of the 2C-SVM in which, for a fixed partition, the
    dual solution is affine: boxes box_i(p) and the margin level r(p) (g~ = r on M)
    as coefficients of (1, p1, p2), the domain searched and the costs at a point.

    "lambda_eta": the scaled dual (a = lambda x the 2C-SVM's), box = (1 - y)/2 + y eta,
    r = lambda, on [lambda_min, 1] x [0, 1] (C+ + C- >= 1). "c_pos_c_neg": the 2C-SVM's
    own dual, box = C+ or C-, r = 1, on the lower triangle C+, C- >= 0, C+ + C- <= 1.
    Both give the decision function's sign as sign(sum_j a_j y_j K(x_j, x) + b')."""

    name: str

    def box_coef(self, y):
        if self.name == "lambda_eta":
            return np.stack([(1 - y) / 2, np.zeros_like(y), y], axis=1)
        return np.stack([np.zeros_like(y), (y > 0) * 1.0, (y < 0) * 1.0], axis=1)

    @property
    def r_coef(self):
        return np.array([0.0, 1.0, 0.0] if self.name == "lambda_eta" else [1.0, 0, 0])

    def domain(self, lambda_min):
        if self.name == "lambda_eta":
            return box(lambda_min, 0.0, 1.0, 1.0)
        return Polygon([(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)])

    def costs(self, p1, p2):
        """(C+, C-) at a point."""
        if self.name == "lambda_eta":
            return p2 / p1, (1.0 - p2) / p1
        return p1, p2

    def scale(self, p1, p2):
        """This space's dual = scale x the 2C-SVM's dual."""
        return p1 if self.name == "lambda_eta" else 1.0


SPACES = {"lambda_eta": Space("lambda_eta"), "c_pos_c_neg": Space("c_pos_c_neg")}


@dataclass
class Affine:
    """a (n x 3), b' (3,) and g~ (n x 3) as coefficients of (1, lambda, eta)."""

    alpha: np.ndarray
    bprime: np.ndarray
    gt: np.ndarray
    singular: bool
    consistent: bool = True


def affine_solution(Q, y, state, space=SPACES["lambda_eta"], box=None) -> Affine:
    """The solution for every parameter pair of ``space`` under the partition
    ``state``; ``box``: the rows' box coefficients (n x 3), by default
    ``space.box_coef(y)`` (a row standing for k identical rows has k times its box)."""
    n = len(y)
    M = np.flatnonzero(state == M_SET)
    E = np.flatnonzero(state == E_SET)
    aE = (space.box_coef(y) if box is None else box)[E]
    alpha = np.zeros((n, 3))
    alpha[E] = aE
    rhs = np.zeros((len(M) + 1, 3))
    rhs[0] = -(y[E] @ aE)
    QM = Q[M]
    rhs[1:] = space.r_coef - QM[:, E] @ aE
    A = np.zeros((len(M) + 1, len(M) + 1))
    A[0, 1:] = y[M]
    A[1:, 0] = y[M]
    A[1:, 1:] = QM[:, M]
    singular, consistent = False, True
    scale = 1e-8 * max(1.0, np.abs(rhs).max())
    try:
        sol = np.linalg.solve(A, rhs)
        if not np.abs(A @ sol - rhs).max() <= scale:
            raise np.linalg.LinAlgError
    except np.linalg.LinAlgError:
        # e.g. duplicate rows in M: the least-norm solution. With no consistent
        # solution for every parameter pair (e.g. M empty: y_E^T a_E(p) = 0 holds on
        # a line only) the partition has no area: its region is empty
        singular = True
        sol = np.linalg.lstsq(A, rhs, rcond=None)[0]
        consistent = bool(np.abs(A @ sol - rhs).max() <= 1e3 * scale)
    bprime = sol[0]
    alpha[M] = sol[1:]
    gt = Q @ alpha + np.outer(y, bprime)
    return Affine(alpha, bprime, gt, singular, consistent)


# the kinds of inequality bounding a critical region, and where its row goes across it
LOWER, UPPER, E_ROW, R_ROW = 0, 1, 2, 3
_MOVE = {LOWER: R_SET, UPPER: E_SET, E_ROW: M_SET, R_ROW: M_SET}


def inequalities(aff: Affine, y, state, space=SPACES["lambda_eta"], box=None):
    """Rows (a_1, a_2, c, row, kind) of the critical region a . (p1, p2) <= c
    (eq. 12-14): 0 <= a_M <= box, g~_E <= r, g~_R >= r (``box`` as for
    :func:`affine_solution`)."""
    al, g, r = aff.alpha, aff.gt, space.r_coef
    M = np.flatnonzero(state == M_SET)
    E = np.flatnonzero(state == E_SET)
    R = np.flatnonzero(state == R_SET)
    bx = (space.box_coef(y) if box is None else box)[M]
    m, e = len(M), len(E)
    out = np.empty((2 * m + e + len(R), 5))
    blocks = (
        (slice(0, m), -al[M], M, LOWER),  # -a <= 0
        (slice(m, 2 * m), al[M] - bx, M, UPPER),  # a - box <= 0
        (slice(2 * m, 2 * m + e), g[E] - r, E, E_ROW),  # g~ - r <= 0
        (slice(2 * m + e, None), r - g[R], R, R_ROW),  # r - g~ <= 0
    )
    for sl, coef, rows, kind in blocks:  # coef . (1, p1, p2) <= 0
        blk = out[sl]
        blk[:, 0], blk[:, 1], blk[:, 2] = coef[:, 1], coef[:, 2], -coef[:, 0]
        blk[:, 3], blk[:, 4] = rows, kind
    if not aff.consistent:  # 0 <= -1: an empty region
        out = np.vstack([out, [0.0, 0.0, -1.0, -1, -1]])
    return out


def halfplanes(abc, bounds):
    """Polygons of the half-planes a x + b y <= c (rows of ``abc``) over the region
    ``bounds``: shapely has no half-plane type, so each is a square with one side on
    the line, large enough to hold the bounds."""
    abc = np.atleast_2d(np.asarray(abc, float))
    out = np.empty(len(abc), dtype=object)
    out[:] = [_halfplane(a, b, c, bounds) for a, b, c in abc.tolist()]
    return out


def _halfplane(a, b, c, bounds):
    """One half-plane of :func:`halfplanes` (scalar arithmetic: a handful are needed
    at a time, where numpy's per-call overhead dominated)."""
    x0, y0, x1, y1 = bounds
    extent = max(x1 - x0, y1 - y0, 1e-12)
    norm = math.hypot(a, b)
    if norm < 1e-300:  # 0 <= c: everything; otherwise nothing
        if c >= 0:
            return box(x0 - extent, y0 - extent, x1 + extent, y1 + extent)
        return Polygon()
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    ux, uy = a / norm, b / norm  # unit normal, towards the violated side
    dist = (a * mx + b * my - c) / norm
    qx, qy = mx - dist * ux, my - dist * uy  # mid projected onto the line
    dx, dy = -uy, ux
    L = 2.0 * extent + abs(dist) + 1.0
    p, q = (qx - L * dx, qy - L * dy), (qx + L * dx, qy + L * dy)
    ring = [p, q, (q[0] - L * ux, q[1] - L * uy), (p[0] - L * ux, p[1] - L * uy), p]
    return shapely.polygons(np.array(ring))


def clip(poly, ineq, tol):
    """poly cut by the inequalities a . x <= c + tol. Returns the cut polygon and the
    inequalities not already met at every vertex of ``poly`` (a convex poly meets
    those everywhere; the others are the candidates for its facets). The cuts are
    made one half-plane at a time, the deepest cut first, each against the current
    polygon's vertices: a region has a handful of edges, so a handful of cuts
    replaces an overlay of every candidate (5-8x less GEOS time)."""
    if poly.is_empty:
        return poly, np.zeros(0, int)
    V = shapely.get_coordinates(poly)[:-1]
    viol = (V @ ineq[:, :2].T - ineq[:, 2]) > tol
    active = np.flatnonzero(viol.any(axis=0))
    if len(active) == 0:
        return poly, active
    abc = ineq[active, :3].copy()
    abc[:, 2] += tol
    norm = np.maximum(np.hypot(abc[:, 0], abc[:, 1]), 1e-300)
    P, bounds = poly, poly.bounds
    # after its cut a line holds only up to rounding: never cut by it twice
    done = np.zeros(len(active), bool)
    for _ in range(len(active)):
        depth = (V @ abc[:, :2].T - abc[:, 2]).max(axis=0) / norm
        depth[done] = -np.inf
        k = int(np.argmax(depth))
        if depth[k] <= 0:
            break
        done[k] = True
        P = _largest(shapely.intersection(P, _halfplane(*abc[k].tolist(), bounds)))
        if P is None:
            return Polygon(), active
        V = shapely.get_coordinates(P)[:-1]
    return P, active


def facets(poly, ineq, candidates, tol, across=None):
    """The candidate inequalities whose line carries an edge of ``poly`` (its
    compact representation within the piece it was cut from). With ``across`` (a
    distance), also a point that far beyond the middle of each such edge."""
    if poly.is_empty or len(candidates) == 0:
        return [] if across is None else ([], np.zeros((0, 2)))
    V = np.array(poly.exterior.coords)
    A = ineq[candidates]
    scale = np.maximum(np.abs(A[:, :2]).max(axis=1), 1e-300)
    slack = 1e3 * tol * np.maximum(1.0, np.abs(A[:, 2])) + tol * scale
    on = np.abs(V @ A[:, :2].T - A[:, 2]) <= slack  # vertices x candidates
    both = on[:-1] & on[1:]  # edges x candidates: two consecutive vertices on it
    edge = both.any(axis=0)
    out = [int(k) for k in np.asarray(candidates)[edge]]
    if across is None:
        return out
    e = both[:, edge].argmax(axis=0)  # an edge on each facet's line
    mid = (V[e] + V[e + 1]) / 2
    normal = A[edge, :2] / np.maximum(np.hypot(A[edge, 0], A[edge, 1]), 1e-300)[:, None]
    # no farther than a thousandth of the edge: small regions have small neighbours
    dist = np.minimum(across, 1e-3 * np.hypot(*(V[e + 1] - V[e]).T))
    return out, mid + dist[:, None] * normal


@dataclass
class Region:
    polygon: Polygon
    state: np.ndarray
    affine: Affine


@dataclass
class Diagnostics:
    regions: int = 0
    direct_solves: int = 0
    corrections: int = 0
    singular_systems: int = 0
    thin_pieces: int = 0
    thin_area: float = 0.0
    overlaps: int = 0
    redundant_regions: int = 0
    degenerate_moves: int = 0
    unresolved_pieces: int = 0
    unresolved_area: float = 0.0
    geometry_repairs: int = 0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Partitioner:
    """The critical-region partition of one parameter space (``space``: the (lambda,
    eta) rectangle [lambda_min, 1] x [0, 1] or the (C+, C-) lower triangle) for one
    training set (rows X, labels y in {-1, +1}, kernel parameters as KernelProblem
    takes them). ``weight``: how many identical training rows each row stands for
    (see :func:`merge_duplicates`); its costs, hence its box, are that many times
    a single row's."""

    def __init__(self, X, y, *, kernel="rbf", gamma=1.0, coef0=0.0, degree=3,
                 lambda_min=1e-3, area_tol=1e-9, tol=1e-9, max_regions=20_000,
                 solve_tol=1e-7, method="neighbours", space="lambda_eta",
                 weight=None):  # fmt: skip
        from bigrate.kernel.smo import KernelProblem, cross_kernel

        self.y = np.asarray(y, float)
        if weight is None:
            weight = np.ones_like(self.y)
        self.weight = np.asarray(weight, float)
        if self.weight.shape != self.y.shape or not (self.weight > 0).all():
            raise ValueError(
                f"weight must hold one positive multiplicity per row ({len(self.y)}), "
                f"got shape {self.weight.shape} with minimum "
                f"{self.weight.min() if self.weight.size else None}"
            )
        self.problem = KernelProblem(X, kernel=kernel, gamma=gamma, coef0=coef0,
                                     degree=degree)  # fmt: skip
        self.K = cross_kernel(X, X, kernel, gamma, coef0, degree)
        self.Q = self.K * np.outer(self.y, self.y)
        self.lambda_min, self.area_tol, self.tol = lambda_min, area_tol, tol
        self.max_regions, self.solve_tol = max_regions, solve_tol
        if method not in ("neighbours", "theorem2"):
            raise ValueError(
                f"method must be 'neighbours' or 'theorem2', got {method!r}"
            )
        self.method = method
        # regions between two refreshes of the covered area (for redundant regions,
        # which only a non-unique solution makes: refreshed only once a singular
        # system has been met, as the union costs O(regions) each time)
        self.redundancy_check = 1000
        # how far across a facet a neighbour's partition is first checked (None:
        # every one-row move is clipped)
        self.probe = 1e-7
        # rounds of gap seeding after which such a move is corrected where it failed
        # (while the gaps are not negligible) instead of dropped; 0: from the start
        self.correct_after = 12
        if space not in SPACES:
            raise ValueError(f"space must be one of {sorted(SPACES)}, got {space!r}")
        self.space = SPACES[space]
        self.box = self.space.box_coef(self.y) * self.weight[:, None]
        self.diag = Diagnostics()
        self._memo: dict = {}  # state -> (affine, inequalities), least recent first

    def _system(self, state):
        """The affine solution and critical-region inequalities of a partition,
        remembered for the last 4,096 partitions (Theorem 2 meets the same critical
        region in several pieces)."""
        key = state.tobytes()
        hit = self._memo.pop(key, None)
        if hit is None:
            aff = affine_solution(self.Q, self.y, state, self.space, self.box)
            hit = (aff, inequalities(aff, self.y, state, self.space, self.box))
            if len(self._memo) >= 4096:
                self._memo.pop(next(iter(self._memo)))
        self._memo[key] = hit
        return hit

    # ------------------------------------------------------------ direct solves
    def solve_at(self, p1, p2):
        """(alpha, b') by our SMO solver at one parameter pair, in this space's
        units."""
        y = self.y
        c_pos, c_neg = self.space.costs(p1, p2)
        C = np.where(y > 0, c_pos, c_neg) * self.weight
        res = self.problem.solve(y, np.ones_like(y), np.zeros_like(y), C, 0.0,
                                 eps=self.solve_tol)  # fmt: skip
        k = self.space.scale(p1, p2)
        return k * res.alpha, k * res.b

    def state_from(self, alpha, bprime, p1, p2):
        x = np.array([1.0, p1, p2])
        box_ = self.box @ x
        level = float(self.space.r_coef @ x)
        gt = self.Q @ alpha + self.y * bprime
        tol = 1e-6 * max(level, 1e-12)
        at = 1e-9 * max(box_.max(), 1e-12)
        state = np.full(len(self.y), M_SET)
        state[(alpha <= at) & (gt > level + tol)] = R_SET
        state[(alpha >= box_ - at) & (gt < level - tol)] = E_SET
        return state

    def correct(self, state, lam, eta, rounds=50):
        """Active-set corrections until the partition's affine solution satisfies its
        own conditions at (lam, eta) (moves every violating row, worst first)."""
        x = np.array([lam, eta])
        for _ in range(rounds):
            aff, ineq = self._system(state)
            v = ineq[:, :2] @ x - ineq[:, 2]
            bad = v > 1e-9
            if not bad.any():
                return state, aff
            k = int(np.argmax(v))
            state = state.copy()
            if ineq[k, 4] < 0:  # no consistent solution (M empty): the row nearest
                # its margin joins M
                xx = np.array([1.0, *x])
                gap = np.abs(aff.gt @ xx - self.space.r_coef @ xx)
                gap[state == M_SET] = np.inf
                state[int(np.argmin(gap))] = M_SET
            else:
                state[int(ineq[k, 3])] = _MOVE[int(ineq[k, 4])]
            self.diag.corrections += 1
        return state, self._system(state)[0]

    # ------------------------------------------------------------ the partition
    def run(self, progress=None) -> list[Region]:
        if self.method == "neighbours":
            return self._run_neighbours(progress)
        return self._run_theorem2(progress)

    def _guard(self, regions, covered, total):
        if len(regions) > self.max_regions:
            raise RuntimeError(
                f"BPSP stopped at max_regions={self.max_regions} regions "
                f"({covered / total:.1%} of the parameter rectangle covered); raise "
                "max_regions or lambda_min (regions crowd near lambda = 0, i.e. "
                "very large C)"
            )

    def _run_neighbours(self, progress=None) -> list[Region]:
        """Each critical region once: breadth-first over partitions, from a direct
        solve, to the neighbour across every facet (Theorem 3), each region being its
        whole polygon in the rectangle. Then what is left uncovered (partitions no
        neighbour step reached) is seeded by direct solves, and where critical regions
        overlap (a non-strictly convex problem: several solutions share parameters)
        the later region gives up the overlap, so the result is a partition."""
        from collections import deque

        rect = self.space.domain(self.lambda_min)
        total = rect.area
        regions: list[Region] = []
        seen: set = set()
        queue: deque = deque()
        seeds = [rect]  # areas to seed by a direct solve
        rng = np.random.default_rng(0)
        covered = 0.0
        union, done = shapely.Polygon(), 0
        inside, next_check = None, self.redundancy_check
        correcting = self.correct_after <= 0
        for _round in range(50):
            for area in seeds:
                queue.append((self._seed(area, seen, rng), None))
            while queue:
                st, probe = queue.popleft()
                key = st.tobytes()
                if key in seen:
                    continue
                aff, ineq = self._system(st)
                # how far the move's partition fails just across its facet
                miss = (
                    -np.inf
                    if probe is None
                    else (ineq[:, :2] @ probe - ineq[:, 2]).max()
                )
                if correcting and miss > 0:
                    # the walk has broken into islands that seeding reconnects only
                    # slowly: find the partition that holds just across the facet
                    st, aff = self.correct(st, *probe, rounds=10)
                    key = st.tobytes()
                    if key in seen:
                        continue
                    aff, ineq = self._system(st)
                    miss = (ineq[:, :2] @ probe - ineq[:, 2]).max()
                if miss > 1e-9:
                    # the move does not hold just across the facet it came through
                    # (a degenerate crossing): its region is empty or lies
                    # elsewhere, where another neighbour or a gap seed finds it. Not
                    # marked seen; no polygon clipped (most such states gave
                    # slivers of ~1e-17 after a full clip)
                    self.diag.degenerate_moves += 1
                    continue
                seen.add(key)
                if aff.singular:
                    self.diag.singular_systems += 1
                P, active = clip(rect, ineq, self.tol)
                if P.is_empty or P.area <= self.area_tol:
                    self.diag.thin_pieces += 1
                    self.diag.thin_area += 0.0 if P.is_empty else P.area
                    continue
                if inside is not None and inside.contains(P):
                    # another description of parameters already covered (tied or
                    # duplicated rows make the solution non-unique): it would give
                    # up all of its area, and its neighbours are more of the same
                    self.diag.redundant_regions += 1
                    continue
                regions.append(Region(P, st, aff))
                covered += P.area
                if progress is not None:
                    progress(min(covered / total, 1.0), len(regions))
                self._guard(regions, covered, total)
                if len(regions) >= next_check and self.diag.singular_systems:
                    inside = self._covered_so_far(regions)
                    next_check = len(regions) + max(
                        self.redundancy_check, len(regions) // 4
                    )
                if self.probe is None:
                    fac = facets(P, ineq, active, self.tol)
                    probes = [None] * len(fac)
                else:
                    fac, probes = facets(P, ineq, active, self.tol, across=self.probe)
                for k, pt in zip(fac, probes, strict=True):
                    nxt = st.copy()
                    rows = [k]
                    if pt is not None:
                        broken = np.flatnonzero(ineq[:, :2] @ pt - ineq[:, 2] > 0)
                        if len(broken) > 1:
                            # this region's solution, carried across, breaks more
                            # rows than the facet's (a degenerate crossing, e.g.
                            # duplicated rows' lines coincide): they all move
                            self.diag.degenerate_moves += 1
                            rows = broken
                    for j in rows:  # Theorem 3
                        nxt[int(ineq[j, 3])] = _MOVE[int(ineq[j, 4])]
                    if nxt.tobytes() not in seen:
                        queue.append((nxt, pt))
            # the running union takes only this round's regions (re-uniting all of
            # them every round was the fit's largest cost on folds with many seeds)
            found = len(regions) - done
            union = overlay(shapely.union_all,
                            [union] + [r.polygon for r in regions[done:]],
                            diag=self.diag)  # fmt: skip
            done = len(regions)
            rest = overlay(shapely.difference, rect, union, diag=self.diag)
            gaps = [g for g in getattr(rest, "geoms", [rest])
                    if g.geom_type == "Polygon" and g.area > self.area_tol]  # fmt: skip
            if not gaps or (_round > 0 and found == 0):
                # covered, or this round's seeds found nothing new (the same gaps
                # would be seeded again, to no end)
                break
            seeds = gaps
            correcting = (
                _round + 1 >= self.correct_after
                and sum(g.area for g in gaps) > 1e-6 * total
            )
        if gaps:
            self.diag.unresolved_pieces += len(gaps)
            self.diag.unresolved_area += sum(g.area for g in gaps)
        # overlaps: keep the earlier region's claim
        if sum(r.polygon.area for r in regions) > union.area + self.area_tol:
            self._give_up_overlaps(regions)
            regions = [r for r in regions if r.polygon.area > self.area_tol]
        self.diag.regions = len(regions)
        return regions

    def _seed(self, area, seen, rng, tries=4):
        """The partition at a point of ``area`` by a direct solve: its representative
        point, or random points of it while that gives a partition already seen (with
        tied or duplicated rows, the one found there can have no area, and the same
        point would give it again every round)."""
        x0, y0, x1, y1 = area.bounds
        pt = area.representative_point()
        for _ in range(tries):
            lam, eta = pt.x, pt.y
            a, bp = self.solve_at(lam, eta)
            self.diag.direct_solves += 1
            st, _ = self.correct(self.state_from(a, bp, lam, eta), lam, eta)
            if st.tobytes() not in seen:
                break
            for _ in range(100):
                pt = shapely.Point(rng.uniform(x0, x1), rng.uniform(y0, y1))
                if area.contains(pt):
                    break
        return st

    def _covered_so_far(self, regions):
        """The union of ``regions``, widened by 1e-9 (vertices are computed region
        by region) and prepared for fast containment tests."""
        union = overlay(shapely.union_all, [r.polygon for r in regions], diag=self.diag)
        inside = shapely.buffer(union, 1e-9)
        shapely.prepare(inside)
        return inside

    def _give_up_overlaps(self, regions):
        """Each region gives up what it shares (more than area_tol) with earlier
        regions; the overlapping pairs are found in one vectorised tree query."""
        polys = np.array([r.polygon for r in regions], dtype=object)
        i, j = shapely.STRtree(polys).query(polys, predicate="intersects")
        keep = j < i
        i, j = i[keep], j[keep]
        shared = shapely.area(shapely.intersection(polys[i], polys[j]))
        hit = shared > self.area_tol
        i, j = i[hit], j[hit]
        for k in np.unique(i):  # increasing: earlier regions are final when used
            taken = overlay(
                shapely.union_all,
                [regions[m].polygon for m in j[i == k]],
                diag=self.diag,
            )
            regions[k].polygon = _polygonal(
                overlay(shapely.difference, regions[k].polygon, taken, diag=self.diag)
            )
            self.diag.overlaps += 1

    def _run_theorem2(self, progress=None) -> list[Region]:
        """Algorithm 1 with Theorem 2's pieces (see the module docstring)."""
        X0 = self.space.domain(self.lambda_min)
        stack = [(X0, None)]
        regions: list[Region] = []
        total = X0.area
        covered = 0.0
        while stack:
            X, state = stack.pop()
            P, state, aff, active, ineq = self._region(X, state)
            if P is None:
                continue
            regions.append(Region(P, state, aff))
            covered += P.area
            if progress is not None:
                progress(covered / total, len(regions))
            self._guard(regions, covered, total)
            st = regions[-1].state
            fac = facets(P, ineq, active, self.tol)
            for i, k in enumerate(fac):
                # X n {facet k violated} n {facets before it held} (Theorem 2)
                abc = np.concatenate([-ineq[[k], :3], ineq[fac[:i], :3]])
                piece = _largest(
                    shapely.intersection_all([X, *halfplanes(abc, X.bounds)])
                )
                if piece is None:
                    continue
                if piece.area <= self.area_tol:
                    self.diag.thin_pieces += 1
                    self.diag.thin_area += piece.area
                    continue
                nxt = st.copy()
                nxt[int(ineq[k, 3])] = _MOVE[int(ineq[k, 4])]  # Theorem 3
                stack.append((piece, nxt))
        self.diag.regions = len(regions)
        return regions

    def _region(self, X, state):
        """CR(state) n X, falling back to a direct solve at a point of X when the
        guessed partition does not hold in X."""
        for attempt in range(2):
            if state is None or attempt == 1:
                lam, eta = X.representative_point().coords[0]
                a, bp = self.solve_at(lam, eta)
                self.diag.direct_solves += 1
                state = self.state_from(a, bp, lam, eta)
                state, _ = self.correct(state, lam, eta)
            aff, ineq = self._system(state)
            if aff.singular:
                self.diag.singular_systems += 1
            P, active = clip(X, ineq, self.tol)
            P = _largest(P)
            if P is not None and P.area > self.area_tol:
                return P, state, aff, active, ineq
        self.diag.unresolved_pieces += 1
        self.diag.unresolved_area += X.area
        return None, None, None, None, None


# ---------------------------------------------------------------- invariant regions
def invariant_cells(region: Region, Kv, y_train, y_val, cost_fn, cost_fp, tol=1e-12):
    """The region split by the sign pattern of the decision function on validation
    rows (eq. 15-18): f(x) = (sum_j a_j y_j K(x_j, x) + b') / lambda, whose numerator
    h is affine in (lambda, eta) on the region, so each validation row's sign flips on
    one line. Returns [(cost-weighted errors, polygon)]: errors = cost_fn * false
    negatives + cost_fp * false positives (predicted positive iff f > 0)."""
    H = Kv @ (region.affine.alpha * y_train[:, None]) + region.affine.bprime
    cells = _parts(region.polygon)  # one convex polygon, or parts left by overlaps
    V = np.concatenate([np.array(c.exterior.coords)[:-1] for c in cells])
    vals = H[:, :1] + V[:, 0] * H[:, 1:2] + V[:, 1] * H[:, 2:3]  # rows x vertices
    scale = np.abs(H).max(axis=1, keepdims=True) + 1e-300
    crossing = np.flatnonzero(
        (vals > tol * scale).any(axis=1) & (vals < -tol * scale).any(axis=1)
    )
    for v in crossing:
        a, b, c = H[v, 1], H[v, 2], -H[v, 0]  # h <= 0  <=>  a lambda + b eta <= c
        nxt = []
        for cell in cells:
            W = np.array(cell.exterior.coords)[:-1]
            h = H[v, 0] + W @ H[v, 1:]
            if (h >= -tol * scale[v, 0]).all() or (h <= tol * scale[v, 0]).all():
                nxt.append(cell)
                continue
            for half in halfplanes([[a, b, c], [-a, -b, -c]], cell.bounds):
                nxt += _parts(cell.intersection(half))
        cells = nxt
    out = []
    wrong_cost = np.where(y_val > 0, cost_fn, cost_fp)
    for cell in cells:
        lam, eta = cell.representative_point().coords[0]
        pred = np.where(H[:, 0] + H[:, 1] * lam + H[:, 2] * eta > 0, 1.0, -1.0)
        out.append((float(wrong_cost[pred != y_val].sum()), cell))
    return out


def dissolve(pairs, diag=None):
    """[(value, polygon)] -> {value: union of its polygons}."""
    groups: dict = {}
    for v, g in pairs:
        groups.setdefault(round(v, 12), []).append(g)
    # a fixed precision grid makes GEOS's overlay robust: in floating precision the
    # union of wedges meeting at one point (all regions meet at C = 0) lost 3% of
    # its area
    return {
        v: _polygonal(overlay(shapely.union_all, gs, diag=diag))
        for v, gs in groups.items()
    }


def superpose(maps, diag=None):
    """Sum of piecewise-constant maps {value: geometry} over the same rectangle: the
    exact K-fold total for every parameter pair, dissolved by value."""
    total = maps[0]
    for m in maps[1:]:
        pairs = []
        for v1, g1 in total.items():
            for v2, g2 in m.items():
                if not g1.intersects(g2):
                    continue
                inter = _polygonal(overlay(shapely.intersection, g1, g2, diag=diag))
                if inter.area > 0:
                    pairs.append((v1 + v2, inter))
        total = dissolve(pairs, diag)
    return total


def _polygonal(geom):
    """The polygons of a geometry as one (Multi)Polygon: snapping to the precision
    grid can leave collapsed slivers as lines or points."""
    parts = _parts(geom)
    if len(parts) == 1:
        return parts[0]
    return shapely.MultiPolygon(parts) if parts else Polygon()


def _parts(geom):
    """The polygons (of positive area) of a geometry."""
    if geom is None or geom.is_empty:
        return []
    parts = getattr(geom, "geoms", [geom])
    return [g for g in parts if g.geom_type == "Polygon" and g.area > 0]


def _largest(geom):
    if geom is None or geom.is_empty:
        return None
    if geom.geom_type == "Polygon":
        return geom
    parts = [g for g in getattr(geom, "geoms", []) if g.geom_type == "Polygon"]
    return max(parts, key=lambda g: g.area) if parts else None


# ---------------------------------------------------------------- the estimator
def merge_duplicates(X, y):
    """Identical training rows with the same label merged into one: returns (rows,
    labels, multiplicities). Exact for the SVM: k copies of (x, y) share one slack,
    so they act as one row with k times the cost, and the merged multiplier is the
    sum of theirs. With the copies apart the dual is not unique (any split of that
    sum between them is optimal), and every split is a degenerate critical region:
    breast-cancer folds hold 28-36 copies in 164 rows."""
    Z = np.column_stack([np.asarray(X, float), np.asarray(y, float)])
    _, first, counts = np.unique(Z, axis=0, return_index=True, return_counts=True)
    keep = np.sort(first)
    order = np.argsort(first)
    return X[keep], y[keep], counts[order].astype(float)


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


class BPSPSearchCV(BaseEstimator):
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
    engine : {"ray", "local"}; address: an existing Ray cluster (None: embedded Ray on
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

    _parameter_constraints: dict = {
        "kernel": [StrOptions({"linear", "rbf", "poly"})],
        "gamma": "no_validation",
        "coef0": [Real],
        "degree": [Interval(Integral, 1, None, closed="left")],
        "cv": "no_validation",
        "cost_fn": [Interval(Real, 0, None, closed="neither")],
        "cost_fp": [Interval(Real, 0, None, closed="neither")],
        "engine": [StrOptions({"ray", "local"})],
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
        from sklearn.model_selection import StratifiedKFold

        if isinstance(self.cv, (int, np.integer)) and not isinstance(self.cv, bool):
            if self.cv < 2:
                raise ValueError(f"cv must be >= 2 folds, got {self.cv}")
            folds = StratifiedKFold(int(self.cv), shuffle=True,
                                    random_state=self.random_state).split(X, y)  # fmt: skip
        else:
            try:
                folds = list(self.cv)
            except TypeError:
                raise ValueError(
                    "cv must be a fold count >= 2 or an iterable of (train, test) "
                    f"index arrays, got {self.cv!r}"
                ) from None
        out = [(np.asarray(a), np.asarray(b)) for a, b in folds]
        if len(out) < 2:
            raise ValueError(f"cv gives {len(out)} fold(s); at least 2 are needed")
        for k, (tr, te) in enumerate(out):
            for name, idx in (("train", tr), ("test", te)):
                if len(np.unique(y[idx])) < 2:
                    raise ValueError(
                        f"cv fold {k}: its {name} rows hold only class "
                        f"{np.unique(y[idx]).tolist()}; each fold needs both classes"
                    )
        return out

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

    def _engine(self):
        if self.engine == "ray":
            from bigrate.engines.ray import RayEngine

            return RayEngine(self.address)
        from bigrate.engines.local import LocalEngine

        return LocalEngine()

    def fit(self, X, y):
        from bigrate._validation import binary_classes
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
        with self._engine() as eng:
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
        piece = _largest(geom)
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
        return self.best_estimator_.decision_function(X)

    def predict(self, X):
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
                    for part in _parts(geom):
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

        from bigrate.data.writer import atomic_write_text

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


__all__ = ["BPSPSearchCV", "Partitioner", "affine_solution", "inequalities"]
