"""Start a Dask cluster over SSH on your own machines and run a bigrate job on it.

    python cluster/dask/ssh_cluster.py jobs/rcv1s_np_dask.toml node1 node2 node3

The first host runs the scheduler, the others one single-threaded worker a core. Every
host needs the same Python environment (pip install bigrate) and the data path (shared
file system or an fsspec URL). Uses asyncssh (pip install asyncssh).
"""

import subprocess
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    job, hosts = sys.argv[1], sys.argv[2:]
    from dask.distributed import SSHCluster

    cluster = SSHCluster(hosts, worker_options={"nthreads": 1, "memory_limit": "8GiB"},
                         scheduler_options={"port": 8786, "dashboard_address": ":8787"})
    try:
        rc = subprocess.call(["bigrate", "run", job, "--engine", "dask", "--address",
                              cluster.scheduler_address])
    finally:
        cluster.close()
    sys.exit(rc)


if __name__ == "__main__":
    main()
