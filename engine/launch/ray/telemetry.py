"""Telemetry from the other nodes of a Ray cluster: one sampler actor per node that hosts workers.

The supervisor's `TelemetrySampler` reads only this machine. On a cluster, each
other node that runs a worker (or a validator) gets a `NodeSampler` actor pinned
to it, which runs the same sampling (`TelemetrySampler.sample_once`) for the pids
of that node's workers and that node's GPUs. `RemoteTelemetry.extend` is handed to
the local sampler as its `extend` hook: once a pass, on the sampler's thread, it
collects the answers that have arrived (ray.wait with timeout 0: it never waits on
a node), asks each node again, and merges the newest answers into the snapshot with
every row labelled by its node. A node's figures are therefore one pass older than
this machine's; a node that stops answering simply drops out when it has no workers.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from ...protocol.telemetry import TelemetrySnapshot

# (node id -> {row label: pid}) of the workers on nodes other than this one
RemotePids = dict[str, dict[str, int]]


class NodeSampler:
    """A Ray actor on one node: samples that node's GPUs and the given worker pids when asked."""

    def __init__(self) -> None:
        from ...telemetry.sampler import TelemetrySampler

        self._pids: dict[str, int] = {}
        # never started: each `sample` is one pass, so there is no thread and no telemetry.jsonl here
        self._sampler = TelemetrySampler(pids=lambda: self._pids)

    def sample(self, pids: dict[str, int]) -> TelemetrySnapshot:
        self._pids = dict(pids)
        return self._sampler.sample_once()


def merge(snapshot: TelemetrySnapshot, remote: dict[str, TelemetrySnapshot]) -> TelemetrySnapshot:
    """`snapshot` (this machine's) with the GPUs and processes of `remote` ({node label: its snapshot})
    appended, each row carrying its node's label. Host figures stay this machine's."""
    if not remote:
        return snapshot
    gpus, processes = list(snapshot.gpus), list(snapshot.processes)
    for label in sorted(remote):
        gpus += [dataclasses.replace(g, node=label) for g in remote[label].gpus]
        processes += [dataclasses.replace(p, node=label) for p in remote[label].processes]
    return dataclasses.replace(snapshot, gpus=tuple(gpus), processes=tuple(processes))


class RemoteTelemetry:
    """The driver's side: one `NodeSampler` per node in `pids()`, asked once a pass without waiting.

    `pids` is called from the sampler thread, so it must be cheap and thread-safe (the
    supervisor replaces its dict whole); `label` names a node for people. Everything
    else here is used only from the sampler thread.
    """

    def __init__(self, pids: Callable[[], RemotePids], label: Callable[[str], str], *, ray: Any = None,
                 actor_class: Any = None):
        if ray is None:  # tests hand a stand-in with the same few functions
            import ray
            import ray.util.scheduling_strategies  # loads it, used below as ray.util.scheduling_strategies
        self._ray = ray
        self._pids, self._label = pids, label
        self._actor_class = actor_class  # tests may hand their own; made on first use otherwise
        self._actors: dict[str, Any] = {}  # node id -> NodeSampler actor
        self._pending: dict[str, Any] = {}  # node id -> the ref of the call not answered yet
        self._latest: dict[str, TelemetrySnapshot] = {}  # node id -> its newest answer
        self._lock = threading.Lock()  # close() may come from another thread than extend()

    def extend(self, snapshot: TelemetrySnapshot) -> TelemetrySnapshot:
        """Collect the answers that have arrived, ask again, and merge the newest into `snapshot`."""
        with self._lock:
            wanted = self._pids()
            for node in [n for n in self._actors if n not in wanted]:  # its workers ended: so does its sampler
                self._drop(node)
            for node, pids in wanted.items():
                self._collect(node)
                if node not in self._pending:
                    self._pending[node] = self._actor(node).sample.remote(pids)
            return merge(snapshot, {self._label(n): s for n, s in self._latest.items() if n in wanted})

    def _collect(self, node: str) -> None:
        ref = self._pending.get(node)
        if ref is None or not self._ray.wait([ref], timeout=0)[0]:
            return
        del self._pending[node]
        try:
            self._latest[node] = self._ray.get(ref)
        except Exception:  # the actor (or its node) died: a new one is made on the next pass
            self._drop(node)

    def _actor(self, node: str) -> Any:
        if node not in self._actors:
            strategy = self._ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=False)
            if self._actor_class is None:
                self._actor_class = self._ray.remote(NodeSampler)
            # no CPU reserved: a pass takes milliseconds a second and must not take a worker's slot
            self._actors[node] = self._actor_class.options(
                num_cpus=0, max_restarts=0, scheduling_strategy=strategy).remote()
        return self._actors[node]

    def _drop(self, node: str) -> None:
        actor = self._actors.pop(node, None)
        self._pending.pop(node, None)
        self._latest.pop(node, None)
        if actor is not None:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # already gone with its node
                pass

    def close(self) -> None:
        """End every sampler actor (they would also end with this process, which owns them)."""
        with self._lock:
            for node in list(self._actors):
                self._drop(node)
