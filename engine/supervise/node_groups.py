"""Which free slots a cluster's allocation takes: a gang's slots from one node when one has them (Ray's
STRICT_PACK) else from as few nodes as hold them (PACK), and a rank's several GPUs from one node. On this
machine every slot's node is "", so these rules change nothing.
"""
from __future__ import annotations

from collections.abc import Hashable

from ..hardware.slots import Slot


def kind_of(slot: Slot) -> Hashable:
    """What a slot is for counting: itself on this machine, its node and device on a cluster."""
    return slot if not slot.node else (slot.node, slot.device)


def one_node(free: list[Slot], need: int) -> list[Slot] | None:
    """The first `need` free slots of the first node (in pool order) that has that many free; else, on a
    cluster, the free slots of the fewest nodes, those with the most free first and grouped by node (rank 0's
    node first); None if too few are free.

    One slot may come from anywhere; more (a gang) share a node when one has room for all of them.
    """
    if need <= 1:
        return free[:need] if len(free) >= need else None
    by_node: dict[str, list[Slot]] = {}
    for slot in free:
        group = by_node.setdefault(slot.node, [])
        group.append(slot)
        if len(group) == need:
            return group
    if len(free) < need or "" in by_node:  # too few, or this machine's slots
        return None
    packed: list[Slot] = []
    for group in sorted(by_node.values(), key=len, reverse=True):
        packed += group[:need - len(packed)]
        if len(packed) == need:
            break
    return packed


def node_group(free: list[Slot], count: int, prefer: str = "") -> list[Slot] | None:
    """`count` free GPU slots of one node, of `prefer` when it has room (a gang's ranks stay together)."""
    by_node: dict[str, list[Slot]] = {}
    for slot in free:
        if slot.gpu is not None:
            by_node.setdefault(slot.node, []).append(slot)
    roomy = [group for node, group in by_node.items() if len(group) >= count]
    roomy.sort(key=lambda group: group[0].node != prefer)
    return roomy[0][:count] if roomy else None
