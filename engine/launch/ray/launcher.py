"""The Ray launcher: each attempt of a worker (and the validator) is one Ray actor on a cluster node.

`RayLauncher.launch(spec)` starts a `ChildHost` actor (engine/launch/ray/actor.py) on the
node of the spec's slot, which runs the same child a local run does, and returns a
`RayHandle`. Slots are planned on the cluster's nodes (engine/launch/ray/placement.py), so
the scheduler chooses the node; `follow` tells the supervisor when nodes join or leave. The child
dials back to this process (engine/launch/ray/transport.py) with its attempt's token; status and
commands then flow over that connection with the framing of the local pipes, read on the event
loop by the code `ProcessHandle` reads pipes with (`RayHandle`, engine/launch/ray/handle.py).
Actors get no Ray-level restarts (the restart policy is torchherd's) and, owned by this process, die with it.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...config.problems import ConfigError, Problem
from ...config.schema import ClusterConfig, DevicesConfig, RunConfig
from ...hardware.ledger import MemoryLedger
from ...hardware.placement import ValidationPlan
from ...hardware.slots import Slot
from ...protocol.names import Intent
from ...protocol.spec import Transport, ValidatorSpec, write_spec
from ..backend import Backend, Handle, LaunchSpec, NoRoom, RemotePids, TelemetryHook
from ..environment import child_env
from .handle import RayHandle
from .placement import (
    ClusterInventory,
    NodeBook,
    cluster_inventory,
    plan_cluster_slots,
    plan_cluster_validation,
    read_nodes,
)
from .rundir import check_shared, remove_roots
from .transport import DialBackListener

if TYPE_CHECKING:
    from ray import ObjectRef

    from .telemetry import RemoteTelemetry

NAMESPACE = "torchherd"  # every actor torchherd starts is named in this Ray namespace
SHUTDOWN_WAIT = 2.0  # seconds an actor gets to end its child's process group before ray.kill
LAUNCH_FRESH = 0.5  # seconds: a launch trusts a look at the cluster's nodes this recent


def connect(cluster: ClusterConfig) -> None:
    """Join the cluster `cluster.address` names (or start a private one for "local"), once per process.

    Actor output never comes here: it would land on the app's screen. Each child writes its own log.
    """
    import logging

    import ray

    if ray.is_initialized():
        return
    address = None if cluster.address == "local" else cluster.address
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, include_dashboard=False,
             logging_level=logging.ERROR, configure_logging=True)
    if address is None:  # Ray's agents would outlive a SIGKILLed supervisor: a reaper ends them
        from .reaper import start_reaper

        start_reaper()


class RayLauncher(Backend):
    """The Ray backend: each attempt a Ray actor on a live node with room; see the module docstring."""

    def __init__(self, cluster: ClusterConfig, runs_dir: Path | None = None, file: str = ""):
        """Join the cluster and, with `runs_dir`, prove every node shares it; ConfigError otherwise."""
        import ray

        try:
            connect(cluster)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError([Problem(file, "cluster.address", f"cannot join the Ray cluster at "
                                       f"{cluster.address!r}: {exc}")]) from None
        self._ray = ray
        self.driver_node = ray.get_runtime_context().get_node_id()
        nodes = read_nodes(ray.nodes())
        if runs_dir is not None:
            problems = check_shared(Path(runs_dir), nodes, file)
            if problems:
                raise ConfigError(problems)
        self.book = NodeBook(cluster_inventory(nodes))
        self._looked = time.monotonic()  # when ray.nodes() was last read
        self.listener = DialBackListener(ray.util.get_node_ip_address())
        self._actor_class: Any = None  # ray.remote(ChildHost), made at the first launch
        self._ending: list[tuple[Any, Any, float]] = []  # (actor, shutdown ref, deadline)
        self._telemetry: RemoteTelemetry | None = None  # the other nodes' samplers, once the supervisor asks for them

    @property
    def inventory(self) -> ClusterInventory:
        return self.book.inventory

    def ledger(self) -> MemoryLedger:
        return MemoryLedger()  # Ray's own accounting is the cluster's ledger: no second one of ours

    def occupancy(self) -> None:
        return None

    # Both plan on the inventory this backend's inventory() made, a cluster's: narrower than Backend's.
    def plan_slots(self, devices: DevicesConfig, inventory: ClusterInventory,  # type: ignore[override]
                   file: str = "", fit: bool = False) -> tuple[list[Slot], list[Problem]]:
        return plan_cluster_slots(devices, inventory, file, fit)

    def plan_validation(self, config: RunConfig, slots: list[Slot],  # type: ignore[override]
                        inventory: ClusterInventory) -> ValidationPlan:
        return plan_cluster_validation(config, slots, inventory)

    def node_label(self, node: str) -> str:
        return self.inventory.label(node)

    def label(self, node_id: str) -> str:
        """How a node is shown: "" for the one this process runs on."""
        return "" if node_id == self.driver_node else self.inventory.label(node_id)

    def refresh(self) -> list[str]:
        """Re-read the cluster's live nodes; returns the labels of those that left since last time."""
        self._looked = time.monotonic()
        return self.book.refresh(read_nodes(self._ray.nodes()))

    def follow(self, max_age: float) -> int:
        """The cluster's node generation, re-read first if the last look is older than `max_age` seconds.

        One GCS round trip (milliseconds) when it looks: the supervisor asks every few seconds, not
        every tick, and compares the generation to know when to plan its slots again.
        """
        if time.monotonic() - self._looked >= max_age:
            self.refresh()
        return self.book.generation

    def rendezvous(self, node: str) -> tuple[str, int]:
        """MASTER_ADDR and a held MASTER_PORT for a gang whose ranks all run on `node` (engine/launch/ray/gang.py)."""
        from .gang import rendezvous

        self.follow(LAUNCH_FRESH)  # a node may have left since the last look
        return rendezvous(self._ray, self.inventory, self.driver_node, node)

    def launch(self, spec: LaunchSpec) -> RayHandle:
        handle, start = self._create(spec)
        start()
        return handle

    def launch_ranks(self, specs: list[LaunchSpec]) -> list[Handle]:
        """A gang's ranks, an actor each on the gang's node. On GPUs Ray picks each rank actor's GPU and sets
        its CUDA_VISIBLE_DEVICES; every rank's child then sees all of the gang's, in rank order, so its own
        is cuda:LOCAL_RANK, as under torchrun. On CPUs each rank starts as `launch` starts it."""
        if not any(spec.gang_gpus for spec in specs):
            return super().launch_ranks(specs)
        made: list[tuple[RayHandle, Callable[..., None]]] = []
        try:
            for spec in specs:
                made.append(self._create(spec))
        except BaseException:  # no actor may be left holding a GPU
            for handle, _ in made:
                handle.close()
            raise
        # Only each actor knows the GPU Ray gave it: each child's start waits (in its actor) for all of them.
        gpus = [handle.actor.visible_gpus.remote() for handle, _ in made]
        for spec, (_, start) in zip(specs, made):  # a gang over several nodes: each sees its own node's
            start([gpu for peer, gpu in zip(specs, gpus) if peer.node == spec.node])
        return [handle for handle, _ in made]

    def _create(self, spec: LaunchSpec) -> tuple[RayHandle, Callable[..., None]]:
        """The actor of one attempt, created on its node and holding its room there, and the call that starts
        its child: `start()`, or for a GPU gang's rank `start(refs)` with every rank actor's GPU."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._reap_ending()
        child = spec.child
        self.follow(LAUNCH_FRESH)  # a node may have left since the last look
        kind, amount, node, env, root = self._place(spec)
        key = self._actor_key(spec, node)
        handle = RayHandle(self, key, child.name, None, node, self.label(node))
        handle.token = self.listener.expect(handle.connected)
        transport = Transport(address=self.listener.address, token=handle.token)
        spec_path = write_spec(spec.log_path.parent / f"{child.stem}.json", child, transport)
        try:
            actor = self._actor().options(
                name=key, namespace=NAMESPACE, max_restarts=0, max_task_retries=0,
                num_cpus=amount if kind == "cpu" else 0, num_gpus=amount if kind == "cuda" else 0,
                # Hard affinity: a dead node fails it at once. It waits while the node is busy: the actor of
                # the attempt before may still be giving its CPUs back.
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote()
        except ValueError as exc:  # a live actor of that name: another supervisor runs this run
            self.listener.forget(handle.token)
            raise OSError(f"cannot start {key} on the cluster: {exc}") from None
        handle.actor = actor
        self.book.hold(key, node, kind, amount)
        header = f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt {child.attempt} on " \
                 f"{self.inventory.label(node)} (Ray) ====\n"

        def start(gang_gpus: list[ObjectRef[str]] | None = None) -> None:
            handle.started(actor.start.remote(spec.module, str(spec_path), str(spec.log_path), env, os.getcwd(),
                                              header, root, isinstance(child, ValidatorSpec), gang_gpus),
                           actor.wait.remote())

        return handle, start

    def _place(self, spec: LaunchSpec) -> tuple[str, float, str, dict[str, str], str]:
        """Where an attempt's actor goes and what it reserves there: (resource kind, amount, node id, the
        child's environment, the snapshot root its actor makes on that node or "")."""
        child = spec.child
        home = self.inventory.home(spec.gpu_index) if spec.gpu_index is not None else None
        if isinstance(child, ValidatorSpec):
            # Not a slot: it shares a node (and its GPU) as it shares this machine locally. One per node
            # (spec.node) when snapshots stay on their workers' nodes.
            node = spec.node or (home[0] if home and self.book.alive(home[0]) else self.driver_node)
            if spec.node and not self.book.alive(node):
                raise NoRoom(f"node {self.inventory.label(node)} has left the cluster")
            # its home GPU's index on its node (Ray's count there), or none
            env = child_env(spec.env, child.threads, (home[1],) if home else (), pci_order=False)
            # its own node's snapshot root; the one on this node is the supervisor's, made already
            return "cpu", 0, node, env, child.snapshot_root if spec.node else ""
        # cuda: Ray picks the node's GPUs (a rank's gpus_per_rank, or a fraction of one) and sets
        # CUDA_VISIBLE_DEVICES for them (a gang's ranks then see every rank's: launch_ranks)
        kind, amount = ("cuda", spec.gpu_share or len(spec.own_gpus) or 1) if spec.gpu_index is not None \
            else ("cpu", child.threads)
        node = spec.node or self.book.choose(kind, amount, prefer=home[0] if home else "")
        if not self.book.alive(node):  # the scheduler's slot is on a node that just left
            raise NoRoom(f"node {self.inventory.label(node)} of its slot has left the cluster")
        env = child_env(spec.env, child.threads, (), gpu_set_by_host=kind == "cuda")
        # a worker may start on a node before that node's validator has made the root
        root = str(Path(child.snapshot_dir).parent) if child.snapshot_dir and spec.node else ""
        return kind, amount, node, env, root

    @staticmethod
    def _actor_key(spec: LaunchSpec, node: str) -> str:
        """The actor's name in the namespace: one per attempt (and rank), or per node for a validator."""
        child = spec.child
        run_id = Path(spec.log_path).parent.parent.name
        if isinstance(child, ValidatorSpec):
            # one validator per node
            return f"{run_id}/{child.name}@{node[:12]}/{child.attempt}" if spec.node else \
                f"{run_id}/{child.name}/{child.attempt}"
        key = f"{run_id}/{child.name}/{child.attempt}"
        return key + f"/rank{child.rank}" if child.rank else key  # a gang's other ranks: an actor each

    def _actor(self) -> Any:
        if self._actor_class is None:
            from .actor import ChildHost

            self._actor_class = self._ray.remote(ChildHost)
        return self._actor_class

    def why_lost(self, handle: RayHandle, exc: BaseException) -> str:
        """People's words for an actor that died without its child reporting an exit."""
        gone = self.refresh()
        where = self.inventory.label(handle.node_id) if self.book.alive(handle.node_id) else None
        if where is None:
            handle.cause = Intent.NODE_LEFT
            return f"node {handle.node or 'of the supervisor'} left the cluster; the attempt on it is lost " \
                   "and starts again on a live node (no restart spent)"
        return f"the Ray actor of this attempt died ({type(exc).__name__})" + \
            (f"; nodes that left: {', '.join(gone)}" if gone else "")

    def ended(self, handle: RayHandle) -> None:
        """The attempt is over: its token dies, its room frees and its actor ends (after its process group)."""
        self.listener.forget(handle.token)
        self.book.release(handle.key)
        if handle.actor is not None:
            try:
                ref = handle.actor.shutdown.remote()
            except Exception:  # the actor is already gone
                ref = None
            self._ending.append((handle.actor, ref, time.monotonic() + SHUTDOWN_WAIT))
            try:  # the actor normally ends itself; this is for one that does not
                asyncio.get_running_loop().call_later(SHUTDOWN_WAIT, self._reap_ending)
            except RuntimeError:  # no loop: the next launch or close() reaps it
                pass

    def _reap_ending(self, wait: bool = False) -> None:
        """ray.kill the actors whose shutdown finished (or ran out of time), without blocking the loop."""
        now, left = time.monotonic(), []
        for actor, ref, deadline in self._ending:
            done = ref is None or bool(self._ray.wait([ref], timeout=0)[0])
            if done or now >= deadline or wait:
                if wait and not done:
                    self._ray.wait([ref], timeout=max(0.0, deadline - now))
                try:
                    self._ray.kill(actor, no_restart=True)  # ended already, normally: then a no-op
                except Exception:
                    pass
            else:
                left.append((actor, ref, deadline))
        self._ending = left

    def remove_roots(self, roots: dict[str, str]) -> None:
        """Free the snapshot roots {node id: path} on their nodes (blocking: call it off the loop)."""
        remove_roots({node: path for node, path in roots.items() if self.book.alive(node)})

    def remote_telemetry(self, pids: RemotePids) -> TelemetryHook:
        """The other nodes' telemetry for the supervisor's sampler: `pids()` gives {node id: {label: pid}}
        (engine/launch/ray/telemetry.py)."""
        from .telemetry import RemoteTelemetry

        self._telemetry = RemoteTelemetry(pids, self.inventory.label)
        return self._telemetry.extend

    def close(self) -> None:
        """End every actor still ending and stop listening (the session is over)."""
        if self._telemetry is not None:
            self._telemetry.close()
        self._reap_ending(wait=True)
        self.listener.close()
