"""The supervisor's side of telemetry: which processes to sample on which node, the sampler thread, and what
the newest sample says about a worker's GPU.

This machine's sampler reads /proc here; a pid on another node goes, keyed by that node's
id, to the backend's remote telemetry (engine/launch/ray/telemetry.py on Ray).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config.schema import TelemetryConfig
from ..launch.backend import Backend, Handle
from ..protocol.telemetry import TelemetrySnapshot
from ..telemetry.sampler import TelemetrySampler
from .pipeline import SupervisedPipeline

FULL = 0.95  # fraction of a GPU's memory in use above which a crash report mentions it
VALIDATOR = "(validator)"  # the validator's label in the pid map


def pid_maps(pipes: dict[str, SupervisedPipeline],
             validator: Handle | None) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """{label: pid} of the processes on this machine, and {node id: {label: pid}} of those on others."""
    pids: dict[str, int] = {}
    remote: dict[str, dict[str, int]] = {}
    for name, pipe in pipes.items():
        handle = pipe.handle
        if handle is not None:  # a gang's rank k shows as "name#k", on its own node
            for k, (node, node_id, pid) in enumerate(handle.placed):
                if pid:  # 0: a remote rank whose pid is not known yet
                    into = remote.setdefault(node_id, {}) if node else pids
                    into[name if k == 0 else f"{name}#{k}"] = pid
    if validator is not None:
        into = remote.setdefault(validator.node_id, {}) if validator.node else pids
        into[VALIDATOR] = validator.pid
    return pids, remote


def gpu_note(pipe: SupervisedPipeline, snapshot: TelemetrySnapshot | None) -> str:
    """The worker's GPU memory from the newest telemetry, when that GPU is nearly full."""
    gpu = pipe.slots[0].gpu if pipe.slots else None
    if gpu is None or snapshot is None:
        return ""
    for sample in snapshot.gpus:
        if sample.index == gpu.index and sample.mem_used is not None and sample.mem_total and \
                sample.mem_used / sample.mem_total >= FULL:
            return (f"; GPU {gpu.index} memory was full: {sample.mem_used / 2**30:.1f} of "
                    f"{sample.mem_total / 2**30:.1f} GiB used")
    return ""


class TelemetryFeed:
    """The pid maps the sampler thread reads, and the sampler itself once started."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}  # replaced whole on change: the sampler thread reads it
        self.remote: dict[str, dict[str, int]] = {}  # node id -> {label: pid}; replaced whole too
        self._sampler: TelemetrySampler | None = None

    def start(self, config: TelemetryConfig, backend: Backend, persist_path: Path,
              deliver: Callable[[TelemetrySnapshot], object]) -> None:
        """Sample every `config.interval` seconds on a thread; `deliver` is called on that thread."""
        self._sampler = TelemetrySampler(
            interval=config.interval, pids=lambda: self.pids, on_snapshot=deliver,
            persist_path=persist_path, persist_every=config.persist_every,
            extend=backend.remote_telemetry(lambda: self.remote))  # a cluster's other nodes
        self._sampler.start()

    def update(self, pipes: dict[str, SupervisedPipeline], validator: Handle | None) -> None:
        """Follow the workers and validator that run now."""
        pids, remote = pid_maps(pipes, validator)
        if pids != self.pids:
            self.pids = pids
        if remote != self.remote:
            self.remote = remote

    def stop(self) -> None:
        """Stop the sampler (blocking: call it off the loop)."""
        if self._sampler is not None:
            self._sampler.stop()
