"""`bigrate train` end to end on real shards, in-process and on an embedded Dask cluster."""

import json

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_train_a9a_prints_rates_and_saves(shared_data, tmp_path, engine):
    run_cli("prep", "recipe", "a9a", "--out", tmp_path / "a9a", "--quiet", check=True)
    p = run_cli(
        "train",
        tmp_path / "a9a",
        "--rho",
        "0.05",
        "--engine",
        engine,
        "--workers",
        "2",
        "--epochs",
        "4",
        "--out",
        tmp_path / "run",
        check=True,
    )
    assert "Pfa <= rho = 0.05?" in p.stdout and "test" in p.stdout
    run = tmp_path / "run"  # a run directory, as `bigrate run` makes
    res = json.loads((run / "metrics.json").read_text())
    assert res["evaluation"]["test"]["pfa"] < 0.08
    assert res["evaluation"]["test"]["pnd"] < 0.6
    assert (run / "model" / "arrays.npz").exists()
    assert f"run directory: {run}" in p.stdout
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").open()]
    assert events[0] == "run_started" and events[-1] == "run_finished"
    assert {"train_started", "model_saved", "evaluated"} <= set(events)
    assert "state    complete" in run_cli("status", run, check=True).stdout
    if engine == "dask":
        assert "[bigrate] dask: 2 workers" in p.stderr


def test_train_rejects_unknown_parameter(tmp_path):
    run_cli(
        "prep",
        "synth",
        "--rows",
        "3000",
        "--features",
        "200",
        "--out",
        tmp_path / "s",
        "--quiet",
        check=True,
    )
    p = run_cli("train", tmp_path / "s", "--engine", "local", "--param", "gama=1")
    assert p.returncode == 2, p.stderr
    assert "problem(s) in its arguments" in p.stderr
    assert "model.params.gama: NeymanPearsonSGD has no parameter 'gama'" in p.stderr
    p = run_cli("train", tmp_path / "s", "--engine", "local", "--rho", "1.5")
    assert p.returncode == 2 and "model.params.rho: must be" in p.stderr
