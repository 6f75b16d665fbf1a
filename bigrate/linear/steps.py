"""The worker's side of the stochastic learners: the kernel configuration and state
they run steps with, the steps themselves, and the merge of workers' states. Plain
numbers and numpy arrays only: a worker imports this (and the step kernels), never the
estimators or scikit-learn, so a fresh worker's first round does not pay for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from bigrate.data.format import RowSequence
from bigrate.linear import _kernels as K
from bigrate.linear.sampler import steps_per_epoch


@dataclass(frozen=True)
class KernelConfig:
    """Everything a worker needs to run steps: plain numbers, picklable."""

    mode: str  # "balanced" | "uniform" | "pairs"
    w_pos: float
    w_neg: float
    lambda_c: float
    gamma0: float
    nu: float
    target: float  # rho, or q for the q-value learner
    eta: float
    loss: int
    intercept_rate: float


def run_steps(
    cfg: KernelConfig,
    v: np.ndarray,
    state: np.ndarray,
    X: sp.csr_matrix,
    y: np.ndarray,
    order,
    stats: np.ndarray,
) -> None:
    """Run the steps of one chunk in place on (v, state); raise on divergence.

    ``X``: a CSR matrix, or a :class:`~bigrate.data.format.RowSequence` whose rows the
    kernels read where they lie (an out-of-core sampler's chunk); ``order`` indexes
    its rows (and ``y``), a (positives, negatives) pair with mode 'pairs'."""
    # the model, its multiplier and the step sizes: the same for every kernel
    rest = (v, state, cfg.lambda_c, cfg.gamma0, cfg.nu, cfg.target, cfg.eta,
            cfg.loss, cfg.intercept_rate, stats)  # fmt: skip
    if isinstance(X, RowSequence):
        n = len(X)
        for o in order if cfg.mode == "pairs" else (order,):
            if len(o) and (o.min() < 0 or o.max() >= n):
                raise IndexError(f"chunk positions must lie in [0, {n})")
        rows, pairs, single = X.blocks, K.qvalue_sgd_steps_seq, K.np_sgd_steps_seq
    else:
        rows, pairs, single = (
            (X.indptr, X.indices, X.data),
            K.qvalue_sgd_steps,
            K.np_sgd_steps,
        )
    if cfg.mode == "pairs":
        status = pairs(*rows, order[0], order[1], *rest)
    else:
        status = single(*rows, y, order, cfg.w_pos, cfg.w_neg, *rest)
    if status == K.NON_FINITE:
        raise FloatingPointError(
            f"training diverged at step {int(state[3])}: w, b or the multiplier became "
            f"non-finite; lower gamma0 (now {cfg.gamma0:g}) or nu (now {cfg.nu:g})"
        )


@dataclass
class SGDState:
    """The streaming state of an SGD learner: the model (w, b), the Lagrange multiplier
    lambda and the step count t. Plain numbers: sent to workers, merged, checkpointed."""

    w: np.ndarray
    b: float
    lam: float
    t: float

    def kernel_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(v, [scale, b, lambda, t]): the layout the step kernels update in place."""
        return np.array(self.w, dtype=np.float64), np.array(
            [1.0, self.b, self.lam, self.t]
        )

    @classmethod
    def from_kernel(cls, v: np.ndarray, state: np.ndarray) -> SGDState:
        return cls(v * state[0], float(state[1]), float(state[2]), float(state[3]))


@dataclass(frozen=True)
class StreamPlan:
    """What a streaming fit needs besides the state, fixed when it starts
    (:meth:`~NeymanPearsonSGD.start_stream`): the resolved kernel configuration, the
    class counts used for training, the calibration hold-out, the seed, and the
    estimator's reading settings a round runs with (the split it trains on, the epochs,
    rows a class a sampler holds, rows a Parquet read, the shuffle block). A
    distributed fit reads these here, never from the estimator."""

    cfg: KernelConfig
    n_pos: int
    n_neg: int
    holdout: tuple | None
    seed: int
    n_features: int
    split: str
    epochs: int
    buffer_rows: int
    batch_rows: int
    shuffle_block: int

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.n_pos, self.n_neg, self.cfg.mode)


def steps_from(
    cfg: KernelConfig, st: SGDState, sampler, n_steps: int, stats: np.ndarray
) -> SGDState:
    """Run ``n_steps`` SGD steps from ``st`` on rows drawn by ``sampler`` (in chunks of
    8,192 draws); ``stats`` accumulates the false-alarm / miss counts. Returns the new
    state (``st`` is not changed)."""
    v, state = st.kernel_state()
    done = 0
    while done < n_steps:
        k = min(8192, n_steps - done)
        X, y, order = sampler.next(k)
        run_steps(cfg, v, state, X, y, order, stats)
        done += k
    return SGDState.from_kernel(v, state)


@dataclass
class StateSum:
    """Workers' states summed, for their merge: the state every worker starts the
    next round from is :meth:`mean`: the mean of the models (w, b), the geometric mean
    of the multipliers (lambda stays positive and a worker with a tenfold multiplier
    counts as much as one with a tenth of it) and the mean step count (every worker ran
    the same number of steps from the same t). Sums, so that workers combine them
    along a tree (:func:`add_state_sums`) and only the root divides.

    An epoch of W workers so merged is, for w and lambda alike, about one W-th of an
    epoch of one process (model averaging: t advances by the mean steps): W workers
    need about W times the epochs to reach one process's multiplier. Summing the
    workers' multiplier changes instead would move lambda at one process's pace while
    w keeps the averaged pace, and that breaks the balance of the two: on 3,000 rows
    of noise, 2 workers with summed changes, or one process with twice ``nu``, drive
    lambda past 1e6 with the false-alarm rate stuck at 0.49."""

    n: int
    w: np.ndarray
    b: float
    log_lam: float
    t: float

    @classmethod
    def of(cls, st: SGDState) -> StateSum:
        return cls(1, np.array(st.w, dtype=np.float64), st.b, float(np.log(st.lam)),
                   st.t)  # fmt: skip

    def mean(self) -> SGDState:
        n = self.n
        return SGDState(self.w / n, self.b / n, float(np.exp(self.log_lam / n)),
                        self.t / n)  # fmt: skip


def add_state_sums(a: StateSum, b: StateSum) -> StateSum:
    """``a`` + ``b`` (a new sum; ``a`` is not changed): the order of the additions is
    the caller's, so a fixed tree gives the same bits wherever it runs."""
    return StateSum(a.n + b.n, a.w + b.w, a.b + b.b, a.log_lam + b.log_lam, a.t + b.t)


def merge_states(states: list[SGDState]) -> SGDState:
    """The merge of ``states`` (see :class:`StateSum`), summed in the order given."""
    if not states:
        raise ValueError("merge_states needs at least one state")
    total = StateSum.of(states[0])
    for st in states[1:]:
        total = add_state_sums(total, StateSum.of(st))
    return total.mean()
