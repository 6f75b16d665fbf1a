"""Run a bigrate job on Dask workers started as SLURM jobs (pip install dask-jobqueue).

    python cluster/dask/jobqueue_slurm.py jobs/rcv1s_np_dask.toml --jobs 4

Each SLURM job runs one single-threaded worker with 8 GiB; the scheduler runs here, on the
login/submit node's private interface, and bigrate submits to its address.
"""

import argparse
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--queue", default=None)
    ap.add_argument("--interface", default=None, help="e.g. ib0 or eth0 (private network)")
    a = ap.parse_args()
    from dask_jobqueue import SLURMCluster

    cluster = SLURMCluster(cores=1, processes=1, memory="8GiB", walltime="12:00:00",
                           queue=a.queue, interface=a.interface)
    cluster.scale(jobs=a.jobs)
    try:
        rc = subprocess.call(["bigrate", "run", a.job, "--engine", "dask", "--address",
                              cluster.scheduler_address])
    finally:
        cluster.close()
    sys.exit(rc)


if __name__ == "__main__":
    main()
