"""Cross-fit jobs (kind = "crossfit") through the real `bigrate` command: every row of
the pooled splits is scored once, by the model of the fold that did not hold it (checked
by refitting each fold's model on exactly the other folds' rows), the folds' scores are
put on one scale by their own training negatives, grouped rows stay in one fold, the
metrics are those of the saved scores, a driver killed between folds resumes without
refitting a saved fold, and a Dask cluster gives the same bits as the local engine."""

import json
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

from bigrate import QValueSGD, ShardedDataset, load_model
from bigrate.metrics import rate_metrics
from bigrate.runner.crossfit import crossfit_folds, pooled_rows
from tests.conftest import run_cli
from tests.runner.test_job_kinds import killed_at
from tests.runner.test_jobs import events, job_file, only_run

pytestmark = pytest.mark.usefixtures("compiled_kernels")


@pytest.fixture(scope="module")
def psm_like(tmp_path_factory):
    """900 rows of 5 dense features in 300 groups ("spectra") of 3 rows; about half
    the positives carry the signal, as targets that are correct matches do."""
    d = tmp_path_factory.mktemp("crossfit")
    rng = np.random.default_rng(3)
    n = 900
    spec = np.repeat(np.arange(300), 3)
    y = np.where(rng.random(n) < 0.55, 1, 0)
    X = rng.standard_normal((n, 5))
    X[:, 0] += 1.5 * ((y == 1) & (rng.random(n) < 0.5))
    lines = ["f0,f1,f2,f3,f4,spec,label"] + [
        ",".join(f"{v:.6f}" for v in X[i]) + f",s{spec[i]},{y[i]}" for i in range(n)
    ]
    (d / "p.csv").write_text("\n".join(lines) + "\n")
    run_cli("prep", "csv", d / "p.csv", "--label-column", "label", "--group-column",
            "spec", "--positive-labels", "1", "--out", d / "p", "--standardize",
            "--split", "train=0.6,val=0.2,test=0.2", "--quiet", check=True)  # fmt: skip
    return d / "p"


def crossfit_job(
    data, out, engine="local", extra="", params="{ q = 0.05, epochs = 5 }"
):
    return f"""
[job]
kind = "crossfit"
name = "cf"
[data]
path = "{data}"
[model]
estimator = "QValueSGD"
params = {params}
[crossfit]
{"" if "folds" in extra else "folds = 3"}
{extra}
[engine]
name = "{engine}"
{"workers = 2" if engine != "local" else ""}
[output]
dir = "{out}"
"""


def _scores(run) -> dict:
    """scores.parquet's columns as arrays, in row-id order."""
    t = pq.read_table(run / "scores.parquet")
    cols = {c: t.column(c).to_numpy(zero_copy_only=False) for c in t.column_names}
    order = np.argsort(cols["row_id"], kind="stable")
    return {c: v[order] for c, v in cols.items()}


