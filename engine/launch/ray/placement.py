"""Placement on a Ray cluster: its nodes' GPUs and CPUs as torchherd's inventory and slots, and the book
of which node has room for the next attempt as nodes join and leave.

torchherd's scheduler still decides who starts when (priority, then arrival); this module only
turns the cluster into slots, refuses up front what no node could ever host (Ray would leave such
an actor pending without a word), and picks a live node with room for each attempt.
Nothing here imports Ray: `read_nodes` takes what `ray.nodes()` returned.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...config.problems import Problem
from ...config.schema import DevicesConfig, RunConfig
from ...hardware.devices import GpuInfo, Inventory
from ...hardware.placement import ValidationPlan, plan_validation
from ...hardware.slots import Slot
from ...protocol.names import ValidationMode
from ..backend import NoRoom


@dataclass(frozen=True)
class ClusterNode:
    """One live node of the cluster as torchherd uses it."""

    node_id: str  # Ray's hex node id
    host: str
    ip: str
    cpus: int
    gpus: int
    label: str = ""  # how people see it: the host name, with the id's start where hosts repeat


def read_nodes(raw: list[dict[str, Any]]) -> list[ClusterNode]:
    """The live nodes in `ray.nodes()`'s answer, in its order, each with a label people can tell apart."""
    alive = [n for n in raw if n.get("Alive")]
    hosts = Counter(n.get("NodeManagerHostname", "") for n in alive)
    out = []
    for n in alive:
        res, host, node_id = n.get("Resources", {}), n.get("NodeManagerHostname", ""), n["NodeID"]
        label = host if hosts[host] == 1 else f"{host}/{node_id[:6]}"
        out.append(ClusterNode(node_id, host, n.get("NodeManagerAddress", ""), int(res.get("CPU", 0)),
                               int(res.get("GPU", 0)), label))
    return out


@dataclass(frozen=True)
class ClusterInventory(Inventory):
    """A cluster as an inventory: its GPUs numbered across nodes (node by node), its CPUs summed."""

    nodes: tuple[ClusterNode, ...] = ()
    gpu_homes: tuple[tuple[str, int], ...] = field(default=())  # per GPU index: (node id, index on that node)

    def home(self, gpu_index: int) -> tuple[str, int] | None:
        return self.gpu_homes[gpu_index] if 0 <= gpu_index < len(self.gpu_homes) else None

    def label(self, node_id: str) -> str:
        return next((n.label for n in self.nodes if n.node_id == node_id), node_id[:6])


def cluster_inventory(nodes: list[ClusterNode]) -> ClusterInventory:
    gpus: list[GpuInfo] = []
    homes: list[tuple[str, int]] = []
    for node in nodes:
        for local in range(node.gpus):
            # Ray reports no GPU model, memory or UUID: only how many a node has.
            gpus.append(GpuInfo(index=len(gpus), name=f"GPU {local} of {node.label}", uuid="", memory_total=0))
            homes.append((node.node_id, local))
    note = "" if gpus else f"no GPU on the cluster's {len(nodes)} node(s); using CPU slots"
    return ClusterInventory(gpus=tuple(gpus), cpu_count=sum(n.cpus for n in nodes), note=note,
                            nodes=tuple(nodes), gpu_homes=tuple(homes))


