"""Sweeps select the right point, through the real `bigrate run` command: for every
selection metric, the chosen point is the best one by that metric's own direction
(written down here, not read from the package), computed from the per-task result
files; the saved model is a direct fit at the chosen parameters; and NPSearchCV's
refit is a direct fit at its best_params_."""

import json
import warnings

import numpy as np
import pytest

from bigrate import BigrateWarning, ShardedDataset, load_model
from tests.conftest import run_cli
from tests.runner.test_jobs import job_file, only_run

# each metric, whether larger is better, and a sweep whose points it tells apart
SWEEPS = {
    "J_val": (False, "NeymanPearsonSGD", "{ rho = 0.1, epochs = 3 }",
              "alpha = [1e-5, 0.3]"),
    "accepted": (True, "QValueSGD", "{ q = 0.1, epochs = 3 }", "alpha = [1e-5, 0.3]"),
    "pnd": (False, "NeymanPearsonSGD", "{ rho = 0.1, epochs = 3 }",
            "alpha = [1e-5, 0.3]"),
    "error_rate": (False, "CostSensitiveSVC", "{ gamma = 0.05 }",
                   "C_pos = [0.01, 10.0], C_neg = [0.01, 10.0]"),
    "cost": (False, "CostSensitiveSVC", "{ gamma = 0.05 }",
             "C_pos = [0.01, 10.0], C_neg = [0.01, 10.0]"),
    "auc": (True, "AUMLinearClassifier", "{ random_state = 0 }",
            "max_iter = [1, 30]"),
}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory, shared_data):
    d = tmp_path_factory.mktemp("sel") / "iono"
    run_cli("prep", "recipe", "ionosphere", "--out", d, "--quiet", check=True)
    return d


def sweep_body(data, out, metric):
    _, est, params, grid = SWEEPS[metric]
    return f"""
[job]
kind = "sweep"
name = "sel"
[data]
path = "{data}"
[model]
estimator = "{est}"
params = {params}
[sweep]
grid = {{ {grid} }}
cv = 2
select = "{metric}"
cost_fn = 5.0
[engine]
name = "local"
[output]
dir = "{out}"
"""


@pytest.mark.parametrize("metric", list(SWEEPS))
def test_a_sweep_selects_the_best_point_by_its_metrics_direction(
    tmp_path, data, metric
):
    larger_is_better, est, _, _ = SWEEPS[metric]
    p = run_cli(
        "run", job_file(tmp_path, sweep_body(data, tmp_path / "runs", metric)),
        check=True,
    )  # fmt: skip
    run = only_run(tmp_path / "runs")
    recs = [json.loads(f.read_text()) for f in (run / "results").glob("*.json")]
    assert recs and all(r["status"] == "ok" for r in recs), p.stderr[-2000:]
    means = {}
    for r in recs:
        means.setdefault(r["point"], []).append(r["metrics"][metric])
    means = {k: float(np.mean(v)) for k, v in means.items()}
    assert len(set(means.values())) > 1, f"the grid does not tell {metric} apart"
    pick = max if larger_is_better else min
    best = pick(sorted(means), key=lambda k: means[k])
    m = json.loads((run / "metrics.json").read_text())
    assert m["sweep"]["select"] == metric
    assert m["sweep"]["best"]["point"] == best, (means, m["sweep"]["best"])
    # the saved model is a direct fit at the chosen point, on the train split
    from bigrate.engines.local import LocalEngine
    from bigrate.runner.fit import fit_on_engine
    from bigrate.runner.registry import make_estimator

    with warnings.catch_warnings():  # 3 epochs: the NP learner warns, as in the job
        warnings.simplefilter("ignore", BigrateWarning)
        direct = fit_on_engine(make_estimator(est, m["params"]), ShardedDataset(data),
                               LocalEngine(), progress=False)  # fmt: skip
    X = ShardedDataset(data).to_csr("test").X
    np.testing.assert_array_equal(
        load_model(run / "model").decision_function(X), direct.decision_function(X)
    )
    best_params = m["sweep"]["best"]["params"]
    assert all(m["params"][k] == v for k, v in best_params.items())


def test_npsearchcv_refits_its_best_params():
    from bigrate import NeymanPearsonSVC, NPSearchCV

    rng = np.random.default_rng(0)
    X = np.r_[rng.normal(0.7, 1, (90, 3)), rng.normal(-0.7, 1, (90, 3))]
    y = np.r_[np.ones(90), -np.ones(90)]
    base = NeymanPearsonSVC(rho=0.15, random_state=0, calibrate=None)
    s = NPSearchCV(base, {"C": [10.0, 0.01], "gamma": [0.1, 5.0]}, rho=0.15, cv=3,
                   engine="local", progress=False).fit(X, y)  # fmt: skip
    # the best point is neither the first nor the last (a refit of either is caught)
    assert 0 < s.best_index_ < len(s.cv_results_["params"]) - 1
    direct = NeymanPearsonSVC(
        rho=0.15, random_state=0, calibrate=None, **s.best_params_
    ).fit(X, y)
    np.testing.assert_array_equal(s.decision_function(X), direct.decision_function(X))
    # and the point chosen is the least mean J_val of cv_results_
    j = np.asarray(s.cv_results_["mean_J_val"], float)
    assert s.best_params_ == s.cv_results_["params"][int(np.nanargmin(j))]