def test_every_row_is_scored_by_the_model_that_did_not_see_it(tmp_path, psm_like):
    p = run_cli("run", job_file(tmp_path, crossfit_job(psm_like, tmp_path / "runs")))
    assert p.returncode == 0, p.stderr[-3000:]
    run = only_run(tmp_path / "runs")
    ds = ShardedDataset(psm_like)
    t = _scores(run)
    # every row of every split once, with its label and split
    n = sum(ds.n_rows(s) for s in ds.splits)
    assert len(t["row_id"]) == n and len(np.unique(t["row_id"])) == n
    assert set(t["fold"].tolist()) == {0, 1, 2}
    # the pooled rows in the job's order (split by split), and each one's line in t
    rows = pooled_rows(ds, list(ds.splits))
    at = np.searchsorted(t["row_id"], rows["row_id"])
    np.testing.assert_array_equal(t["row_id"][at], rows["row_id"])
    np.testing.assert_array_equal(t["label"][at], rows["y"])
    # a spectrum's rows are in one fold
    for g in np.unique(t["group"]):
        assert len(set(t["fold"][t["group"] == g].tolist())) == 1
    metrics = json.loads((run / "metrics.json").read_text())
    X, y = rows["X"], rows["y"]
    for k in range(3):
        mine = t["fold"][at] == k
        model = load_model(run / "models" / f"fold-{k}")
        # the saved model is the one fitted on exactly the other folds' rows ...
        again = QValueSGD(q=0.05, epochs=5, random_state=0).fit(X[~mine], y[~mine])
        np.testing.assert_array_equal(model.coef_, again.coef_)
        # ... its scale the spread of its scores on those rows' negatives ...
        train_neg = ~mine & (y < 0)
        scale = np.std(model.decision_function(X[train_neg]))
        rec = metrics["crossfit"]["per_fold"][k]
        assert rec["scale"] == pytest.approx(scale, rel=1e-12)
        # ... and the fold's rows carry its scores divided by that scale
        np.testing.assert_allclose(
            t["score"][at][mine], model.decision_function(X[mine]) / scale,
            rtol=1e-12,
        )  # fmt: skip
    # the metrics are those of the saved scores
    f, lab = t["score"], t["label"]
    assert metrics["evaluation"]["all"] == pytest.approx(
        rate_metrics(lab, f, q=0.05)
    )  # fmt: skip
    test = t["split"] == "test"
    assert (
        metrics["evaluation"]["test"]["accepted"]
        == rate_metrics(lab[test], f[test], q=0.05)["accepted"]
    )
    assert metrics["crossfit"]["accepted_competed"]["competed"] is True
    # the command prints the pooled table; status says how many folds are done
    assert "all" in p.stdout and "accepted" in p.stdout
    st = run_cli("status", run, check=True).stdout
    assert "crossfit 3/3 folds done" in st and "in scores.parquet" in st
    # predict names the fold models instead of a model the run does not have
    p = run_cli("predict", run, psm_like, "--out", tmp_path / "p.parquet")
    assert p.returncode == 2 and "is a crossfit run" in p.stderr
    assert "models/fold-0" in p.stderr
    # the report plots the cross-fitted scores of every row
    run_cli("report", run, check=True)
    page = (run / "report" / "index.html").read_text()
    assert "ROC of every row, each scored by the fold model" in page
    assert "Targets accepted at each q-value" in page
    assert page.count("data:image/png;base64,") == 2
    p = run_cli("predict", run / "models" / "fold-1", psm_like, "--out",
                tmp_path / "p.parquet", check=True)  # fmt: skip


def test_folds_follow_the_seed_and_groups():
    y = np.r_[np.ones(60), -np.ones(60)]
    groups = np.repeat(np.arange(40), 3)
    a = crossfit_folds(y, groups, 3, seed=0)
    b = crossfit_folds(y, groups, 3, seed=1)
    for tr, te in a:
        assert not set(groups[tr]) & set(groups[te])
        assert len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == 120
    assert any(not np.array_equal(x[1], z[1]) for x, z in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="crossfit.folds: 5 folds need at least 5"):
        crossfit_folds(np.r_[np.ones(50), -np.ones(4)], None, 5, seed=0)


def test_unscaled_scores_are_the_fold_models_own(tmp_path, psm_like):
    run_cli("run", job_file(tmp_path, crossfit_job(psm_like, tmp_path / "runs",
                                                   extra='scale = "none"')), check=True)  # fmt: skip
    run = only_run(tmp_path / "runs")
    t = _scores(run)
    ds = ShardedDataset(psm_like)
    rows = pooled_rows(ds, list(ds.splits))
    at = np.searchsorted(t["row_id"], rows["row_id"])
    for k in range(3):
        mine = t["fold"][at] == k
        model = load_model(run / "models" / f"fold-{k}")
        np.testing.assert_allclose(
            t["score"][at][mine], model.decision_function(rows["X"][mine]), rtol=1e-12
        )


def test_a_driver_killed_between_folds_resumes_the_missing_ones(tmp_path, psm_like):
    body = crossfit_job(psm_like, tmp_path / "runs")
    # SIGKILL at the second fold's save: fold 0 is saved, fold 1's model too, not its
    # scores or record
    p = run_cli(
        "run", job_file(tmp_path, body), env=killed_at(tmp_path, "crossfit-save", 2)
    )
    assert p.returncode == -9, p.stderr[-2000:]
    run = only_run(tmp_path / "runs")
    assert (run / "crossfit" / "fold-0.npz").exists()
    assert not (run / "crossfit" / "fold-1.npz").exists()
    saved0 = (run / "crossfit" / "fold-0.npz").stat().st_mtime_ns
    assert not (run / "scores.parquet").exists() and not (run / "metrics.json").exists()
    run_cli("resume", run, check=True)
    started = [e for e in events(run) if e["event"] == "crossfit_started"]
    assert [e["todo"] for e in started] == [[0, 1, 2], [1, 2]]
    assert (run / "crossfit" / "fold-0.npz").stat().st_mtime_ns == saved0
    # the same scores as a run that was never stopped
    run_cli("run", job_file(tmp_path, body.replace(
        f'dir = "{tmp_path / "runs"}"', f'dir = "{tmp_path / "again"}"')), check=True)  # fmt: skip
    a, b = _scores(run), _scores(only_run(tmp_path / "again"))
    np.testing.assert_array_equal(a["score"], b["score"])
    np.testing.assert_array_equal(a["fold"], b["fold"])


