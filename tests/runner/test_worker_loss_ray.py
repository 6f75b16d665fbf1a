"""A lost Ray worker at every phase of a job, and a lost Ray head: the Ray half of
test_worker_loss.py (its own file so that the test processes share the long ones)."""

import os
import signal

import pytest

from tests.runner.test_worker_loss import (
    PHASES,
    check_cluster_lost,
    check_phase,
    prep_data,
    start_ray,
    stop_group,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prep_data(tmp_path_factory)


@pytest.fixture(scope="module")
def ray_faulty(tmp_path_factory, data, short_tmp):
    d = tmp_path_factory.mktemp("ray-faults")
    fault_file = d / "fault"
    address, head = start_ray(fault_file, short_tmp / "faults")
    try:
        yield address, fault_file
    finally:
        stop_group(head, grace=3)


@pytest.mark.parametrize("phase", list(PHASES))
def test_ray_worker_lost_at_every_phase(tmp_path, data, ray_faulty, phase):
    address, fault_file = ray_faulty
    check_phase(tmp_path, data, "ray", address, fault_file, phase)


def test_lost_ray_head_says_how_to_resume(tmp_path, data, short_tmp):
    fault_file = tmp_path / "nofault"
    short = short_tmp / "lost"
    address, head = start_ray(fault_file, short / "1")
    procs = [head]
    try:

        def kill():
            os.killpg(head.pid, signal.SIGKILL)

        def restart():
            new, h2 = start_ray(fault_file, short / "2")
            procs.append(h2)
            return new

        check_cluster_lost(tmp_path, data, "ray", address, kill, restart, "Ray head")
    finally:
        for p in procs:
            stop_group(p, grace=2)
        import shutil

        shutil.rmtree(short, ignore_errors=True)
