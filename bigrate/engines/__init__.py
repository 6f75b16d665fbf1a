"""Engines run tasks; learners own their algorithms (see :mod:`bigrate.engines.base`).

``open_engine("local" | "dask" | "ray", address=None, ...)`` gives one engine behind the
same interface: the local engine runs tasks in this process; Dask and Ray start an
embedded cluster bound to 127.0.0.1, or connect to ``address``. Dask and Ray are imported
only when their engine is opened.
"""

from __future__ import annotations

from bigrate.engines.base import (
    DEFAULT_TIMEOUT,
    ClusterLost,
    Engine,
    EngineConnectError,
    TaskError,
)

ENGINES = ("local", "dask", "ray")

__all__ = [
    "DEFAULT_TIMEOUT",
    "ClusterLost",
    "ENGINES",
    "Engine",
    "EngineConnectError",
    "TaskError",
    "check_reachable",
    "open_engine",
]


def open_engine(
    name: str,
    address: str | None = None,
    *,
    n_workers: int | None = None,
    dashboard: bool = True,
    quiet: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    **kwargs,
) -> Engine:
    """An engine by name: ``"local"`` (this process), ``"dask"`` or ``"ray"`` (an
    embedded cluster on 127.0.0.1 with ``n_workers`` workers, or the cluster at
    ``address``, reached within ``timeout`` seconds or
    :class:`EngineConnectError`). Further keyword arguments go to the engine's
    constructor (Dask and Ray: ``worker_wait``; Dask: ``memory_limit``; local:
    ``threads``, tasks run at once on threads of this process, default 1)."""
    if name == "local":
        if address:
            raise ValueError(
                "engine 'local' takes no address (use 'dask' or 'ray' for a cluster)"
            )
        from bigrate.engines.local import LocalEngine

        kwargs.pop("worker_wait", None)  # its workers are this process's threads
        return LocalEngine(threads=kwargs.pop("threads", 1))
    if name == "dask":
        from bigrate.engines.dask import DaskEngine

        return DaskEngine(
            address or None, n_workers=n_workers, dashboard=dashboard, quiet=quiet,
            timeout=timeout, **kwargs,
        )  # fmt: skip
    if name == "ray":
        from bigrate.engines.ray import RayEngine

        return RayEngine(
            address or None, n_workers=n_workers, quiet=quiet, timeout=timeout,
            **kwargs,
        )  # fmt: skip
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {name!r}")


def check_reachable(name: str, address: str | None, timeout: float = DEFAULT_TIMEOUT):
    """Fail fast (:class:`EngineConnectError`) if the cluster at ``address`` cannot be
    reached or does not answer as that engine's cluster does (:func:`~bigrate.engines.
    base.probe_cluster`), before any work or run directory is made; no-op without an
    address."""
    from bigrate.engines.base import probe_cluster, wait_reachable

    if not address or name == "local":
        return
    if name == "dask":
        wait_reachable(address, 8786, timeout, "Dask scheduler")
    elif name == "ray":
        client = address.startswith("ray://")
        wait_reachable(address, 10001 if client else 6379, timeout,
                       "Ray client server" if client else "Ray cluster (GCS)")  # fmt: skip
    probe_cluster(name, address, timeout)