def test_dask_cluster_gives_the_local_engines_bits(tmp_path, psm_like):
    for engine in ("local", "dask"):
        run_cli("run", job_file(tmp_path, crossfit_job(
            psm_like, tmp_path / engine, engine=engine)), check=True)  # fmt: skip
    a, b = _scores(only_run(tmp_path / "local")), _scores(only_run(tmp_path / "dask"))
    np.testing.assert_array_equal(a["score"], b["score"])
    np.testing.assert_array_equal(a["fold"], b["fold"])


@pytest.mark.parametrize(
    ("extra", "estimator", "message"),
    [
        ("folds = 1", "QValueSGD", "crossfit.folds: must be >= 2, got 1"),
        ('scale = "z"', "QValueSGD", "crossfit.scale: one of 'negatives', 'none'"),
        ("splits = []", "QValueSGD", "crossfit.splits: must be a non-empty array"),
        ("", "QuantilePathSVC", "QuantilePathSVC runs as train jobs, not 'crossfit'"),
        ("", "BPSPSearchCV", "BPSPSearchCV runs as train jobs, not 'crossfit'"),
    ],
)
def test_bad_crossfit_jobs_are_refused_before_running(tmp_path, psm_like, extra,
                                                      estimator, message):  # fmt: skip
    body = crossfit_job(psm_like, tmp_path / "runs", extra=extra, params="{}")
    body = body.replace('"QValueSGD"', f'"{estimator}"')
    p = run_cli("run", job_file(tmp_path, body))
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert not (tmp_path / "runs").exists()


def test_a_split_the_dataset_lacks_is_named(tmp_path, psm_like):
    body = crossfit_job(
        psm_like, tmp_path / "runs", extra='splits = ["train", "holdout"]'
    )
    p = run_cli("run", job_file(tmp_path, body))
    assert p.returncode != 0
    assert "crossfit.splits: ['holdout'] not in" in p.stderr


def test_a_train_job_refuses_a_crossfit_table(tmp_path, psm_like):
    body = crossfit_job(psm_like, tmp_path / "runs").replace('kind = "crossfit"',
                                                             'kind = "train"')  # fmt: skip
    p = run_cli("run", job_file(tmp_path, body))
    assert p.returncode == 2
    assert "crossfit: only a crossfit job takes a [crossfit] table" in p.stderr


def test_every_estimator_that_declares_crossfit_scores_a_fold():
    """The fold task is the same for every learner whose class lists "crossfit" among
    its job kinds: each fits on CSR rows and scores the others, finitely, its scale the
    spread of its training negatives' scores."""
    import scipy.sparse as sp
    from sklearn.base import clone

    from bigrate.runner.crossfit import fit_fold_scores
    from bigrate.runner.registry import ESTIMATORS

    rng = np.random.default_rng(0)
    y = np.where(rng.random(300) < 0.6, 1, -1)
    X = rng.standard_normal((300, 5))
    X[:, 0] += y
    X = sp.csr_matrix(X)
    tr, te = np.arange(200), np.arange(200, 300)
    names = [n for n, e in ESTIMATORS.items() if "crossfit" in e.kinds]
    assert set(names) == {"NeymanPearsonSGD", "QValueSGD", "NeymanPearsonSVC",
                          "CostSensitiveSVC", "AUMLinearClassifier"}  # fmt: skip
    for name in names:
        est = ESTIMATORS[name].load()()
        if "random_state" in est.get_params():
            est.set_params(random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fit_fold_scores(est, (X, y), tr, te, "negatives")
            again = clone(est).fit(X[tr], y[tr])  # the training rows only
        assert res["scores"].shape == (100,) and np.isfinite(res["scores"]).all()
        raw = res["model"].decision_function(X[te])
        np.testing.assert_allclose(res["scores"] * res["scale"], raw, rtol=1e-12)
        np.testing.assert_allclose(again.decision_function(X[te]), raw, rtol=1e-12)
