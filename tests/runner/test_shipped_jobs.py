"""The job files shipped in jobs/: one for every estimator family, each valid, and the
warm-up of each (the fit that loads a worker's imports and compiled kernels before a
sweep) ends without an error with the job's own parameters."""

import tomllib

import pytest

from tests.conftest import REPO

# processes these tests start load compiled kernels instead of compiling them
pytestmark = pytest.mark.usefixtures("compiled_kernels")

JOBS = sorted((REPO / "jobs").glob("*.toml"))


def _raw(path):
    return tomllib.loads(path.read_text())


def test_every_estimator_family_has_a_shipped_job():
    from bigrate.runner.registry import ESTIMATORS

    named = {_raw(p).get("model", {}).get("estimator") for p in JOBS}
    # NPSearchCV's job is a sweep job of the estimator it searches
    runnable = {n for n, e in ESTIMATORS.items() if e.fit != "sweep"}
    assert runnable <= named, runnable - named
    kinds = {(_raw(p)["job"]["kind"]) for p in JOBS}
    assert kinds == {"train", "sweep", "crossfit", "evaluate"}


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A small dataset and a saved model to point the shipped jobs at."""
    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.data.prep import prep_synth

    d = tmp_path_factory.mktemp("shipped")
    prep_synth(d / "data", rows=2000, features=200, nnz=20, progress=False)
    ds = ShardedDataset(d / "data")
    NeymanPearsonSGD(epochs=1, random_state=0).fit(ds).save(d / "model")
    return d


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_a_shipped_job_is_valid_and_its_warm_up_cannot_fail(path, stand_in):
    from bigrate.model_selection.sweep import warm_task
    from bigrate.runner.registry import entry
    from bigrate.runner.spec import validate

    raw = _raw(path)
    raw["data"]["path"] = str(stand_in / "data")
    if raw["job"]["kind"] == "evaluate":
        raw["evaluate"]["model"] = str(stand_in / "model")
    spec = validate(raw, path, {})  # raises with every problem and its key path
    if spec.estimator is None:
        return
    e = entry(spec.estimator)
    point = spec.points()[0] if spec.kind == "sweep" else {}
    if e.fit == "search":  # BPSP's own tasks load its kernels; no warm fit
        return
    warm = warm_task(e.load(), {**spec.params, **point}, 123)
    assert warm["error"] is None, warm


@pytest.mark.parametrize(
    "name, params",
    [
        ("NeymanPearsonSGD", {"rho": 0.01, "calibrate": "umbrella", "delta": 0.01}),
        ("NeymanPearsonSVC", {"rho": 0.01, "calibrate": "umbrella"}),
        ("QValueSGD", {"q": 0.001, "epochs": 50}),
    ],
)
def test_warm_up_cannot_fail_where_validation_would_refuse_its_data(name, params):
    """A calibration that needs more held-out negatives than a small warm-up problem
    has (rho = 0.01: 299 and more) does not make the warm-up fail."""
    from bigrate.model_selection.sweep import warm_task
    from bigrate.runner.registry import entry

    warm = warm_task(entry(name).load(), params, 123)
    assert warm["error"] is None, warm
