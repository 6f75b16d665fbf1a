"""Distributed NP SGD on a real 2-worker Dask LocalCluster bound to 127.0.0.1."""

import os
import signal
import threading

import numpy as np
import pytest

from bigrate import NeymanPearsonSGD, QValueSGD
from bigrate.metrics import Confusion
from tests.linear.test_sgd_estimators import blobs, write_dataset


@pytest.fixture(scope="module")
def dask_engine():
    from bigrate.engines.dask import DaskEngine

    eng = DaskEngine(n_workers=2, memory_limit="1GiB", dashboard=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    X, y = blobs(3, n=16000)
    return (
        write_dataset(tmp_path_factory.mktemp("d") / "ds", X, y, row_group_size=1000),
        X,
        y,
    )


def test_cluster_is_on_loopback(dask_engine):
    workers = dask_engine.workers()
    assert len(workers) == 2
    assert all(w.startswith("tcp://127.0.0.1:") for w in workers)
    assert dask_engine.client.scheduler.address.startswith("tcp://127.0.0.1:")


def test_two_workers_match_single_process(dask_engine, dataset):
    from bigrate.engines.dask import fit_dask

    ds, X, y = dataset
    params = dict(rho=0.05, epochs=6, random_state=0)
    single = NeymanPearsonSGD(**params).fit(ds)
    dist = fit_dask(NeymanPearsonSGD(**params), ds, dask_engine, progress=False)
    c1, c2 = (Confusion.of(y, m.decision_function(X)) for m in (single, dist))
    assert abs(c1.pfa - c2.pfa) < 0.02 and abs(c1.pnd - c2.pnd) < 0.05
    assert c2.pfa <= 0.07
    w1, w2 = single.coef_.ravel(), dist.coef_.ravel()
    assert w1 @ w2 / np.linalg.norm(w1) / np.linalg.norm(w2) > 0.95
    assert dist.engine_["workers"] == 2 and len(dist.history_) == 6
    # deterministic for a given seed and worker count
    again = fit_dask(NeymanPearsonSGD(**params), ds, dask_engine, progress=False)
    np.testing.assert_array_equal(again.coef_, dist.coef_)


def test_qvalue_on_dask(dask_engine, dataset):
    from bigrate.engines.dask import fit_dask

    ds, X, y = dataset
    m = fit_dask(
        QValueSGD(q=0.05, epochs=3, random_state=0), ds, dask_engine, progress=False
    )
    from bigrate.metrics import positives_at_q

    assert positives_at_q(y, m.decision_function(X), 0.05) > 0.3 * (y > 0).sum()


def test_worker_killed_mid_training_still_completes(dask_engine, dataset):
    from bigrate.engines.dask import fit_dask

    ds, X, y = dataset
    pids = dask_engine.worker_pids()
    victim = sorted(pids.values())[0]
    killed = []

    def on_round(r, eng):
        if r == 2 and not killed:  # kill during the next round's work
            threading.Timer(0.05, lambda: os.kill(victim, signal.SIGKILL)).start()
            killed.append(victim)

    m = fit_dask(
        NeymanPearsonSGD(rho=0.05, epochs=6, random_state=1),
        ds,
        dask_engine,
        progress=False,
        rounds_per_epoch=8,
        on_round=on_round,
    )
    assert killed
    c = Confusion.of(y, m.decision_function(X))
    assert c.pfa <= 0.07 and c.pnd < 0.6
    assert victim not in dask_engine.worker_pids().values()  # it really died
    dask_engine.client.wait_for_workers(2, timeout=60)  # the nanny restarts it


def test_existing_scheduler_address_and_fsspec_url(dask_engine, dataset):
    """Submit to a running scheduler by its address; workers read a file:// URL."""
    from bigrate import ShardedDataset
    from bigrate.engines.dask import DaskEngine, fit_dask

    ds, X, y = dataset
    url = "file://" + str(ds.path)
    address = dask_engine.client.scheduler.address
    with DaskEngine(address=address) as remote:
        assert remote.cluster is None and remote.workers() == dask_engine.workers()
        m = fit_dask(
            NeymanPearsonSGD(rho=0.1, epochs=2, random_state=0),
            ShardedDataset(url),
            remote,
            progress=False,
        )
    assert Confusion.of(y, m.decision_function(X)).pfa <= 0.13
