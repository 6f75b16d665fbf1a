"""Fixtures shared by the runner's tests."""

import pytest


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """RCV1-shaped synthetic shards: 30,000 rows of 2,000 features."""
    from bigrate.data.prep import prep_synth

    d = tmp_path_factory.mktemp("jobs") / "syn"
    prep_synth(d, rows=30_000, features=2000, progress=False)
    return d
