"""Constraints written as text (job files) are parsed, never evaluated: each accepted
form gives the same constraint as the vocabulary in Python, and anything else is
refused with what was found; a job names its problems with key paths."""

import numpy as np
import pytest

from bigrate import NeymanPearsonSGD, RateConstrainedClassifier
from bigrate.constrained import (
    coverage,
    demographic_parity,
    error_rate,
    positive_rate,
    recall,
)
from bigrate.constrained.parse import parse_constraint, parse_expression


def _data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    g = np.where(rng.random(n) < 0.5, "A", "B")
    y = np.where(X[:, 0] + 0.3 * rng.standard_normal(n) > 0, 1, -1)
    return X, y, g


@pytest.mark.parametrize(
    "text, python",
    [
        ("recall() >= 0.6", lambda: recall() >= 0.6),
        ("0.6 <= recall()", lambda: recall() >= 0.6),
        ('positive_rate(group="A") >= 0.8 * positive_rate(group="B")',
         lambda: positive_rate(group="A") >= 0.8 * positive_rate(group="B")),
        ("coverage() + 0.5 * error_rate(group='B') - 0.1 <= 0.4",
         lambda: coverage() + 0.5 * error_rate(group="B") - 0.1 <= 0.4),
        ("-(recall()) <= -0.5", lambda: -recall() <= -0.5),
        ('demographic_parity("A", "B", 0.9)', lambda: demographic_parity("A", "B", 0.9)),
    ],
)  # fmt: skip
def test_text_gives_the_constraint_python_gives(text, python):
    X, y, g = _data()
    clf = RateConstrainedClassifier(mm_iterations=2).fit(X, y, groups=g)
    parsed = parse_constraint(text)
    assert parsed.constraint.text == text
    want = clf.evaluate(python(), X, y, groups=g)
    assert clf.evaluate(parsed.constraint, X, y, groups=g) == pytest.approx(want)


def test_an_objective_and_a_baseline_by_path(tmp_path):
    X, y, _ = _data()
    base = NeymanPearsonSGD(epochs=2, random_state=0).fit(X, y)
    loaded = []

    def load(path):
        loaded.append(path)
        return base

    p = parse_constraint('churn(baseline="runs/x-LATEST/model") <= 0.05', load)
    assert loaded == ["runs/x-LATEST/model"]
    assert p.lhs.terms[0].subset.baseline is base and p.op == "<="
    assert len(parse_expression("error_rate()").terms) == len(error_rate().terms)


@pytest.mark.parametrize(
    "text, message",
    [
        ("recal() >= 0.5", "unknown rate 'recal'"),
        ('__import__("os").system("true") >= 0', "unknown rate"),
        ("recall() == 0.5", "one <= or >="),
        ("0.1 <= recall() <= 0.9", "one <= or >="),
        ("recall() * recall() <= 0.5", "multiplied by numbers"),
        ("recall(mask=[1, 0]) >= 0.5", "takes no argument 'mask'"),
        ("recall(group=x) >= 0.5", "strings or numbers"),
        ("recall() >= 1.5", "a rate target must be in [0, 1]"),
        ("1 <= 2", "one side needs a rate"),
        ("recall()", "not a constraint"),
        ("recall() >=", "not an expression"),
        ('churn(baseline="m") <= 0.1', "cannot be loaded here"),
    ],
)
def test_anything_else_is_refused_with_what_was_found(text, message):
    with pytest.raises(
        ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
    ):
        parse_constraint(text)


def test_a_job_names_each_bad_constraint_with_its_key_path(tmp_path):
    from bigrate.data.prep import prep_synth
    from bigrate.runner.spec import JobSpecError, validate

    prep_synth(tmp_path / "d", rows=2000, features=100, nnz=10, progress=False)
    raw = {
        "job": {"kind": "train", "name": "c"},
        "data": {"path": str(tmp_path / "d")},
        "model": {
            "estimator": "RateConstrainedClassifier",
            "constraints": ["recall() >= 0.5", "recal() >= 0.5",
                            'recall(dataset="live") >= 0.5',
                            'churn(baseline="runs/none-LATEST") <= 0.1'],
            "objective": "recall() >= 0.5",
        },
    }  # fmt: skip
    with pytest.raises(JobSpecError) as e:
        validate(raw, "j.toml", {})
    problems = e.value.problems
    assert problems[0].startswith("model.constraints[1]: 'recal() >= 0.5': unknown")
    assert problems[1].startswith("model.constraints[2]: a job's constraints hold on")
    assert problems[2].startswith("model.constraints[3]: ")
    assert problems[3].startswith("model.objective: 'recall() >= 0.5': an objective")
    assert len(problems) == 4
    raw["model"] = {"estimator": "NeymanPearsonSGD", "constraints": ["recall() >= 0.5"]}
    with pytest.raises(JobSpecError, match="only RateConstrainedClassifier takes"):
        validate(raw, "j.toml", {})
