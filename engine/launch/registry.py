"""The backends by their `[cluster] backend` name: the supervisor asks `backend_for(cluster, ...)` and never
names one.

A backend that needs a library of its own (Ray) is imported only when a config names it, so
`import torchherd.engine` never imports it. Adding a backend is one entry here.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config.schema import ClusterConfig
from .backend import Backend
from .process import ProcessLauncher

# Makes a session's backend from the config's [cluster] table, the runs folder (which a cluster's nodes
# must share) and the config file's path (for problems).
BackendFactory = Callable[[ClusterConfig, Path, str], Backend]


def _ray(cluster: ClusterConfig, runs_dir: Path, source: str) -> Backend:
    from .ray.launcher import RayLauncher  # imports Ray: only for a Ray config

    return RayLauncher(cluster, runs_dir, source)


BACKENDS: dict[str, BackendFactory] = {
    "local": lambda cluster, runs_dir, source: ProcessLauncher(warm_start=cluster.warm_start),
    "ray": _ray,
}


def backend_for(cluster: ClusterConfig, runs_dir: Path, source: str = "") -> Backend:
    """The backend `cluster.backend` names, ready to launch (raises ConfigError if it cannot start,
    as a Ray cluster that cannot be joined)."""
    return BACKENDS[cluster.backend](cluster, runs_dir, source)
