"""Stochastic Neyman-Pearson and q-value linear classifiers (Gasso et al. 2011).

**NP** (Alg. 4): minimise lambda_c/2 ||w||^2 + Pnd_hat(f) subject to Pfa_hat(f) <= rho,
with f(x) = <w, x> + b and Pnd_hat, Pfa_hat the mean surrogate losses (sigmoid or ramp)
of the positives and of the negatives, by stochastic descent on (w, b) and multiplicative
ascent on the multiplier lambda of the Lagrangian

    L(f, lambda) = lambda_c/2 ||w||^2 + Pnd_hat(f) + lambda (Pfa_hat(f) - rho).

**q-value** (sec. 4): maximise detections subject to Pfa <= q (1 - Pnd), with the
Lagrangian (13) L = lambda_c/2 ||w||^2 + (1 + lambda q) Pnd_hat + lambda (Pfa_hat - q),
one positive and one negative per step.

The per-step updates are in :mod:`bigrate.linear._kernels`; sampling in
:mod:`bigrate.linear.sampler`. The learners fit in-memory arrays or stream a
:class:`~bigrate.ShardedDataset` (never loading it whole).

Streaming protocol (public; the in-process fit, the distributed rounds of
:mod:`bigrate.linear.distributed` and checkpoints all use it): ``start_stream(ds)`` gives
a :class:`StreamPlan` and the initial :class:`SGDState` (w, b, lambda, t);
:func:`steps_from` runs steps from a state on rows a sampler draws; :class:`StateSum`
and :func:`add_state_sums` merge the states of several workers; ``record_epoch`` and ``finish_stream`` record the
history, set the fitted attributes and calibrate.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from bigrate.base import RateClassifierMixin, binary_classes
from bigrate.data.format import RowBlock
from bigrate.data.reader import ShardedDataset, is_dataset
from bigrate.errors import BigrateWarning
from bigrate.linear import _kernels as K
from bigrate.linear import sampler as sampler_module
from bigrate.linear.sampler import (
    InMemorySampler,
    RowGroupCache,
    ShardSampler,
    cached_classes,
    holdout_mask,
    holdout_score,
    row_group_units,
)
from bigrate.linear.steps import KernelConfig, SGDState, StreamPlan, steps_from
from bigrate.losses import loss_code
from bigrate.metrics import (
    Confusion,
    auto_calibration_fraction,
    np_threshold,
    np_umbrella_threshold,
    umbrella_need,
)


def logistic_start(X, y, rows, alpha: float, fit_intercept: bool):
    """(w, b) of the L2 logistic regression with balanced class weights on ``rows`` of
    the CSR matrix ``X`` (labels ``y`` in {-1, +1}): mean balanced log-loss + alpha/2
    ||w||^2, the SGD's own regulariser (scikit-learn's C = 1 / (alpha n)), by L-BFGS.
    A start for the SGD, so an L-BFGS run that stops at its iteration limit is used
    as it is."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    Xr = X[rows]
    lr = LogisticRegression(C=1.0 / (alpha * len(rows)), class_weight="balanced",
                            fit_intercept=fit_intercept, max_iter=500)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        lr.fit(Xr, y[rows])
    w = np.ascontiguousarray(lr.coef_.ravel(), dtype=np.float64)
    return w, float(lr.intercept_[0]) if fit_intercept else 0.0


#: rows holding fewer than this share of the features are sparse rows: there the
#: intercept steps at SPARSE_INTERCEPT_RATE (scikit-learn's SGD does the same on sparse
#: matrices), since b moves on every example and each feature only on the rows that
#: hold it; rows holding most features (standardised dense data, whether given as an
#: array, a CSR matrix or shards) step it at rate 1, as every weight does
DENSE_ROWS = 0.5
SPARSE_INTERCEPT_RATE = 0.01


def row_density(nnz: int, rows: int, n_features: int) -> float:
    """The share of the features a row holds on average (stored non-zeros)."""
    return nnz / max(rows * n_features, 1)