def plan_cluster_slots(devices: DevicesConfig, inventory: ClusterInventory, file: str = "",
                       fit: bool = False) -> tuple[list[Slot], list[Problem]]:
    """The slots `devices` asks for on the cluster, or why the cluster can never host them.

    With `fit` (the cluster changed under a running session) it gives what the live nodes hold of
    them instead: fewer CPU slots, or only the listed GPUs that still exist, and no problems.
    """
    threads = devices.threads_per_worker
    placement = devices.placement
    if isinstance(placement, list):
        slots, problems = [], []
        for i, index in enumerate(placement):
            home = inventory.home(index)
            if home is None and fit:
                continue
            if home is None:
                have = ", ".join(f"{g.index} ({g.name})" for g in inventory.gpus) or "none"
                problems.append(Problem(file, f"devices.placement[{i}]",
                                        f"the cluster has no GPU {index} (its GPUs: {have})"))
                continue
            slots.append(Slot(f"gpu{index}", "cuda", inventory.gpus[index], threads, node=home[0]))
        return slots, problems
    if placement == "auto" and inventory.gpus:
        return [Slot(f"gpu{g.index}", "cuda", g, threads, node=inventory.gpu_homes[g.index][0])
                for g in inventory.gpus], []
    room = {n.node_id: n.cpus // threads for n in inventory.nodes}
    total = sum(room.values())
    if fit:
        devices = devices.model_copy(update={"cpu_slots": "auto" if devices.cpu_slots == "auto"
                                             else min(devices.cpu_slots, total)})
    if total == 0 and fit:
        return [], []
    if total == 0:
        biggest = max((n.cpus for n in inventory.nodes), default=0)
        return [], [Problem(file, "devices.threads_per_worker",
                            f"{threads} threads per worker, but no node of the cluster has that many CPUs "
                            f"(the largest has {biggest})")]
    count = total if devices.cpu_slots == "auto" else devices.cpu_slots
    if count > total:
        return [], [Problem(file, "devices.cpu_slots",
                            f"{count} CPU slots of {threads} thread(s), but the cluster has room for {total} "
                            f"({', '.join(f'{n.label}: {room[n.node_id]}' for n in inventory.nodes)}); "
                            "lower it or use 'auto'")]
    # Node by node in turn, so that the first free slots, which the scheduler hands out first, spread.
    order: list[str] = []
    taken: Counter[str] = Counter()
    while len(order) < count:
        for node in inventory.nodes:
            if taken[node.node_id] < room[node.node_id] and len(order) < count:
                taken[node.node_id] += 1
                order.append(node.node_id)
    return [Slot(f"cpu{i}", "cpu", None, threads, node=node) for i, node in enumerate(order)], []


def plan_cluster_validation(config: RunConfig, slots: list[Slot], inventory: ClusterInventory) -> ValidationPlan:
    """Where validation runs on the cluster: as on one machine for a one-node cluster; on several nodes, a
    validator on each node that hosts validated workers, or inline when no core is spare."""
    v = config.validation
    nodes = len(inventory.nodes)
    if v.mode in (ValidationMode.OFF, ValidationMode.INLINE) or nodes <= 1:
        return plan_validation(config, slots, inventory)
    # Snapshots live in the shared memory of the worker's node, out of reach of a validator on
    # another (and the object store drops a snapshot with the worker that put it): one validator
    # per node, on its CPU, sharing the node as the local validator shares this machine.
    busy = sum(s.threads for s in slots if s.gpu is None)
    if v.mode == ValidationMode.BACKGROUND or inventory.cpu_count > busy or any(s.gpu is not None for s in slots):
        return ValidationPlan(ValidationMode.BACKGROUND, "cpu", None, v.threads, f"a validator on each of {nodes} "
                              "cluster nodes that hosts validated workers", per_node=True)
    return ValidationPlan(ValidationMode.INLINE, "", None, v.threads,
                          f"no spare core on the cluster ({busy} of {inventory.cpu_count} train)")


class NodeBook:
    """Which node each live attempt holds room on, and which live node has room for the next one."""

    def __init__(self, inventory: ClusterInventory):
        self.inventory = inventory
        self.generation = 0  # counts changes of the set of live nodes
        self._held: dict[str, tuple[str, str, float]] = {}  # attempt key -> (node id, "cpu"/"cuda", amount)

    def refresh(self, nodes: list[ClusterNode]) -> list[str]:
        """Take the cluster's live nodes now; returns the labels of the nodes that left."""
        before = {n.node_id: n.label for n in self.inventory.nodes}
        self.inventory = cluster_inventory(nodes)
        alive = {n.node_id for n in nodes}
        if alive != set(before):
            self.generation += 1
        return [label for node_id, label in before.items() if node_id not in alive]

    def alive(self, node_id: str) -> bool:
        return any(n.node_id == node_id for n in self.inventory.nodes)

    def _used(self, node_id: str, kind: str) -> float:
        return sum(amount for node, k, amount in self._held.values() if node == node_id and k == kind)

    def choose(self, kind: str, amount: float, prefer: str = "") -> str:
        """The node for an attempt needing `amount` CPUs (kind "cpu") or GPUs ("cuda"): `prefer` when it
        is alive with room, else the live node with the most room. Raises NoRoom."""
        def room(node: ClusterNode) -> float:
            return (node.cpus if kind == "cpu" else node.gpus) - self._used(node.node_id, kind)

        fits = [n for n in self.inventory.nodes if room(n) >= amount]
        preferred = [n for n in fits if n.node_id == prefer]
        if preferred:
            return preferred[0].node_id
        if not fits:
            what = f"{amount:g} free CPU(s)" if kind == "cpu" else f"{amount:g} free GPU(s)"
            raise NoRoom(f"no live node of the cluster has {what} now "
                         f"({len(self.inventory.nodes)} node(s): "
                         + ", ".join(f"{n.label} {room(n):g}" for n in self.inventory.nodes) + ")")
        return max(fits, key=room).node_id

    def hold(self, key: str, node_id: str, kind: str, amount: float) -> None:
        self._held[key] = (node_id, kind, amount)

    def release(self, key: str) -> None:
        self._held.pop(key, None)
