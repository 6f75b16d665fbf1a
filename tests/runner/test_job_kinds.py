"""The job kinds beyond the SGD learners, end to end through the real `bigrate`
command on the local engine: a train job of each estimator family fitted as one task
(AUM, the cost-sensitive SVM, the quantile path with its tau chosen on val, the
constrained learner with a fairness constraint on the shards' group column) and the
BPSP search. Each is killed (SIGKILL) at a chosen point, resumed without redoing what
was finished, and `bigrate predict` / `bigrate report` work from its run directory.

The driver dies exactly at the chosen call: the command runs with
``tests/faults/sitecustomize.py`` on its PYTHONPATH (see there)."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from bigrate import ShardedDataset, load_model
from tests.conftest import REPO, run_cli
from tests.runner.test_jobs import events, job_file, only_run

# processes these tests start load compiled kernels instead of compiling them
pytestmark = pytest.mark.usefixtures("compiled_kernels")

FAULTS = REPO / "tests" / "faults"


def killed_at(tmp_path, target: str, n: int = 1) -> dict:
    """The environment of a `bigrate` command that SIGKILLs itself at the n-th call of
    ``target`` (a name of tests/faults/sitecustomize.py's TARGETS)."""
    fault = tmp_path / "faults" / "fault"
    fault.parent.mkdir(exist_ok=True)
    fault.write_text(f"{target} {n}")
    return dict(os.environ, PYTHONPATH=str(FAULTS), BIGRATE_FAULT_FILE=str(fault))


def job(data, out, estimator, params, extra="", name="k"):
    return f"""
[job]
kind = "train"
name = "{name}"
[data]
path = "{data}"
[model]
estimator = "{estimator}"
params = {params}
{extra}
[engine]
name = "local"
[output]
dir = "{out}"
"""


@pytest.fixture(scope="module")
def dense(tmp_path_factory, shared_data):
    """Ionosphere (standardised), a quarter of it for training."""
    d = tmp_path_factory.mktemp("kinds") / "iono"
    run_cli("prep", "recipe", "ionosphere", "--out", d, "--quiet",
            "--split", "train=0.3,val=0.3,test=0.4", check=True)  # fmt: skip
    return d


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """800 rows of 4 dense features with a group column A / B; group A scores lower, so
    an unconstrained classifier predicts it positive less often."""
    d = tmp_path_factory.mktemp("kinds")
    rng = np.random.default_rng(0)
    n = 800
    g = np.where(rng.random(n) < 0.5, "A", "B")
    X = rng.standard_normal((n, 4))
    X[g == "A", 0] -= 1.0
    y = (X[:, 0] + 0.5 * rng.standard_normal(n) > 0).astype(int)
    lines = ["x0,x1,x2,x3,group,label"] + [
        ",".join(f"{v:.6f}" for v in X[i]) + f",{g[i]},{y[i]}" for i in range(n)
    ]
    (d / "g.csv").write_text("\n".join(lines) + "\n")
    run_cli("prep", "csv", d / "g.csv", "--label-column", "label", "--group-column",
            "group", "--positive-labels", "1", "--out", d / "g", "--quiet",
            check=True)  # fmt: skip
    return d / "g"


def check_predict_and_report(run, data):
    """What `bigrate predict` runs scores every row with the saved model; what `bigrate
    report` runs writes a page (the commands themselves: tests/runner/test_jobs.py)."""
    from bigrate.runner.predict import predict
    from bigrate.runner.report import make_report

    out = run.parent / f"{run.name}-scores.parquet"
    predict(run, data, out)
    t = pq.read_table(out)
    ds = ShardedDataset(data)
    assert t.num_rows == sum(ds.n_rows(s) for s in ds.splits)
    test = ds.to_csr("test")
    got = t.filter(t.column("split").to_numpy(zero_copy_only=False) == "test")
    order = np.argsort(got.column("row_id").to_numpy())
    model = load_model(run / "model")
    np.testing.assert_allclose(
        got.column("score").to_numpy()[order], model.decision_function(test.X)
    )
    page = make_report(run)
    assert page == run / "report" / "index.html"
    return page.read_text()


TASK_JOBS = {
    "AUMLinearClassifier": ("{ max_iter = 15, random_state = 0 }", "", "auc"),
    "CostSensitiveSVC": (
        "{ C_pos = 4.0, C_neg = 1.0, gamma = 0.05 }",
        "",
        "error_rate",
    ),
    "QuantilePathSVC": (
        "{ alpha = 1e-2 }",
        '[path]\nrho = 0.1\nselect = "pfa"',
        "J_val",
    ),
}


@pytest.mark.parametrize("estimator", list(TASK_JOBS))
def test_a_task_job_killed_after_its_fit_resumes_without_fitting_again(
    tmp_path, dense, estimator
):
    params, extra, metric = TASK_JOBS[estimator]
    body = job(dense, tmp_path / "runs", estimator, params, extra)
    # killed as the evaluation starts: the model is saved, the fit finished
    p = run_cli("run", job_file(tmp_path, body),
                env=killed_at(tmp_path, "driver-evaluate"))  # fmt: skip
    assert p.returncode == -9, p.stderr[-2000:]
    run = only_run(tmp_path / "runs")
    kinds = [e["event"] for e in events(run)]
    assert "train_finished" in kinds and "run_finished" not in kinds
    saved = load_model(run / "model")
    p = run_cli("resume", run, check=True)
    kinds = [e["event"] for e in events(run)]
    assert kinds.count("train_started") == 1 and "resumed" in kinds  # no second fit
    assert kinds[-1] == "run_finished"
    m = json.loads((run / "metrics.json").read_text())
    assert metric in m["evaluation"]["test"] and "test" in p.stdout
    X = ShardedDataset(dense).to_csr("test").X
    np.testing.assert_array_equal(
        load_model(run / "model").decision_function(X), saved.decision_function(X)
    )
    page = check_predict_and_report(run, dense)
    if estimator == "QuantilePathSVC":
        # tau chosen on val for rho: the least Pnd with val Pfa <= rho
        t = m["tau"]
        ok = [j for j, f in enumerate(t["pfa"]) if f <= 0.1]
        best = min(ok, key=lambda j: t["pnd"][j])
        assert t["tau_chosen"] == t["tau"][best]
        assert saved.get_params()["tau"] == t["tau_chosen"]
        assert m["target"] == {"rho": 0.1} and "Pfa <= rho = 0.1?" in p.stdout
        assert "along tau" in page


def test_a_constrained_job_reports_each_constraint_on_every_split(tmp_path, grouped):
    body = job(
        grouped, tmp_path / "runs", "RateConstrainedClassifier",
        "{ alpha = 1e-3, mm_iterations = 5 }",
        'constraints = [\'positive_rate(group="A") >= 0.8 * positive_rate(group="B")\']',
    )  # fmt: skip
    p = run_cli("run", job_file(tmp_path, body),
                env=killed_at(tmp_path, "driver-evaluate"))  # fmt: skip
    assert p.returncode == -9, p.stderr[-2000:]
    run = only_run(tmp_path / "runs")
    p = run_cli("resume", run, check=True)
    assert [e["event"] for e in events(run)].count("train_started") == 1
    m = json.loads((run / "metrics.json").read_text())
    (row,) = m["constraints"]
    model = load_model(run / "model")
    ds = ShardedDataset(grouped)
    for split in ds.splits:
        # the table's two sides are the positive rates of the model's signs by group
        b = ds.to_csr(split, with_group=True)
        pos = model.decision_function(b.X) >= 0
        rate = {g: pos[b.group == g].mean() for g in ("A", "B")}
        assert row[split]["value"] == pytest.approx(rate["A"], abs=1e-12)
        assert row[split]["target"] == pytest.approx(0.8 * rate["B"], abs=1e-12)
        assert row[split]["met"] == (rate["A"] >= 0.8 * rate["B"] - 1e-12)
    # the constraint moved the model: the unconstrained fit breaks it on train
    from bigrate import RateConstrainedClassifier

    tr = ds.to_csr("train", with_group=True)
    free = RateConstrainedClassifier(alpha=1e-3, mm_iterations=5).fit(tr.X, tr.y)
    pos = free.decision_function(tr.X) >= 0
    assert pos[tr.group == "A"].mean() < 0.8 * pos[tr.group == "B"].mean()
    assert row["train"]["met"]
    assert 'positive_rate(group="A") >= 0.8 * positive_rate(group="B")' in p.stdout
    page = check_predict_and_report(run, grouped)
    assert "positive_rate(group=&quot;A&quot;)" in page


def test_bpsp_job_resumes_without_redoing_finished_tasks(tmp_path, dense):
    params = ("{ kernel = \"rbf\", gamma = [0.05, 0.2], cv = 3, cost_fn = 2.0, "
              "lambda_min = 0.05, spaces = [\"lambda_eta\"] }")  # fmt: skip
    body = job(dense, tmp_path / "runs", "BPSPSearchCV", params)
    # killed while saving the third of its 6 (gamma, space, fold) tasks
    p = run_cli(
        "run", job_file(tmp_path, body), env=killed_at(tmp_path, "bpsp-save", 3)
    )
    assert p.returncode == -9, p.stderr[-2000:]
    run = only_run(tmp_path / "runs")
    assert len(list((run / "tasks").glob("*.npz"))) == 2
    p = run_cli("resume", run, check=True)
    ev = events(run)
    (first, second) = [e for e in ev if e["event"] == "bpsp_started"]
    assert (first["done"], second["done"], second["todo"]) == (0, 2, 4)
    done = [
        (e["gamma"], e["space"], e["fold"]) for e in ev if e["event"] == "task_done"
    ]
    assert len(done) == 6 and len(set(done)) == 6  # each task fitted once
    # the same search in one process: the exact CV error and the point, bit for bit
    from bigrate import BPSPSearchCV, CostSensitiveSVC

    tr = ShardedDataset(dense).to_csr("train")
    ref = BPSPSearchCV(kernel="rbf", gamma=[0.05, 0.2], cv=3, cost_fn=2.0,
                       lambda_min=0.05, spaces=["lambda_eta"], engine="local",
                       progress=False, random_state=0).fit(tr.X.toarray(), tr.y)  # fmt: skip
    model = load_model(run / "model")
    assert model.best_params_ == ref.best_params_ and model.cv_error_ == ref.cv_error_
    m = json.loads((run / "metrics.json").read_text())
    assert m["bpsp"]["cv_error"] == ref.cv_error_ and "cost" in m["evaluation"]["test"]
    assert f"BPSP: exact CV error {ref.cv_error_:.4g}" in p.stdout
    # the refit is a direct fit at the chosen pair
    bp = model.best_params_
    direct = CostSensitiveSVC(C_pos=bp["C_pos"], C_neg=bp["C_neg"], gamma=bp["gamma"],
                              kernel="rbf").fit(tr.X.toarray(), tr.y)  # fmt: skip
    te = ShardedDataset(dense).to_csr("test").X.toarray()
    np.testing.assert_array_equal(
        model.decision_function(te), direct.decision_function(te)
    )
    assert (run / "bpsp_partition.json").exists() and (
        run / "bpsp_cv_error.png"
    ).exists()
    page = check_predict_and_report(run, dense)
    assert "CV-error map" in page