class _StochasticRateBase(RateClassifierMixin, BaseEstimator):
    """Shared machinery of the NP and q-value SGD learners."""

    _job_fit = "rounds"  # it streams: start_stream, record_epoch, finish_stream
    _job_data = "shards"

    _parameter_constraints: dict = {
        "loss": [StrOptions({"sigmoid", "ramp"})],
        "eta": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "alpha": [Interval(Real, 0, None, closed="neither")],
        "gamma0": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "nu": [StrOptions({"auto"}), Interval(Real, 0, None, closed="neither")],
        "lambda0": [Interval(Real, 0, None, closed="neither")],
        "init": [StrOptions({"zeros", "logistic"})],
        "epochs": [Interval(Integral, 1, None, closed="left")],
        "fit_intercept": ["boolean"],
        "warm_start": ["boolean"],
        "batch_rows": [Interval(Integral, 1, None, closed="left")],
        "buffer_rows": [Interval(Integral, 1, None, closed="left")],
        "shuffle_block": [Interval(Integral, 1, None, closed="left")],
        "split": [str],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
    }

    _mode_for = None  # set by subclasses

    # ---------------------------------------------------------------- data
    def _labels(self, y) -> np.ndarray:
        return binary_classes(self, y).astype(np.int8)

    def _in_memory(self, X, y):
        X, y = validate_data(
            self,
            X,
            y,
            accept_sparse="csr",
            dtype=[np.float64, np.float32],
            ensure_all_finite=True,
        )
        y8 = self._labels(y)
        X = sp.csr_matrix(X)
        if X.indices.dtype != np.int32 and X.nnz < 2**31:
            X.indices = X.indices.astype(np.int32)
        X.sort_indices()
        return X, y8

    # ---------------------------------------------------------------- defaults
    def _resolve(
        self, n_pos: int, n_neg: int, mean_sq_norm: float, density: float
    ) -> KernelConfig:
        """The kernel's settings for these counts and rows: ``mean_sq_norm`` the mean
        squared row norm, ``density`` the share of the features a row holds (as
        :func:`row_density` measures it), which decides the intercept's step: the
        rows' content, never their container, so dense rows from shards or a CSR
        matrix train as the same rows in a dense array do."""
        mode = self._mode()
        gamma0 = (
            (0.1 / max(mean_sq_norm, 1e-12))
            if self.gamma0 == "auto"
            else float(self.gamma0)
        )
        if gamma0 * self.alpha >= 1.0:
            raise ValueError(
                f"gamma0 * alpha must be < 1 so that the decay (1 - gamma alpha) stays "
                f"positive; got gamma0={gamma0:g}, alpha={self.alpha:g}"
            )
        nu = (
            min(10.0 / max(n_neg, 1), 0.5 * gamma0)
            if self.nu == "auto"
            else float(self.nu)
        )
        n = n_pos + n_neg
        if mode == "uniform":
            w_pos, w_neg = n / n_pos, n / n_neg
        else:
            w_pos, w_neg = 1.0, 1.0
        self.gamma0_, self.nu_ = gamma0, nu
        if self.eta == "auto":
            eta = 5.0 if self.loss == "sigmoid" else 0.4
        else:
            eta = float(self.eta)
        self.eta_ = eta
        self.intercept_rate_ = (
            0.0
            if not self.fit_intercept
            else SPARSE_INTERCEPT_RATE
            if density < DENSE_ROWS
            else 1.0
        )
        return KernelConfig(
            mode=mode,
            w_pos=w_pos,
            w_neg=w_neg,
            lambda_c=float(self.alpha),
            gamma0=gamma0,
            nu=nu,
            target=self._target(),
            eta=eta,
            loss=loss_code(self.loss),
            intercept_rate=self.intercept_rate_,
        )

    # ---------------------------------------------------------------- fit
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit on arrays ``(X, y)`` (dense or sparse; two classes, the larger label
        positive: +1 of {-1, +1}, 1 of {0, 1}) or stream a ShardedDataset / its path
        (``y`` None; rows of ``self.split``)."""
        self._check_own_params()
        t0 = time.perf_counter()
        if is_dataset(X):
            if y is not None:
                raise ValueError("y must be None when X is a ShardedDataset or a path")
            self._fit_stream(X if isinstance(X, ShardedDataset) else ShardedDataset(X))
        else:
            if y is None:
                raise ValueError(
                    f"{type(self).__name__} requires y to be passed, but the "
                    "target y is None (y may be omitted only when X is a "
                    "ShardedDataset or its path)"
                )
            self._fit_arrays(*self._in_memory(X, y))
        self.fit_seconds_ = time.perf_counter() - t0
        return self

    def _fit_arrays(self, X, y):
        rid = np.arange(X.shape[0], dtype=np.int64)
        train_rows = rid
        held = self._holdout_rows(rid, y)
        if held is not None:
            train_rows = rid[~held]
        n_pos = int((y[train_rows] > 0).sum())
        n_neg = int((y[train_rows] < 0).sum())
        if n_pos == 0 or n_neg == 0:
            raise ValueError(
                "both classes need training rows after the calibration hold-out"
            )
        msq = K.sq_norm_sum(X.indptr, X.data) / X.shape[0]
        cfg = self._resolve(n_pos, n_neg, msq, row_density(X.nnz, *X.shape))
        plan = self._plan(cfg, n_pos, n_neg, None, X.shape[1])
        sampler = InMemorySampler(X, y, cfg.mode, self._seed(), rows=train_rows,
                                  block=self.shuffle_block)  # fmt: skip
        st = self.initial_state(X.shape[1])
        self.init_ = "warm_start" if self._warm() else self.init
        if self.init_ == "logistic":
            w, b = logistic_start(X, y, train_rows, self.alpha, self.fit_intercept)
            st = SGDState(w, b, st.lam, st.t)
        self._train(plan, st, sampler)
        if held is not None:
            neg = held & (y < 0)
            self._calibrate(
                K.decision_csr(X.indptr, X.indices, X.data, self.coef_.ravel(), 0.0)[
                    neg
                ]
            )

    def _fit_stream(self, ds: ShardedDataset):
        plan, st = self.start_stream(ds)
        units = row_group_units(ds.files(plan.split))
        budget = sampler_module.STREAM_CACHE_MB
        cached = cached_classes(
            [u for u in units if u[0].cls == "pos"],
            [u for u in units if u[0].cls == "neg"],
            budget,
        )
        sampler = ShardSampler(
            ds,
            plan.cfg.mode,
            self._seed(),
            units=units,
            buffer_rows=plan.buffer_rows,
            batch_rows=plan.batch_rows,
            holdout=plan.holdout,
            shuffle_block=plan.shuffle_block,
            cache=RowGroupCache(budget),
            cached=cached,
        )
        self._train(plan, st, sampler)
        self.finish_stream(plan, None, ds)

    def _train(self, plan: StreamPlan, st: SGDState, sampler) -> None:
        for _ in range(plan.epochs):
            stats = np.zeros(6)
            te = time.perf_counter()
            st = steps_from(plan.cfg, st, sampler, plan.steps_per_epoch, stats)
            self.record_epoch(stats, st, time.perf_counter() - te, plan.steps_per_epoch)
        self._set_fitted(st, plan.cfg)

    # ---------------------------------------------------------------- streaming protocol
    def start_stream(
        self, ds: ShardedDataset, history: list | None = None
    ) -> tuple[StreamPlan, SGDState]:
        """Start a streaming fit on the ``split`` rows of ``ds``: validate the
        parameters against the dataset, resolve the defaults from it and return the plan
        and the initial state (the fitted model's, with ``warm_start``). ``history``:
        the epochs a resumed fit already recorded (its checkpoint's). The in-process
        fit, the distributed fit (:mod:`bigrate.linear.distributed`) and checkpoints
        build on this, :func:`steps_from`, :func:`merge_states`, :meth:`record_epoch`
        and :meth:`finish_stream`."""
        self._validate_params()
        self._check_own_params()
        if not ds.files(self.split):
            raise ValueError(f"{ds.path}: empty shard list for split {self.split!r}")
        if self.init == "logistic":
            raise ValueError(
                f"init='logistic' needs the rows in memory (fit(X, y)); the dataset "
                f"{ds.path} is streamed: use init='zeros' (or fit on "
                f"ds.to_csr({self.split!r}))"
            )
        if (
            self.warm_start
            and hasattr(self, "coef_")
            and self.coef_.shape[1] != ds.n_features
        ):
            raise ValueError(
                f"warm_start: the model has {self.coef_.shape[1]} features, the dataset "
                f"{ds.path} has {ds.n_features}"
            )
        counts = ds.class_counts(self.split)
        frac = self._holdout_fraction(counts["neg"])
        n_pos = counts["pos"]
        n_neg = int(round(counts["neg"] * (1 - frac)))
        # mean squared row norm from the first row group of each class
        # and the share of features a row holds, from the same rows
        sq, rows, nnz = 0.0, 0, 0
        for cls in ("pos", "neg"):
            f = ds.files(self.split, cls)[0]
            for b in ds.iter_file(f, self.batch_rows, row_groups=[0]):
                sq += K.sq_norm_sum(b.X.indptr, b.X.data)
                rows += len(b)
                nnz += b.X.nnz
                break
        density = row_density(nnz, rows, ds.n_features)
        cfg = self._resolve(n_pos, n_neg, sq / max(rows, 1), density)
        seed = self._seed_int()
        holdout = (frac, seed) if frac > 0 else None
        st = self.initial_state(ds.n_features)
        self.init_ = "warm_start" if self._warm() else "zeros"
        if history is not None:
            self.history_ = list(history)
        self.classes_ = np.array([-1, 1])
        self.n_features_in_ = ds.n_features
        return self._plan(cfg, n_pos, n_neg, holdout, ds.n_features), st

    def _plan(self, cfg, n_pos, n_neg, holdout, n_features) -> StreamPlan:
        """The plan of a fit: what was resolved for it and the estimator's settings."""
        return StreamPlan(cfg, n_pos, n_neg, holdout, self._seed_int(), n_features,
                          self.split, self.epochs, self.buffer_rows, self.batch_rows,
                          self.shuffle_block)  # fmt: skip

    def _warm(self) -> bool:
        return bool(self.warm_start and hasattr(self, "coef_"))

    def initial_state(self, n_features: int) -> SGDState:
        """The state training starts from: zeros and ``lambda0``, or with
        ``warm_start`` the fitted model, multiplier and step count (the logistic start
        of ``init`` is put in by the in-memory fit)."""
        if self._warm():
            if self.coef_.shape[1] != n_features:
                raise ValueError(
                    f"warm_start: the model has {self.coef_.shape[1]} features, the data "
                    f"has {n_features}"
                )
            return SGDState(
                self.coef_.ravel().astype(np.float64).copy(),
                float(self.intercept_[0]),
                float(self.multiplier_),
                float(self.t_),
            )
        self.history_ = []
        return SGDState(np.zeros(n_features), 0.0, float(self.lambda0), 0.0)

    def record_epoch(self, stats, st: SGDState, seconds: float, steps: int) -> dict:
        """Append an epoch to ``history_`` from its false-alarm / miss counts ``stats``
        and the state at its end; returns its record."""
        n_neg, s_neg, fa, n_pos, s_pos, miss = stats
        rec = {
            "epoch": len(self.history_) + 1,
            "steps": int(steps),
            "pfa": fa / n_neg if n_neg else float("nan"),
            "pnd": miss / n_pos if n_pos else float("nan"),
            "lambda": float(st.lam),
            "loss_neg": s_neg / n_neg if n_neg else float("nan"),
            "loss_pos": s_pos / n_pos if n_pos else float("nan"),
            "seconds": seconds,
        }
        self.history_.append(rec)
        if self.verbose:
            print(
                f"[bigrate] {type(self).__name__} epoch {rec['epoch']}: "
                f"Pfa {rec['pfa']:.4f} Pnd {rec['pnd']:.4f} lambda {rec['lambda']:.4g} "
                f"({seconds:.2f}s)",
                flush=True,
            )
        self._after_epoch(rec)
        return rec

    def finish_stream(
        self,
        plan: StreamPlan,
        st: SGDState | None,
        ds: ShardedDataset,
        *,
        started: float | None = None,
        engine: dict | None = None,
    ) -> None:
        """Set the fitted attributes from the final state (None: already set) and
        calibrate on the held-out negatives of ``ds`` (one streaming pass), if any;
        a distributed fit gives when it started (``time.perf_counter()``: the wall time
        to the end of the calibration is ``fit_seconds_``) and what its engine did
        (``engine_``)."""
        if st is not None:
            self._set_fitted(st, plan.cfg)
        if engine is not None:
            self.engine_ = dict(engine)
        if plan.holdout is not None:
            self._calibrate_on_holdout(plan, ds)
        if started is not None:
            self.fit_seconds_ = time.perf_counter() - started

    def _calibrate_on_holdout(self, plan: StreamPlan, ds: ShardedDataset) -> None:
        scores = []
        for b in ds.iter_batches(plan.split, "neg", batch_rows=plan.batch_rows):
            keep = holdout_mask(b.row_id, *plan.holdout)
            if keep.any():
                Xh = b.X[keep]
                scores.append(
                    K.decision_csr(
                        Xh.indptr, Xh.indices, Xh.data, self.coef_.ravel(), 0.0
                    )
                )
        self._calibrate(np.concatenate(scores) if scores else np.empty(0))

    def _after_epoch(self, rec: dict) -> None:  # the NP learner warns after the last
        pass

    def _set_fitted(self, st: SGDState, cfg: KernelConfig):
        if not np.isfinite(st.w).all():
            raise FloatingPointError(
                "training diverged: non-finite weights; lower gamma0"
            )
        self.coef_ = st.w.reshape(1, -1)
        self.intercept_ = np.array([float(st.b)])
        self.multiplier_ = float(st.lam)
        self.t_ = float(st.t)
        self.config_ = asdict(cfg)
        self.threshold_shift_ = 0.0
        self._uncalibrated()

    def _uncalibrated(self) -> None:  # the NP learner records what it then promises
        pass

    # ---------------------------------------------------------------- calibration
    def _holdout_fraction(self, n_neg: int, scores=None) -> float:
        """The share of the ``n_neg`` negatives held out to calibrate (none here)."""
        return 0.0

    def _holdout_rows(self, rid, y):
        """The negatives held out to calibrate an in-memory fit (``holdout_mask``, as a
        streamed fit holds out)."""
        frac = self._holdout_fraction(int((y < 0).sum()), holdout_score(rid[y < 0],
                                      self._seed_int()))  # fmt: skip
        if frac <= 0:
            return None
        return holdout_mask(rid, frac, self._seed_int()) & (y < 0)

    def _calibrate(self, neg_scores):  # overridden where calibration exists
        pass

    # ---------------------------------------------------------------- seeds
    def _seed(self):
        rs = self.random_state
        if isinstance(rs, np.random.RandomState):
            return rs.randint(0, 2**31 - 1)
        return rs

    def _seed_int(self) -> int:
        rs = self.random_state
        return int(rs) if isinstance(rs, (int, np.integer)) else 0

    # ---------------------------------------------------------------- prediction
    def decision_function(self, X) -> np.ndarray:
        """f(x) = <coef_, x> + intercept_ for every row (arrays, CSR or a RowBlock)."""
        check_is_fitted(self, "coef_")
        if isinstance(X, RowBlock):
            X = X.X
        X = validate_data(
            self,
            X,
            accept_sparse="csr",
            reset=False,
            dtype=[np.float64, np.float32],
            ensure_all_finite=True,
        )
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            return K.decision_csr(
                X.indptr,
                X.indices,
                X.data,
                self.coef_.ravel(),
                float(self.intercept_[0]),
            )
        return X @ self.coef_.ravel() + self.intercept_[0]

    def score_confusion(self, X, y=None, split: str = "test") -> Confusion:
        """Pfa / Pnd counts on arrays or (streaming) on a split of a dataset."""
        check_is_fitted(self, "coef_")
        if is_dataset(X):
            from bigrate.metrics import evaluate_stream

            ds = X if isinstance(X, ShardedDataset) else ShardedDataset(X)
            return evaluate_stream(self.decision_function, ds, split)
        yy = np.where(np.asarray(y) == self.classes_[1], 1, -1)
        return Confusion.of(yy, self.decision_function(X))

    def _check_own_params(self):
        pass


class NeymanPearsonSGD(_StochasticRateBase):
    """Linear Neyman-Pearson classifier trained by stochastic gradient (Gasso et al.
    2011, Algorithm 4): minimise the miss rate subject to a false-alarm rate <= rho.

    Objective, with l the sigmoid l(z) = 1/(1 + exp(eta z)) or ramp surrogate::

        min_{w,b}  alpha/2 ||w||^2 + mean_{y=+1} l(f(x))
        s.t.       mean_{y=-1} l(-f(x)) <= rho,          f(x) = <w, x> + b

    solved as the saddle point of the Lagrangian by SGD on (w, b) and the multiplicative
    update lambda <- lambda (1 + nu (l(-f(x)) - rho)) on every negative.

    Parameters
    ----------
    rho : float in (0, 1), default 0.05
        Target false-alarm rate.
    loss : {"sigmoid", "ramp"}, default "sigmoid"
    eta : float > 0 or "auto", default "auto"
        The sigmoid's sharpness (l(z) = 1/(1 + exp(eta z))) or the ramp's half-width
        (l linear on [-eta, eta]); see :mod:`bigrate.losses`. "auto" is 5 for the sigmoid
        and 0.4 for the ramp (the same slope 1.25 at z = 0). The surrogate constraint
        mean l(-f) <= rho asks for negative margins of a few times 1/slope, so a steep
        loss needs smaller weights on unit-norm rows; slope 1.25 works on L2-normalised
        sparse rows and standardised dense features alike (the sigmoid with eta = 1 is
        often too soft there).
    alpha : float > 0, default 1e-4
        The regulariser lambda_c = 1/C; also sets the learning-rate decay
        gamma_t = gamma0 / (1 + alpha t).
    gamma0 : float or "auto", default "auto"
        Initial learning rate; "auto" is 0.1 / mean ||x||^2 over the training rows (the
        paper's gamma0 = 0.1 for ||x|| ~ 1, rescaled so the first steps move w by a
        comparable amount on standardised dense features, where ||x||^2 ~ d).
    nu : float or "auto", default "auto"
        Multiplier gain; "auto" is min(10 / n-, gamma0 / 2): proportional to 1 / n- and
        smaller than the learning rate, as the paper advises.
    lambda0 : float > 0, default 1.0
        Initial multiplier (1 weighs the classes equally under balanced sampling).
    init : {"zeros", "logistic"}, default "zeros"
        Where (w, b) start. "zeros": the paper's start. "logistic" (in-memory fits
        only): an L2 logistic regression with balanced class weights and the same
        regulariser (C = 1 / (alpha n)), solved by L-BFGS on the training rows (never
        the calibration hold-out, so the umbrella guarantee is kept). It helps where
        the features are strongly correlated and SGD from zero barely leaves the first
        principal directions in its epochs, and hurts where the weakly regularised
        logistic fit overfits a small set (BENCHMARKS, 40 splits at rho 0.1, test Pnd
        from zero -> from logistic: hill_valley 0.946 -> 0.432, spambase 0.100 ->
        0.084; ionosphere 0.703 -> 0.812, a9a 4,000 rows 0.372 -> 0.400). ``init_``
        says what a fit used ("warm_start" when it continued a fitted model).
    epochs : int, default 10
        An epoch is 2 * max(n+, n-) steps with balanced sampling, n otherwise.
    balanced : bool, default True
        Draw each class with probability 1/2 (example weights 1 and lambda) instead of
        uniformly (weights n/n+ and lambda n/n-).
    calibrate : {"auto", "umbrella", None}, default "auto"
        How the fit keeps its promise on new data (``guarantee_`` says which it got).
        "auto": hold out ``calibration_fraction`` of the negatives from training and
        shift the intercept to a threshold of their scores
        (:func:`bigrate.metrics.np_threshold`): the NP umbrella threshold, so that the
        false-alarm rate on new data is <= rho with probability >= 1 - delta, where
        they are enough (log(delta) / log(1 - rho): 59 at rho 0.05), else one whose
        Pfa is <= rho on average (a warning says so). "umbrella": the umbrella
        threshold or an error if too few. None: no hold-out; the training constraint
        only.
    calibration_fraction : "auto" or float in (0, 1), default "auto"
        The share of the negatives held out to calibrate. "auto": 0.3, or more where
        that is what the umbrella threshold needs (at most 0.6; e.g. of 160
        negatives at rho 0.05, exactly 59 in memory, about 74 streamed), as nproc
        holds out half; ``calibration_fraction_`` says what a fit used.
    delta : float in (0, 1), default 0.05
    fit_intercept, warm_start : bool
    batch_rows, buffer_rows : int
        Streaming only: rows per Parquet read and the per-class shuffle buffer.
    shuffle_block : int, default 1024
        In memory: each pass over a class visits its rows in blocks of this many
        consecutive rows (blocks in random order, rows of a block in random order), so
        that a block's rows stay in the CPU's caches: 1.7x faster steps on RCV1-scale
        data than a plain permutation (``shuffle_block=1``), with the same rates
        (BENCHMARKS). Streaming (shards, also on a cluster): the per-class shuffle
        buffer is permuted the same way. Assumes the rows are not sorted by anything
        that matters within this many rows; use 1 if they are.
    split : str, default "train"
        The split streamed when fitting a ShardedDataset.
    random_state : int, RandomState or None
    verbose : int

    Attributes
    ----------
    coef_ : ndarray of shape (1, n_features)
    intercept_ : ndarray of shape (1,)
    multiplier_ : float
        The Lagrange multiplier lambda at the end of training.
    history_ : list of dict
        Per epoch: pfa, pnd (progressive: margins of the sampled examples before each
        update), lambda, loss_neg, loss_pos, steps, seconds.
    classes_ : ndarray of shape (2,)
        classes_[1] is the positive class.
    guarantee_ : dict
        What this fit promises on new data: ``kind`` "umbrella" (P(Pfa > rho) <=
        delta), "expected" (Pfa <= rho on average), "none" (too few held-out
        negatives to set a threshold) or "training" (calibrate=None: the training
        constraint only), with ``rho``, ``delta``, ``n_calibration`` and ``text``.
    n_calibration_, threshold_shift_ : int, float
        The held-out negatives and the intercept's move (0 without calibration).
    intercept_rate_ : float
        The intercept's step relative to the weights': 1 on rows that hold at least
        half the features (dense data, whether given as an array, a CSR matrix or
        shards), 0.01 on sparser rows (as scikit-learn's SGD on sparse data), 0
        without an intercept.

    Notes
    -----
    Pfa counts negatives with f >= 0 and Pnd positives with f <= 0 (see
    :mod:`bigrate.metrics`).

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import NeymanPearsonSGD
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(1, 1, (500, 2)), rng.normal(-1, 1, (500, 2))]
    >>> y = np.r_[np.ones(500), -np.ones(500)]
    >>> clf = NeymanPearsonSGD(rho=0.05, random_state=0).fit(X, y)
    >>> pfa = float(np.mean(clf.decision_function(X[y < 0]) >= 0))
    >>> pfa <= 0.08
    True
    """

    _rate_target = "rho"
    _sweep_select = "J_val"

    _parameter_constraints: dict = {
        **_StochasticRateBase._parameter_constraints,
        "rho": [Interval(Real, 0, 1, closed="neither")],
        "balanced": ["boolean"],
        "calibrate": [StrOptions({"auto", "umbrella"}), None],
        "calibration_fraction": [
            StrOptions({"auto"}),
            Interval(Real, 0, 1, closed="neither"),
        ],
        "delta": [Interval(Real, 0, 1, closed="neither")],
    }

    def __init__(
        self,
        *,
        rho=0.05,
        loss="sigmoid",
        eta="auto",
        alpha=1e-4,
        gamma0="auto",
        nu="auto",
        lambda0=1.0,
        init="zeros",
        epochs=10,
        balanced=True,
        calibrate="auto",
        calibration_fraction="auto",
        delta=0.05,
        fit_intercept=True,
        warm_start=False,
        batch_rows=32_768,
        buffer_rows=65_536,
        shuffle_block=1024,
        split="train",
        random_state=None,
        verbose=0,
    ):
        self.rho = rho
        self.loss = loss
        self.eta = eta
        self.alpha = alpha
        self.gamma0 = gamma0
        self.nu = nu
        self.lambda0 = lambda0
        self.init = init
        self.epochs = epochs
        self.balanced = balanced
        self.calibrate = calibrate
        self.calibration_fraction = calibration_fraction
        self.delta = delta
        self.fit_intercept = fit_intercept
        self.warm_start = warm_start
        self.batch_rows = batch_rows
        self.buffer_rows = buffer_rows
        self.shuffle_block = shuffle_block
        self.split = split
        self.random_state = random_state
        self.verbose = verbose

    def _mode(self) -> str:
        return "balanced" if self.balanced else "uniform"

    def _target(self) -> float:
        return float(self.rho)

    def _holdout_fraction(self, n_neg: int, scores=None) -> float:
        """``calibration_fraction``; "auto": 0.3, raised to hold out enough of the
        ``n_neg`` negatives for the umbrella threshold (log(delta) / log(1 - rho) of
        them) where at most 60% of them do; else 0.3 (the expected-Pfa threshold, with
        a warning). Each negative is held out by its hash (:func:`holdout_mask`), so a
        streamed fit adds two binomial standard deviations to spare; an in-memory fit
        knows the negatives' hashes (``scores``) and takes the smallest fraction that
        holds out exactly enough. Recorded as ``calibration_fraction_``."""
        if not self.calibrate:
            frac = 0.0
        elif self.calibration_fraction != "auto":
            frac = float(self.calibration_fraction)
        elif scores is None:
            frac = auto_calibration_fraction(n_neg, self.rho, self.delta, spare=2.0)
        else:  # in memory: 0.3, or exactly the need where 0.3 holds out fewer
            frac, need = 0.3, umbrella_need(self.rho, self.delta)
            if need <= 0.6 * len(scores) and np.count_nonzero(scores < frac) < need:
                frac = float(np.nextafter(np.sort(scores)[need - 1], 1.0))
        self.calibration_fraction_ = frac
        return frac

    def _uncalibrated(self) -> None:
        self.guarantee_ = {
            "kind": "training", "rho": float(self.rho), "delta": None,
            "n_calibration": 0,
            "text": f"Pfa <= {self.rho:g} on the training data (the surrogate "
                    "constraint; calibrate=None): nothing on new data",
        }  # fmt: skip

    def _calibrate(self, neg_scores):
        """Shift the intercept so that f >= 0 exactly when <w, x> exceeds the threshold
        t of the held-out negatives' scores (the umbrella threshold, or with "auto" and
        too few of them the expected-Pfa one, or none: :func:`np_threshold`)."""
        if self.calibrate == "umbrella":
            t = np_umbrella_threshold(neg_scores, self.rho, self.delta)
            g = np_threshold(neg_scores, self.rho, self.delta)[1]
        else:
            t, g = np_threshold(neg_scores, self.rho, self.delta)
        self.n_calibration_ = int(len(neg_scores))
        self.guarantee_ = g
        if t is None:
            return
        b_new = -np.nextafter(t, np.inf)
        self.threshold_shift_ = float(b_new - self.intercept_[0])
        self.intercept_ = np.array([b_new])

    def _after_epoch(self, rec: dict) -> None:
        if rec["epoch"] == self.epochs and self.calibrate is None:
            if rec["pfa"] > 1.5 * self.rho + 0.01:
                warnings.warn(
                    f"the training false-alarm rate after the last epoch is "
                    f"{rec['pfa']:.4f}, above rho={self.rho}: raise epochs (now "
                    f"{self.epochs}) or nu (now {self.nu_:g}), or use calibrate='umbrella'",
                    BigrateWarning,
                    stacklevel=5,
                )


class QValueSGD(_StochasticRateBase):
    """Linear classifier maximising detections at a q-value threshold (Gasso et al.
    2011, sec. 4): minimise Pnd subject to Pfa <= q (1 - Pnd), by SGD on pairs of one
    positive and one negative and the update
    lambda <- lambda (1 + nu (l(-f(x-)) - q (1 - l(f(x+))))).

    For target/decoy data (proteomics), positives are targets and negatives decoys;
    evaluate with :func:`bigrate.metrics.positives_at_q`. Parameters are those of
    :class:`NeymanPearsonSGD` with ``q`` in place of ``rho`` (no balanced or calibrate
    options: every step draws one example of each class; an epoch is max(n+, n-) pairs).

    Examples
    --------
    >>> import numpy as np
    >>> from bigrate import QValueSGD
    >>> from bigrate.metrics import positives_at_q
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(1, 1, (400, 3)), rng.normal(-1, 1, (400, 3))]
    >>> y = np.r_[np.ones(400), -np.ones(400)]
    >>> clf = QValueSGD(q=0.05, random_state=0).fit(X, y)
    >>> positives_at_q(y, clf.decision_function(X), 0.05) > 100
    True
    """

    _rate_target = "q"
    _sweep_select = "accepted"

    _parameter_constraints: dict = {
        **_StochasticRateBase._parameter_constraints,
        "q": [Interval(Real, 0, 1, closed="neither")],
    }

    def __init__(
        self,
        *,
        q=0.01,
        loss="sigmoid",
        eta="auto",
        alpha=1e-4,
        gamma0="auto",
        nu="auto",
        lambda0=1.0,
        init="zeros",
        epochs=10,
        fit_intercept=True,
        warm_start=False,
        batch_rows=32_768,
        buffer_rows=65_536,
        shuffle_block=1024,
        split="train",
        random_state=None,
        verbose=0,
    ):
        self.q = q
        self.loss = loss
        self.eta = eta
        self.alpha = alpha
        self.gamma0 = gamma0
        self.nu = nu
        self.lambda0 = lambda0
        self.init = init
        self.epochs = epochs
        self.fit_intercept = fit_intercept
        self.warm_start = warm_start
        self.batch_rows = batch_rows
        self.buffer_rows = buffer_rows
        self.shuffle_block = shuffle_block
        self.split = split
        self.random_state = random_state
        self.verbose = verbose

    def _mode(self) -> str:
        return "pairs"

    def _target(self) -> float:
        return float(self.q)
