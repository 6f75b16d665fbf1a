"""Job-file validation: every problem reported at once, with its key path."""

import textwrap

import pytest

from bigrate.runner.spec import JobSpecError, load_job


@pytest.fixture
def data_dir(tmp_path):
    from bigrate.data.prep import prep_synth

    prep_synth(tmp_path / "data", rows=2000, features=100, progress=False)
    return tmp_path / "data"


def write(tmp_path, text):
    p = tmp_path / "job.toml"
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """
[job]
kind = "train"
name = "t"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = 2 }}
[engine]
name = "local"
[output]
dir = "{out}"
"""


def test_a_good_job_resolves(tmp_path, data_dir):
    spec = load_job(write(tmp_path, GOOD.format(data=data_dir, out=tmp_path / "runs")))
    assert spec.kind == "train" and spec.params == {"rho": 0.05, "epochs": 2}
    assert spec.engine == "local" and spec.data == str(data_dir)
    spec = load_job(
        write(tmp_path, GOOD.format(data=data_dir, out="runs")),
        {"engine": "dask", "address": "tcp://127.0.0.1:8786"},
    )
    assert spec.engine == "dask" and spec.address == "tcp://127.0.0.1:8786"
    assert spec.merge == "auto"
    text = GOOD.replace('name = "local"', 'name = "dask"\nmerge = "driver"')
    spec = load_job(write(tmp_path, text.format(data=data_dir, out="runs")))
    assert spec.merge == "driver"


@pytest.mark.parametrize(
    "text, problems",
    [
        (
            """
        [job]
        kind = "train"
        name = "t"
        colour = "red"
        [data]
        path = "{data}"
        [model]
        estimator = "NeymanPearsonSGD"
        params = {{ rho = 1.5, epochs = "ten", gamma = 1 }}
        [gpu]
        n = 1
        """,
            [
                "job.colour: unknown key",
                "gpu: unknown section",
                "model.params.rho: must be a float in the range (0.0, 1.0), got 1.5",
                "model.params.epochs: must be an int in the range [1, inf), got 'ten'",
                "model.params.gamma: NeymanPearsonSGD has no parameter 'gamma'",
            ],
        ),
        (
            """
        [job]
        kind = "fit"
        name = "a/b"
        [data]
        path = "nowhere"
        [model]
        estimator = "SVM"
        """,
            [
                "job.kind: must be one of train, sweep, crossfit, evaluate, got 'fit'",
                "job.name: must be a plain name",
                "data.path: no dataset at",
                "model.estimator: unknown estimator 'SVM'",
            ],
        ),
        (
            """
        [job]
        kind = 3
        [data]
        path = "{data}"
        """,
            ["job.kind: must be a string, got 3", "job.name: required"],
        ),
        (
            """
        [job]
        kind = "train"
        name = "t"
        [data]
        path = "{data}"
        [model]
        estimator = "QValueSGD"
        params = {{ q = 0 }}
        [engine]
        name = "spark"
        address = "10.0.0.1"
        """,
            [
                "model.params.q: must be a float in the range (0.0, 1.0), got 0",
                "engine.name: must be one of local, dask, ray, got 'spark'",
            ],
        ),
        (
            """
        [job]
        kind = "sweep"
        name = "s"
        [data]
        path = "{data}"
        [model]
        estimator = "NeymanPearsonSGD"
        params = {{ rho = 0.05, alpha = 0.1 }}
        [sweep]
        grid = {{ alpha = [1e-4, -1.0], eta = 2.0 }}
        cv = 1
        select = "accuracy"
        batch_seconds = -1
        """,
            [
                "sweep.batch_seconds: must be >= 0 (0 turns batching off), got -1",
                "sweep.grid.alpha: must be a float in the range (0.0, inf), got -1.0",
                "sweep.grid.eta: must be an array of values, got 2.0",
                "sweep.grid.alpha: also set in model.params",
                'sweep.cv: must be a fold count >= 2 or "val", got 1',
                "sweep.select: must be one of J_val, accepted, pnd, error_rate, cost, auc, got 'accuracy'",
            ],
        ),
        (
            """
        [job]
        kind = "train"
        name = "t"
        [data]
        path = "{data}"
        [model]
        estimator = "NeymanPearsonSGD"
        [engine]
        name = "dask"
        address = "10.0.0.1:8786"
        rounds_per_epoch = 0
        memory_limit = "1GiB"
        merge = "scheduler"
        """,
            [
                "engine.address: a Dask scheduler address looks like tcp://host:8786",
                'engine.rounds_per_epoch: must be "auto" or an integer >= 1, got 0',
                "engine.merge: one of 'auto', 'direct', 'workers', 'driver', got "
                "'scheduler'",
                "engine.memory_limit: sets the workers' limit of an embedded Dask "
                "cluster only (engine 'dask', address '10.0.0.1:8786')",
            ],
        ),
        (
            """
        [job]
        kind = "train"
        name = "t"
        [data]
        path = "{data}"
        [model]
        estimator = "NeymanPearsonSGD"
        [engine]
        name = "dask"
        memory_limit = "lots"
        """,
            [
                'engine.memory_limit: a size such as "4GiB" or a number of bytes, got '
                "'lots'",
            ],
        ),
        (
            """
        [job]
        kind = "train"
        name = "t"
        [data]
        path = "{data}"
        [model]
        estimator = "NeymanPearsonSGD"
        [engine]
        name = "ray"
        memory_limit = "2GiB"
        """,
            [
                "engine.memory_limit: sets the workers' limit of an embedded Dask cluster"
            ],
        ),
        (
            """
        [job]
        kind = "evaluate"
        name = "e"
        [data]
        path = "{data}"
        [evaluate]
        model = "no/such/model"
        """,
            ["evaluate.model: no saved model at"],
        ),
    ],
)
def test_every_problem_is_reported_with_its_key_path(
    tmp_path, data_dir, text, problems
):
    with pytest.raises(JobSpecError) as e:
        load_job(write(tmp_path, text.format(data=data_dir)))
    msg = str(e.value)
    for p in problems:
        assert p in msg, msg
    assert len(e.value.problems) >= len(problems)


def test_job_files_are_data_not_code(tmp_path, data_dir):
    text = GOOD.format(data=data_dir, out="runs").replace(
        "rho = 0.05", "rho = \"__import__('os').system('touch pwned')\""
    )
    with pytest.raises(JobSpecError, match="model.params.rho: must be a float"):
        load_job(write(tmp_path, text))
    assert not (tmp_path / "pwned").exists()


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(JobSpecError, match="not valid TOML"):
        load_job(write(tmp_path, "[job\nkind="))
    with pytest.raises(FileNotFoundError, match="job file not found"):
        load_job(tmp_path / "nope.toml")
