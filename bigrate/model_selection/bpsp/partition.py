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
across each facet (Theorem 3), breadth-first but for short runs each to the last
neighbour queued (the parent's system still in the caches); a move is first checked
at a point just across the facet, and where the region's solution carried there
breaks several rows (a degenerate crossing) they all move. Gaps are seeded by direct
solves and overlapping regions (non-unique solutions) give the overlap to the earlier
one.

The (C+, C-) triangle C+ + C- <= 1 is partitioned the same way in the 2C-SVM's own
dual (boxes C+ / C-, margin level 1), where the solution is affine in (C+, C-): see
:class:`Space`. Polygons are shapely's, overlays on a fixed precision grid.

"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import shapely
import shapely.geometry
from shapely.geometry import Polygon, box

from bigrate import _cancel
from bigrate.model_selection.bpsp import _kernels as _k
from bigrate.model_selection.bpsp.geometry import (
    clip,
    convex_pieces,
    facets,
    halfplanes,
    largest,
    overlay,
    parts,
    polygonal,
    polygons_of,
    stack_polygons,
    vertices_ccw,
)

R_SET, M_SET, E_SET = 0, 1, 2
# how far (a distance in the parameters) the compiled walk lets a region reach past
# its lines: rounding only, so that neighbours overlap by far less than area_tol and
# the areas' sum tells a covered domain from one with gaps or overlaps
CLIP_TOL = 1e-12
# a validation row's line splits a cell where the cell's vertices lie beyond this
# (relative to the line's largest coefficient) on both sides (:func:`_kernels.cells`)
CELL_TOL = 1e-12


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
    ``space.box_coef(y)`` (a row standing for k identical rows has k times its box).
    The bordered system above, solved in compiled code (:func:`_kernels.system`): the
    least-norm solution where it is singular (e.g. duplicate rows in M), flagged
    inconsistent where no solution holds for every parameter pair (M empty)."""
    return _solve(Q, y, state, space, box)[0]


def _solve(Q, y, state, space, box):
    box = space.box_coef(y) if box is None else box
    alpha, bprime, gt, ineq, singular, consistent = _k.system(
        Q, y, box, space.r_coef, np.asarray(state, np.int8)
    )
    return Affine(alpha, bprime, gt, bool(singular), bool(consistent)), ineq


# the kinds of inequality bounding a critical region, and where its row goes across it
LOWER, UPPER, E_ROW, R_ROW = 0, 1, 2, 3
_MOVE = {LOWER: R_SET, UPPER: E_SET, E_ROW: M_SET, R_ROW: M_SET}


def inequalities(aff: Affine, y, state, space=SPACES["lambda_eta"], box=None):
    """Rows (a_1, a_2, c, row, kind) of the critical region a . (p1, p2) <= c
    (eq. 12-14): 0 <= a_M <= box, g~_E <= r, g~_R >= r (``box`` as for
    :func:`affine_solution`); an inconsistent system adds the row 0 <= -1."""
    box = space.box_coef(y) if box is None else box
    return _k.inequalities(aff.alpha, aff.gt, np.asarray(state, np.int8), box,
                           space.r_coef, aff.consistent)  # fmt: skip


class Region:
    """A critical region: its polygon (shapely; built on first use from the vertex
    array the compiled walk recorded), its partition and its affine solution (solved
    again on first use where the walk kept only the partition)."""

    def __init__(self, polygon, state, affine=None, solve=None):
        self._polygon, self.state, self._affine, self._solve = (
            polygon,
            state,
            affine,
            solve,
        )

    @property
    def polygon(self):
        if isinstance(self._polygon, np.ndarray):
            self._polygon = Polygon(self._polygon)
        return self._polygon

    @polygon.setter
    def polygon(self, value):
        self._polygon = value

    @property
    def affine(self) -> Affine:
        if self._affine is None:
            self._affine = self._solve(self.state)[0]
        return self._affine


class Walked:
    """The regions of the compiled walk as arrays: partitions (R, n) int8, polygons
    (vertices, offsets: region r is vert[off[r]:off[r + 1]], counter-clockwise),
    areas, their invariant cells on the validation rows (:meth:`Partitioner.run_cells`'
    dict: ``vert``, ``off``, ``fn``, ``fp``) and, where asked for (``keep_h``), the
    validation rows' decision numerators (R, n_val, 3; else (R, 0, 3)).

    Only the cells are joined from the walk's chunks up front: a fit whose regions do
    not overlap needs nothing else, and the partitions alone are a byte per region
    and training row (86 MB for a spambase 600 rectangle fold, 0.13 s a task to
    join into new memory). The rest is joined on first use."""

    def __init__(self, chunks, cells, cell_region, n_val):
        self._chunks, self._n_val = chunks, n_val
        self.cells = cells
        self.cell_region = cell_region  # each cell's region
        # where regions overlapped (a degenerate partition): the regions with the
        # later of each pair giving up the overlap
        # (:meth:`Partitioner._give_up_overlaps`), and those that gave one up
        # (their cells are made anew)
        self.regions: list | None = None
        self.changed: np.ndarray | None = None

    def _joined(self, i, empty):
        return np.concatenate([c[i] for c in self._chunks]) if self._chunks else empty

    @cached_property
    def states(self) -> np.ndarray:
        return self._joined(0, np.zeros((0, 0), np.int8))

    @cached_property
    def _polygons(self):
        return stack_polygons([c[1] for c in self._chunks],
                              [c[2] for c in self._chunks])  # fmt: skip

    @property
    def vert(self) -> np.ndarray:
        return self._polygons[0]

    @property
    def off(self) -> np.ndarray:
        return self._polygons[1]

    @cached_property
    def areas(self) -> np.ndarray:
        return self._joined(3, np.zeros(0))

    @cached_property
    def H(self) -> np.ndarray:
        return self._joined(4, np.zeros((0, self._n_val, 3)))


@dataclass
class Diagnostics:
    regions: int = 0
    direct_solves: int = 0
    # the SMO steps of those solves (warm-started where a seed's corrections failed)
    solve_steps: int = 0
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
    # regions of the compiled walk whose system came by a rank-one update from their
    # parent's instead of a solve from scratch
    updated_systems: int = 0
    # moves whose parent's system the walk's ring had overwritten (solved from
    # scratch instead), and the ring's size at the end (it grows while they are many)
    pool_misses: int = 0
    pool_mb: float = 0.0
    # 1 where the walk met a singular bordered system (a non-unique dual) and the
    # partition was redone by the exact but slower walk over shapely polygons
    slow_path: int = 0
    # gaps the walk left, found by the probe points (of its dropped moves and of thin
    # regions' facets) that no region covers, each seeded by corrections from the
    # partition the walk met there or, where those find none holding at the point, a
    # direct solve; and the GEOS unions of every region, needed only where those
    # found none
    probe_seeds: int = 0
    corrected_seeds: int = 0
    # the searches for the gaps those leave (gap_search: the uncovered stretches of the
    # regions' edges, or GEOS unions of every region), and the edges' gap points seeded
    unions: int = 0
    edge_seeds: int = 0
    # where a task's time went: the compiled walk (with the invariant cells of its
    # regions, made as they are recorded), the gaps (GEOS unions and the direct solves
    # that seed them) and the invariant cells made apart (the slow paths' regions)
    walk_seconds: float = 0.0
    seeding_seconds: float = 0.0
    cells_seconds: float = 0.0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Rings:
    """Buffers for the walk's rings, kept from one partition to the next on a thread.
    A ring is hundreds of MB, and new memory is zeroed by the kernel page by page at
    its first write: spambase 600, one rectangle fold on one core, 2.1-2.2 s of
    system time a partition, 0.3-0.9 s with the buffers of the one before.
    :meth:`take` gives ``size`` floats of the smallest free buffer that holds them
    (a new one if none does), :meth:`give` takes a ring back; the largest ``keep``
    buffers are kept: 4, a ring's every size (32 MB grown 4x up to 1 GiB, each
    growth holding two at once), in all no more than 1.7 GiB where the largest is
    1 GiB. The rings have the sizes they would have without (views of larger
    buffers where those are free), so the walk is the same."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.free: list = []

    def take(self, size: int) -> np.ndarray:
        fits = [b for b in self.free if len(b) >= size]
        if not fits:
            return np.empty(size)
        buf = min(fits, key=len)
        self.free = [b for b in self.free if b is not buf]
        return buf[:size]

    def give(self, ring: np.ndarray) -> None:
        buf = ring if ring.base is None else ring.base
        if all(b is not buf for b in self.free):
            self.free = sorted([*self.free, buf], key=len)[-self.keep :]


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
        # (while the gaps are not negligible) instead of dropped; 0: from the start.
        # From the start by default: a dropped move leaves a gap that only a direct
        # solve (an SMO fit, ~20 ms at n = 291) and its corrections seed again, while
        # a correction where the move failed costs a few solves of the bordered
        # system (hill-valley, 150 CV rows, one fold's rectangle: 1,448 direct solves
        # and 23.3 s with 12, 730 and 12.9 s with 0; spambase's 300 rows: the same
        # regions either way, 10 corrections)
        self.correct_after = 0
        # the compiled walk's ring of recorded regions' systems (float64s, 32 MB to
        # start), from which a neighbour's system is updated instead of solved (the
        # walk, breadth-first between its runs, meets most of a region's neighbours
        # some way down its queue).
        # Grown 4x at a time, up to pool_max_floats (1 GiB), once more than
        # POOL_MISS_SHARE of the moves since the last growth reach back more than
        # RING_AGE_SHARE of the ring for their anchor, or find a system overwritten
        # that was written since (judged after each call of the walk, which stops at
        # the first or at POOL_MISS_STOP such misses)
        self.pool_floats = 1 << 22
        self.pool_max_floats = 1 << 27
        # an updated region's entry is its rank-one term on its parent's inverse (n +
        # 1 floats: :func:`_kernels.update`) and its solution (~6n floats), with the
        # inverse ((n_M + 1)(n_M + 2) / 2 floats: its upper triangle; (n_M + 1)^2
        # before) written out every chain_max + 1 generations.
        # Spambase's 450 CV rows, fold 0's rectangle (n_M ~ 90, 100,636 regions): an
        # inverse every region, a ring grown to 512 MB and 7.0 s of walk; every 5th
        # (4), 128 MB and 5.4-5.8 s; every 17th, 512 MB again: a breadth-first walk
        # reaches a region's child a frontier of regions later, so an anchor must
        # live chain_max frontiers. With the walk's runs (_kernels.CHAIN_RUN),
        # spambase 600's fold 0 takes 6.8-7.0 s at 4, 8 and 16 alike (2: 8.6 s
        # before the runs, against 7.4-8.1 at 4)
        self.chain_max = 4
        # how the gaps the probe points miss are found: "edges", points in them from
        # the uncovered stretches of the regions' edges (:meth:`_edge_seeds`, compiled),
        # or "union", the GEOS union of every region (exact to its 1e-12 grid, but 24
        # of a hill-valley rectangle fold's 45 s: its regions leave ~23,000 slits
        # narrower than area_tol between edges that agree only to a rounding)
        self.gap_search = "edges"
        # a seed whose corrections failed (went round a cycle) is solved directly
        # from the solution of the partition they ended at (:meth:`_seed`), not from 0
        self.warm_seeds = True
        # where the walk's rings come from: None, new memory each time; a
        # :class:`Rings`, the buffers of the partitions run before on this thread
        self.rings = None
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
        state = np.asarray(state, np.int8)
        key = state.tobytes()
        hit = self._memo.pop(key, None)
        if hit is None:
            hit = _solve(self.Q, self.y, state, self.space, self.box)
            if len(self._memo) >= 4096:
                self._memo.pop(next(iter(self._memo)))
        self._memo[key] = hit
        return hit

    # ------------------------------------------------------------ direct solves
    def solve_at(self, p1, p2, alpha0=None):
        """(alpha, b') by our SMO solver at one parameter pair, in this space's
        units; ``alpha0`` (this space's units) warm-starts it."""
        y = self.y
        c_pos, c_neg = self.space.costs(p1, p2)
        C = np.where(y > 0, c_pos, c_neg) * self.weight
        k = self.space.scale(p1, p2)
        res = self.problem.solve(y, np.ones_like(y), np.zeros_like(y), C, 0.0,
                                 alpha0=None if alpha0 is None else alpha0 / k,
                                 eps=self.solve_tol)  # fmt: skip
        self.diag.solve_steps += res.n_iter
        return k * res.alpha, k * res.b

    def state_from(self, alpha, bprime, p1, p2):
        x = np.array([1.0, p1, p2])
        box_ = self.box @ x
        level = float(self.space.r_coef @ x)
        gt = self.Q @ alpha + self.y * bprime
        tol = 1e-6 * max(level, 1e-12)
        at = 1e-9 * max(box_.max(), 1e-12)
        state = np.full(len(self.y), M_SET, np.int8)
        state[(alpha <= at) & (gt > level + tol)] = R_SET
        state[(alpha >= box_ - at) & (gt < level - tol)] = E_SET
        return state

    def correct(self, state, lam, eta, rounds=50):
        """Active-set corrections until the partition's affine solution satisfies its
        own conditions at (lam, eta) (moves the worst violating row each round;
        :func:`_kernels.correct`)."""
        state, moves = _k.correct(self.Q, self.y, self.box, self.space.r_coef,
                                  np.asarray(state, np.int8), float(lam), float(eta),
                                  rounds)  # fmt: skip
        self.diag.corrections += int(moves)
        return state, self._system(state)[0]

    # ------------------------------------------------------------ the partition
    def run(self, progress=None) -> list[Region]:
        """The critical regions covering the domain, as :class:`Region` objects."""
        if self.method == "neighbours":
            walked = self._run_compiled(progress)
            if walked is None:
                return self._run_neighbours(progress)
            if walked.regions is not None:
                return self._kept(walked)
            return self._regions(walked)
        return self._run_theorem2(progress)

    def _kept(self, walked):
        """The regions of a walk whose regions overlapped, but those left with no
        more than area_tol after giving up their overlaps."""
        gave = np.zeros(len(walked.regions), np.bool_)
        gave[walked.changed] = True
        return [r for r, g in zip(walked.regions, gave, strict=True)
                if not g or r.polygon.area > self.area_tol]  # fmt: skip

    def run_cells(self, Kv, y_val, progress=None):
        """The partition refined by the sign pattern on validation rows (``Kv``: their
        kernel rows against the training rows, labels ``y_val`` in {-1, +1}): every
        invariant cell (eq. 15-18) as a convex polygon with its counts of false
        negatives and false positives, which do not depend on the misclassification
        costs. Returns a dict of arrays: ``vert`` (V, 2), ``off`` (cells + 1,),
        ``fn``, ``fp`` (cells,)."""
        Kv = np.ascontiguousarray(Kv, float)
        y_val = np.ascontiguousarray(y_val, float)
        walked = (
            self._run_compiled(progress, Kv, y_val)
            if self.method == "neighbours"
            else None
        )
        if walked is not None and walked.regions is None:
            return walked.cells  # made as its regions were found
        if walked is None:
            regions = (self._run_neighbours(progress)
                       if self.method == "neighbours" else self.run(progress))  # fmt: skip
            return self._cells_of(regions, Kv, y_val)
        # overlapping regions: the walk's cells of the regions that gave up nothing,
        # and those of the others made anew (solving their systems again for all the
        # regions, and a GEOS polygon of each, doubled a hill-valley fold's time)
        gave = np.zeros(len(walked.regions), np.bool_)
        gave[walked.changed] = True
        mine = ~gave[walked.cell_region]
        old = walked.cells
        sizes = np.diff(old["off"])[mine]
        v_keep = np.repeat(mine, np.diff(old["off"]))
        again = self._cells_of(
            [r for r in (walked.regions[k] for k in walked.changed)
             if r.polygon.area > self.area_tol],
            Kv, y_val,
        )  # fmt: skip
        off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return {
            "vert": np.concatenate([old["vert"][v_keep], again["vert"]]),
            "off": np.concatenate([off, off[-1] + again["off"][1:]]),
            "fn": np.concatenate([old["fn"][mine], again["fn"]]),
            "fp": np.concatenate([old["fp"][mine], again["fp"]]),
        }

    def _cells_of(self, regions, Kv, y_val):
        """The invariant cells of :class:`Region` objects (as :meth:`run_cells`)."""
        # regions that gave up an overlap may be non-convex: convex pieces
        vert, off, owner, H = [], [0], [], []
        for r, reg in enumerate(regions):
            a = reg.affine
            H.append(Kv @ (a.alpha * self.y[:, None]) + a.bprime)
            for V in convex_pieces(reg.polygon):
                vert.append(V)
                off.append(off[-1] + len(V))
                owner.append(r)
        vert = np.concatenate(vert) if vert else np.zeros((0, 2))
        off, owner = np.array(off, np.int64), np.array(owner, np.int64)
        H = np.array(H) if H else np.zeros((0, len(y_val), 3))
        t0 = time.perf_counter()
        cv, co, _, fn, fp = _k.cells(vert, off, owner, np.ascontiguousarray(H), y_val,
                                     CELL_TOL)  # fmt: skip
        self.diag.cells_seconds += time.perf_counter() - t0
        return {"vert": cv, "off": co, "fn": fn, "fp": fp}

    def _guard(self, n_regions, covered, total):
        if n_regions > self.max_regions:
            raise RuntimeError(
                f"BPSP stopped at max_regions={self.max_regions} regions "
                f"({covered / total:.1%} of the parameter rectangle covered); raise "
                "max_regions or lambda_min (regions crowd near lambda = 0, i.e. "
                "very large C)"
            )

    def _run_compiled(self, progress=None, Kv=None, y_val=None, keep_h=False):
        """The neighbour walk in compiled code (:func:`_kernels.walk`): each critical
        region once, whole, from a direct solve to the neighbour across every facet
        (Theorem 3), breadth-first but for short runs (:data:`_kernels.CHAIN_RUN`).
        Coverage is checked by summing the regions' areas;
        only where they fall short of the domain's is the uncovered part found by a
        GEOS union and seeded by direct solves, and only where they exceed it
        (overlapping regions) do the later regions give up the overlap. Returns a
        :class:`Walked` (where overlaps were given up, with its regions as
        :class:`Region` objects and those that gave one up), or None where
        a singular bordered system was met (a non-unique dual: the caller takes the
        exact walk of :meth:`_run_neighbours`, whose redundancy checks need the union
        of the regions so far)."""
        rect = self.space.domain(self.lambda_min)
        dom = vertices_ccw(rect)
        total = rect.area
        n = len(self.y)
        # the validation rows' kernel columns: a training row's contiguous
        KvT = np.zeros((n, 0)) if Kv is None else np.ascontiguousarray(Kv.T)
        # with their labels, each region's invariant cells as it is recorded
        y_val = np.zeros(0) if y_val is None else np.ascontiguousarray(y_val, float)
        if len(y_val) not in (0, KvT.shape[1]):
            raise ValueError(
                f"y_val must hold one label per row of Kv ({KvT.shape[1]}), got "
                f"{len(y_val)}"
            )
        rcoef = self.space.r_coef
        table, store, n_seen = (
            np.full((1024, 2), -1, np.int64),
            np.empty((256, n), np.int8),
            0,
        )
        qst, qpt = np.empty((256, n), np.int8), np.zeros((256, 2))
        qhas, head, tail = np.zeros(256, np.bool_), 0, 0
        # each queued partition's parent system in the pool and its move (-1: none)
        qlink = np.full((256, 2), -1, np.int64)
        alloc = np.empty if self.rings is None else self.rings.take
        pool, at = alloc(self.pool_floats), np.zeros(3, np.int64)
        kd = np.zeros(_k.N_DIAG)
        chunks: list = []
        n_chunks = 0  # chunks whose regions are in pieces
        covered, n_regions = 0.0, 0
        perimeter = 0.0  # the regions' summed perimeter
        probe = -1.0 if self.probe is None else float(self.probe)
        correcting = self.correct_after <= 0
        rng = np.random.default_rng(0)
        seeds, gaps = [(rect, None)], []
        united = 0  # the regions of pieces[:united] are out of the gaps
        uncovered = None  # the gaps left by every region so far, once united
        # every region's polygon so far, as (vertices, offsets) chunk by chunk, and
        # the thin ones' (not regions, but what they cover is no gap either); GEOS
        # polygons are built of them only for a union
        pieces: list = []
        piece_states: list = []  # and their partitions
        left: list = []  # the gap seeds of a last round that found nothing
        known = None  # the last search's gap points (see _edge_seeds)
        thins: list = []  # the thin ones of this round
        # the probe points of moves the walk dropped: where gaps start, found without
        # a union of every region (GEOS's, seconds for tens of thousands of them)
        dpt, dst, n_drop = np.zeros((64, 2)), np.zeros((64, n), np.int8), 0
        from_union = True  # this round's seeds are the union's gaps
        # regions per walk call: a progress report between calls
        chunk = 2000 if progress is not None else self.CHUNK
        seen_moves = seen_misses = 0.0  # the walk's counts when the ring last grew
        for _round in range(self.MAX_ROUNDS):
            t0 = time.perf_counter()
            for area, start in seeds:
                _cancel.check()  # a direct solve and its corrections apiece
                # a probe point is tried once: one whose partition was seen lies in
                # a thin region, and random points of its tiny square give the same
                st = self._seed(
                    area,
                    lambda s, t=table, m=store: _k.seen_contains(t, m, s),
                    rng,
                    tries=4 if from_union and start is None else 1,
                    start=start,
                )
                if tail == len(qst):
                    qst, qpt = np.vstack([qst, qst]), np.vstack([qpt, qpt])
                    qhas = np.concatenate([qhas, qhas])
                    qlink = np.vstack([qlink, qlink])
                qst[tail], qhas[tail], qlink[tail] = st, False, -1
                tail += 1
            self.diag.seeding_seconds += time.perf_counter() - t0
            found = 0
            while True:
                _cancel.check()  # between calls of the walk (CHUNK regions apiece)
                t0 = time.perf_counter()
                out = _k.walk(
                    self.Q, self.y, self.box, rcoef, dom, KvT, y_val, CELL_TOL,
                    bool(keep_h), table, store, n_seen, qst, qpt, qhas, qlink, head, tail, pool, at,
                    kd, CLIP_TOL, self.area_tol, probe, correcting,
                    min(chunk, self.max_regions + 1 - n_regions), dpt, dst, n_drop,
                    self.chain_max,
                    self.POOL_MISS_STOP if len(pool) < self.pool_max_floats else np.inf,
                    self.RING_AGE_SHARE * len(pool)
                    if len(pool) < self.pool_max_floats else np.inf,
                )  # fmt: skip
                self.diag.walk_seconds += time.perf_counter() - t0
                (status, table, store, n_seen, qst, qpt, qhas, qlink, head,
                 tail, dpt, dst, n_drop) = out[:13]  # fmt: skip
                moves = kd[_k.D_UPDATES] + kd[_k.D_POOL_MISSES]
                misses = kd[_k.D_RING_SHORT] - seen_misses
                # lost parents, or updates that read far back, beyond a share of
                # the moves since the ring last grew
                allowed = self.POOL_MISS_SHARE * max(moves - seen_moves, 1.0)
                short = misses > allowed or kd[_k.D_RING_FAR] > allowed
                if short and len(pool) < self.pool_max_floats:
                    old = pool
                    pool = self._grown(
                        pool, at, min(4 * len(pool), self.pool_max_floats), alloc
                    )
                    if self.rings is not None:
                        self.rings.give(old)
                    seen_moves, seen_misses = moves, kd[_k.D_RING_SHORT]
                    kd[_k.D_RING_AGE] = 0.0  # anchors written since, in this ring
                    kd[_k.D_RING_FAR] = 0.0
                new, thin = out[13:23], out[23:]
                if len(thin[0]):
                    thins.append(thin)
                if status == _k.WALK_SINGULAR:
                    d = self.diag  # the time spent so far is kept
                    self.diag = Diagnostics(
                        slow_path=1, direct_solves=d.direct_solves,
                        solve_steps=d.solve_steps, walk_seconds=d.walk_seconds,
                        seeding_seconds=d.seeding_seconds,
                    )  # fmt: skip
                    return None
                if len(new[3]):
                    chunks.append(new)
                    covered += float(new[3].sum())
                    perimeter += _perimeters(new[1], new[2])
                    found += len(new[3])
                    n_regions += len(new[3])
                    if progress is not None:
                        progress(min(covered / total, 1.0), n_regions)
                    self._guard(n_regions, covered, total)
                if status == _k.WALK_DONE:
                    break
            if areas_cover(total, covered, float(kd[_k.D_THIN_AREA]), perimeter,
                           self.area_tol):  # fmt: skip
                gaps = []  # every region found: no union needed
                break
            t0 = time.perf_counter()
            for c in [*chunks[n_chunks:], *thins]:  # regions, then thin ones
                pieces.append((c[1], c[2]))
                piece_states.append(c[0])
            n_chunks, thins = len(chunks), []
            # first the probe points (across dropped moves and thin regions' facets)
            # that no region covers; the union of every region only where none is
            probes = self._uncovered(dpt[:n_drop], dst[:n_drop], pieces, rect)
            n_drop = 0
            # while they find regions: seeds that find only regions too thin to keep
            # can lead on to more of them, across their facets, round after round
            # (a hill-valley fold spent its last 40 rounds so, without the union that
            # finds the other gaps)
            if probes and (found or from_union):
                self.diag.probe_seeds += len(probes)
                seeds, from_union = probes, False
                self.diag.seeding_seconds += time.perf_counter() - t0
                continue
            if self.gap_search == "edges":
                # the gaps' points from the uncovered stretches of the regions' edges
                # (:meth:`_edge_seeds`); finished where there are none, or where
                # those of the last round found nothing
                seeds, known = self._edge_seeds(rect, pieces, piece_states, known)
                self.diag.unions += 1
                finished = not seeds or (from_union and found == 0)
                from_union = True
                self.diag.seeding_seconds += time.perf_counter() - t0
                if finished:
                    left = seeds
                    break
                self.diag.edge_seeds += len(seeds)
                short = total - covered - float(kd[_k.D_THIN_AREA])
                correcting = self._correcting(_round, short, total)
                continue
            # a round of probe seeds found nothing the union's finish test can count
            new_polys = [g for v, o in pieces[united:] for g in polygons_of(v, o)]
            uncovered, finished = self._gaps_left(
                rect, uncovered, new_polys, _round, found if from_union else 1
            )
            gaps, united, from_union = uncovered, len(pieces), True
            self.diag.seeding_seconds += time.perf_counter() - t0
            if finished:
                break
            seeds = [(g, None) for g in gaps]
            correcting = self._correcting(_round, sum(g.area for g in gaps), total)
        else:
            # still seeding after every round: where no gaps were found since the
            # last union (or none was made), what the areas leave is unresolved
            short = total - covered - float(kd[_k.D_THIN_AREA])
            if not gaps and short > self.area_tol:
                self.diag.unresolved_pieces += 1
                self.diag.unresolved_area += short
        d = self.diag
        d.regions = n_regions
        d.singular_systems += int(kd[_k.D_SINGULAR])
        d.thin_pieces += int(kd[_k.D_THIN])
        d.thin_area += float(kd[_k.D_THIN_AREA])
        d.degenerate_moves += int(kd[_k.D_DEGENERATE])
        d.corrections += int(kd[_k.D_CORRECTIONS])
        d.updated_systems += int(kd[_k.D_UPDATES])
        d.pool_misses += int(kd[_k.D_POOL_MISSES])
        d.pool_mb = max(d.pool_mb, pool.nbytes / 2**20)
        if self.rings is not None:
            self.rings.give(pool)
        if gaps:
            d.unresolved_pieces += len(gaps)
            d.unresolved_area += sum(g.area for g in gaps)
        if left:  # gap points no seed could cover: what the areas leave
            d.unresolved_pieces += len(left)
            d.unresolved_area += max(total - covered - d.thin_area, 0.0)
        walked = self._gather(chunks, KvT.shape[1])
        if regions_overlap(total, covered, perimeter, self.area_tol):
            # the earlier of two overlapping regions keeps what they share
            walked.regions = self._regions(walked)
            walked.changed = self._give_up_overlaps(
                walked.regions, (walked.vert, walked.off)
            )
            d.regions = len(self._kept(walked))
        return walked

    def _regions(self, walked):
        """The walk's arrays as :class:`Region` objects (polygon and affine solution
        built on first use)."""
        return [Region(walked.vert[walked.off[r] : walked.off[r + 1]],
                       walked.states[r], solve=self._system)
                for r in range(len(walked.areas))]  # fmt: skip

    def _unite(self, rect, union, new_polys, round_, found):
        """The running union with this round's regions added (re-uniting every
        region each round was the fit's largest cost on folds with many seeds), the
        gaps left, and whether the walk is finished: covered, or a later round's
        seeds found nothing new (the same gaps would be seeded again, to no end)."""
        self.diag.unions += 1
        union = overlay(shapely.union_all, [union, *new_polys], diag=self.diag)
        gaps = self._gaps(rect, union)
        return union, gaps, not gaps or (round_ > 0 and found == 0)

    #: rounds of seeding (probe points or gaps) before the compiled walk gives up
    MAX_ROUNDS = 50
    #: regions per call of the compiled walk (between calls: progress, the ring's size)
    CHUNK = 5000
    #: the share of the moves since the ring last grew whose parent's system was
    #: overwritten beyond which the ring grows. 1%: spambase 600's rectangle folds
    #: 0-2, one core: misses 1,988 / 2,042 / 2,306 -> 958 / 1,514 / 1,604 and walks
    #: 3-5% faster than at 2% (the ring grows sooner, to the same 512 MB). 0.2% since
    #: the anchors' inverses are kept as triangles: smaller entries lost parents at
    #: a rate under 1% for longer in a ring of 128 MB (fold 0: 958 -> 2,011 misses
    #: at 1%, 682 at 0.2%, each a solve from scratch, ~1 ms at n_M ~ 180)
    POOL_MISS_SHARE = 0.002
    #: the share of the ring an update may reach back for its anchor before the ring
    #: grows (the walk stops for it to grow then): a breadth-first walk's frontier
    #: widens, and parents are lost once it reaches the ring's whole length. Spambase
    #: 600's rectangle fold 0: the oldest anchor read climbed from 0.46 to 1.0 of a
    #: 128 MB ring over 70,000 regions, then 314 parents were lost (solved from
    #: scratch, ~1 ms each) before the misses made it grow (682 in all; 21 by this
    #: rule, as large a ring); hill-valley's folds reach 0.83 of 32 MB at most, and
    #: lose none. It grows where such reads since it last grew are more than
    #: POOL_MISS_SHARE of the moves, not at the first: with the walk's runs
    #: (_kernels.CHAIN_RUN) a neighbour left queued long can reach back far now and
    #: then while the rest stay well inside (spambase 600's fold 0: a read at 0.98 of
    #: a 512 MB ring grew it to 1 GiB, with the same 84 parents lost either way; the
    #: new memory, zeroed by the kernel page by page, cost the thread's first task
    #: 2.3 s)
    RING_AGE_SHARE = 0.9
    #: a call of the walk stops at this many misses since the ring last grew, for it
    #: to grow then: judged only after a call of CHUNK regions, a ring too small for
    #: the walk's later, larger systems lost 1,893 parents in 5,050 moves (spambase
    #: 450, fold 3's rectangle) before it could grow
    POOL_MISS_STOP = 100

    #: probe points seeded a round at most (each a direct solve, or a few)
    MAX_PROBE_SEEDS = 1000
    #: edges' gap points seeded a round at most (mostly corrections, not solves)
    MAX_EDGE_SEEDS = 5000
    #: how far outside an edge (relative to the domain's side) its cover is tested:
    #: above the rounding of the regions' vertices, far below a gap of area_tol
    EDGE_EPS = 1e-10
    #: an uncovered stretch of an edge is a gap's point where its length times its
    #: reach across (about the gap's area) exceeds this share of area_tol. On a
    #: hill-valley rectangle fold (87,845 regions, 117 gaps of the union): 75,403
    #: stretches, 1,795 above 0.1 of area_tol, in all 117 gaps; above 1, 100 of them
    EDGE_GAP_SHARE = 0.1

    def _edge_seeds(self, rect, pieces, states, known=None):
        """Seeds of the gaps between the polygons of ``pieces`` ((vertices, offsets)
        arrays; their partitions in ``states``) in the domain ``rect``: the points of
        :func:`_kernels.edge_gaps` whose stretch times reach exceeds EDGE_GAP_SHARE
        of area_tol, largest first, each a tiny square with the partition of the
        region whose edge it lies outside (corrections from it reach the gap's).
        ``known``: the last search's points and how many polygons it scanned; only
        the edges of the polygons since are scanned, and the points they cover are
        dropped (a gap the new regions shrank is bounded by their edges too).
        Returns the seeds and what the next search knows."""
        vert, off = stack_polygons([v for v, _ in pieces], [o for _, o in pieces])
        x0, y0, x1, y1 = rect.bounds
        side = max(x1 - x0, y1 - y0)
        start = 0 if known is None else known[3]
        pts, prod, owner = _k.edge_gaps(vert, off, x0, y0, x1, y1,
                                        self.EDGE_EPS * side, self.area_tol * side,
                                        CLIP_TOL, start,
                                        self.EDGE_GAP_SHARE * self.area_tol)  # fmt: skip
        # (the search returns only the points whose product passes the bar)
        keep = shapely.contains_xy(rect, pts[:, 0], pts[:, 1])
        pts, prod, owner = pts[keep], prod[keep], owner[keep]
        if known is not None and len(known[0]):
            old = known[0]
            hit = np.zeros(len(old), np.bool_)
            _k.cover_points(np.ascontiguousarray(old[:, 0]),
                            np.ascontiguousarray(old[:, 1]), vert[off[start]:],
                            off[start:] - off[start], hit)  # fmt: skip
            pts = np.concatenate([old[~hit], pts])
            prod = np.concatenate([known[1][~hit], prod])
            owner = np.concatenate([known[2][~hit], owner])
        order = np.argsort(-prod, kind="stable")[: self.MAX_EDGE_SEEDS]
        first = np.cumsum([0] + [len(o) - 1 for _, o in pieces])
        chunk = np.searchsorted(first, owner[order], side="right") - 1
        e = 1e-9 * side
        return [
            (shapely.box(x - e, y - e, x + e, y + e), states[c][r - first[c]])
            for (x, y), c, r in zip(pts[order], chunk, owner[order], strict=True)
        ], (pts, prod, owner, len(off) - 1)

    def _uncovered(self, points, states, pieces, rect):
        """Tiny squares around those of ``points`` (the walk's probe points) inside
        the domain ``rect`` that no polygon of ``pieces`` ((vertices, offsets) arrays
        of convex polygons: :func:`_kernels.cover_points`) covers, each a seed of a
        gap (at most :attr:`MAX_PROBE_SEEDS`, distinct), with the partition of
        ``states`` the walk met at it."""
        if not len(points):
            return []
        pts, first = np.unique(np.asarray(points), axis=0, return_index=True)
        inside = shapely.contains_xy(rect, pts[:, 0], pts[:, 1])
        pts, first = pts[inside], first[inside]
        x0, y0, x1, y1 = rect.bounds
        if not len(pts):
            return []
        px, py = np.ascontiguousarray(pts[:, 0]), np.ascontiguousarray(pts[:, 1])
        hit = np.zeros(len(pts), np.bool_)
        for vert, off in pieces:
            _k.cover_points(px, py, vert, off, hit)
        e = 1e-9 * max(x1 - x0, y1 - y0)
        return [
            (shapely.box(x - e, y - e, x + e, y + e), states[i])
            for (x, y), i in zip(
                pts[~hit][: self.MAX_PROBE_SEEDS],
                first[~hit][: self.MAX_PROBE_SEEDS],
                strict=True,
            )
        ]

    def _gaps_left(self, rect, gaps, new_polys, round_, found):
        """The gaps the compiled walk left, and whether it is finished (as
        :meth:`_unite`). The first time: ``rect`` less the GEOS union of every
        region. After that, the last ``gaps`` less the regions found since, as what is
        covered only grows: re-uniting every region for a few new ones cost as much as
        the first union each round (11 s of a hill-valley fold's 42 s at 11,000
        regions, three times)."""
        if gaps is None:
            return self._unite(rect, Polygon(), new_polys, round_, found)[1:]
        if new_polys:
            tree, left = shapely.STRtree(new_polys), []
            for g in gaps:
                hit = tree.query(g, predicate="intersects")
                if not len(hit):
                    left.append(g)
                    continue
                cover = overlay(shapely.union_all, [new_polys[i] for i in hit],
                                diag=self.diag)  # fmt: skip
                left += self._pieces(overlay(shapely.difference, g, cover,
                                             diag=self.diag))  # fmt: skip
            gaps = left
        return gaps, not gaps or (round_ > 0 and found == 0)

    def _gaps(self, rect, union):
        """The parts of ``rect`` outside ``union`` larger than area_tol."""
        return self._pieces(overlay(shapely.difference, rect, union, diag=self.diag))

    def _pieces(self, geom):
        """The polygons of ``geom`` larger than area_tol."""
        return [g for g in getattr(geom, "geoms", [geom])
                if g.geom_type == "Polygon" and g.area > self.area_tol]  # fmt: skip

    def _correcting(self, round_, gap_area, total):
        """Whether moves that fail just across their facet are corrected there from
        the next round on: after correct_after rounds of seeding, while the gaps
        (``gap_area``) are not negligible (the walk has broken into islands)."""
        return round_ + 1 >= self.correct_after and gap_area > 1e-6 * total

    @staticmethod
    def _grown(pool, at, size, alloc=np.empty):
        """The walk's ring ``pool`` (write position ``at[0]``) as a ring of ``size``
        floats (``alloc(size)``) with the same entries: an entry at v, intact while
        at[0] <= v + len(pool), moves from v % len(pool) to v % size, and at[0] moves
        on by the growth, so that entries overwritten before stay out of reach;
        ``at[1]`` becomes where the growth was (entries lost later were written into
        a ring of this size)."""
        old, a = pool.shape[0], int(at[0])
        new = alloc(size)
        v = max(a - old, 0)
        while v < a:  # in pieces that wrap in neither ring
            so, sn = v % old, v % size
            k = min(a - v, old - so, size - sn)
            new[sn : sn + k] = pool[so : so + k]
            v += k
        at[0], at[1] = a + size - old, a
        return new

    @staticmethod
    def _gather(chunks, n_val):
        """One :class:`Walked` from the walk's chunks (partitions, polygons, areas,
        numerators, cells' vertices, offsets, fn and fp)."""
        if not chunks:
            cells = {"vert": np.zeros((0, 2)), "off": np.zeros(1, np.int64),
                     "fn": np.zeros(0, np.int32), "fp": np.zeros(0, np.int32)}  # fmt: skip
            return Walked([], cells, np.zeros(0, np.int64), n_val)
        cv, co = stack_polygons([c[5] for c in chunks], [c[6] for c in chunks])
        cells = {"vert": cv, "off": co, "fn": np.concatenate([c[7] for c in chunks]),
                 "fp": np.concatenate([c[8] for c in chunks])}  # fmt: skip
        # each cell's region, numbered across the chunks
        first = np.cumsum([0] + [len(c[3]) for c in chunks[:-1]])
        owner = np.concatenate([c[9] + f for c, f in zip(chunks, first, strict=True)])
        return Walked(chunks, cells, owner, n_val)

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
                queue.append(
                    (self._seed(area, lambda st: st.tobytes() in seen, rng), None)
                )
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
                self._guard(len(regions), covered, total)
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
            found = len(regions) - done
            new_polys = [r.polygon for r in regions[done:]]
            done = len(regions)
            union, gaps, finished = self._unite(rect, union, new_polys, _round, found)
            if finished:
                break
            seeds = gaps
            correcting = self._correcting(_round, sum(g.area for g in gaps), total)
        if gaps:
            self.diag.unresolved_pieces += len(gaps)
            self.diag.unresolved_area += sum(g.area for g in gaps)
        # overlaps: keep the earlier region's claim
        if sum(r.polygon.area for r in regions) > union.area + self.area_tol:
            self._give_up_overlaps(regions)
            regions = [r for r in regions if r.polygon.area > self.area_tol]
        self.diag.regions = len(regions)
        return regions

    def _seed(self, area, is_seen, rng, tries=4, start=None):
        """The partition at a point of ``area``: by corrections from ``start`` (the
        partition the walk met there, if any) where they end at one holding at the
        point, else by a direct solve at its representative point, or random points
        of it while that gives a partition already seen (with tied or duplicated
        rows, the one found there can have no area, and the same point would give it
        again every round)."""
        x0, y0, x1, y1 = area.bounds
        pt = area.representative_point()
        rounds = max(50, 2 * len(self.y))
        warm = None
        if start is not None:
            # just across a facet of the region the walk came from, a few moves
            # from it, where a direct solve costs an SMO fit (~4 ms at n = 291)
            st, moves, held = _k.corrected(self.Q, self.y, self.box,
                                           self.space.r_coef,
                                           np.asarray(start, np.int8), pt.x, pt.y,
                                           rounds)  # fmt: skip
            self.diag.corrections += int(moves)
            # where they went round a cycle, the partition they stopped at may hold
            if held or _k.correct(self.Q, self.y, self.box, self.space.r_coef, st,
                                  pt.x, pt.y, 1)[1] == 0:  # fmt: skip
                self.diag.corrected_seeds += 1
                return st
            if self.warm_seeds:
                warm = self._warm_start(st, pt.x, pt.y)
        for _ in range(tries):
            lam, eta = pt.x, pt.y
            # from the solution of the partition the corrections ended at, where
            # they went round a cycle: a few SMO steps from the point's (hill-valley,
            # 291 rows, fold 0's rectangle: 1,102 such solves, 4.9M SMO steps and
            # 6.5 s from zero; 1,427 steps and 0.27 s so, the same regions)
            a, bp = self.solve_at(lam, eta, warm)
            warm = None  # further tries are at other points
            self.diag.direct_solves += 1
            # as many moves as the rows twice over: on hill-valley's triangle a direct
            # solve's partition can be 86 moves from the one that holds at its point
            # (50 left 0.066-0.075 of the triangle's 0.5 unresolved on 2 of 5 folds)
            st, _ = self.correct(self.state_from(a, bp, lam, eta), lam, eta,
                                 rounds=rounds)  # fmt: skip
            if not is_seen(st):
                break
            for _ in range(100):
                pt = shapely.Point(rng.uniform(x0, x1), rng.uniform(y0, y1))
                if area.contains(pt):
                    break
        return st

    def _warm_start(self, state, p1, p2):
        """The solution of the partition ``state`` at (p1, p2), clipped to the boxes
        there (a start for SMO: it need not hold at the point), or None where its
        system gives none (no finite solution)."""
        x = np.array([1.0, p1, p2])
        alpha = self._system(state)[0].alpha @ x
        if not np.isfinite(alpha).all():
            return None
        return np.clip(alpha, 0.0, self.box @ x)

    def _covered_so_far(self, regions):
        """The union of ``regions``, widened by 1e-9 (vertices are computed region
        by region) and prepared for fast containment tests."""
        union = overlay(shapely.union_all, [r.polygon for r in regions], diag=self.diag)
        inside = shapely.buffer(union, 1e-9)
        shapely.prepare(inside)
        return inside

    def _give_up_overlaps(self, regions, arrays=None):
        """Each region gives up what it shares (more than area_tol) with earlier
        regions. The overlapping pairs: from the regions' counter-clockwise convex
        polygons as (vertices, offsets) ``arrays`` in compiled code
        (:func:`_kernels.overlaps`), else in one vectorised GEOS tree query."""
        if arrays is not None:
            i, j, _ = _k.overlaps(*arrays, self.area_tol)
        else:
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
            regions[k].polygon = polygonal(
                overlay(shapely.difference, regions[k].polygon, taken, diag=self.diag)
            )
            self.diag.overlaps += 1
        return np.unique(i)

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
            self._guard(len(regions), covered, total)
            st = regions[-1].state
            fac = facets(P, ineq, active, self.tol)
            for i, k in enumerate(fac):
                # X n {facet k violated} n {facets before it held} (Theorem 2)
                abc = np.concatenate([-ineq[[k], :3], ineq[fac[:i], :3]])
                piece = largest(
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
            P = largest(P)
            if P is not None and P.area > self.area_tol:
                return P, state, aff, active, ineq
        self.diag.unresolved_pieces += 1
        self.diag.unresolved_area += X.area
        return None, None, None, None, None


def regions_overlap(total, covered, perimeter, area_tol):
    """Whether regions of summed area ``covered`` and summed ``perimeter`` in a
    domain of area ``total`` overlap: regions reach CLIP_TOL past their lines, so
    neighbours share a strip of that width along every edge; more than that (and
    area_tol) is an overlap."""
    return covered - total > area_tol + CLIP_TOL * perimeter


def areas_cover(total, covered, thin, perimeter, area_tol):
    """Whether regions of summed area ``covered`` (and thin ones of ``thin``) cover a
    domain of area ``total`` with no gap: they fall short of it by area_tol at most,
    and do not overlap (:func:`regions_overlap`), which would hide as large a gap
    from the sum: a walk whose updates were refined (an experiment) gave hill-valley
    150's fold 2 rectangle 12 overlaps and 14,870 regions whose areas added up, the
    gaps of the 30 it never found searched for once this told."""
    return total - covered <= area_tol + thin and not regions_overlap(
        total, covered, perimeter, area_tol
    )


def _perimeters(vert, off):
    """The summed perimeter of the polygons vert[off[r]:off[r + 1]]."""
    if len(vert) == 0:
        return 0.0
    nxt = np.arange(1, len(vert) + 1)
    nxt[off[1:] - 1] = off[:-1]
    return float(np.hypot(*(vert[nxt] - vert).T).sum())


# ---------------------------------------------------------------- invariant regions
def invariant_cells(region: Region, Kv, y_train, y_val, cost_fn, cost_fp, tol=1e-12):
    """The region split by the sign pattern of the decision function on validation
    rows (eq. 15-18): f(x) = (sum_j a_j y_j K(x_j, x) + b') / lambda, whose numerator
    h is affine in (lambda, eta) on the region, so each validation row's sign flips on
    one line. Returns [(cost-weighted errors, polygon)]: errors = cost_fn * false
    negatives + cost_fp * false positives (predicted positive iff f > 0)."""
    H = Kv @ (region.affine.alpha * y_train[:, None]) + region.affine.bprime
    cells = parts(region.polygon)  # one convex polygon, or parts left by overlaps
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
                nxt += parts(cell.intersection(half))
        cells = nxt
    out = []
    wrong_cost = np.where(y_val > 0, cost_fn, cost_fp)
    for cell in cells:
        lam, eta = cell.representative_point().coords[0]
        pred = np.where(H[:, 0] + H[:, 1] * lam + H[:, 2] * eta > 0, 1.0, -1.0)
        out.append((float(wrong_cost[pred != y_val].sum()), cell))
    return out


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
