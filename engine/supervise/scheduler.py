"""The scheduler: a pool of device slots and a priority queue of pipelines waiting for some of them.

A pipeline asks for k slots (one for a single worker, N for a gang) and gets all k
at once or waits. The queue is served strictly in order (priority, then arrival):
nothing starts ahead of a waiting pipeline that needs more slots than are free, so
a big gang cannot be starved for ever by small pipelines slipping past it.

On a cluster the pool follows the nodes (`resize`): a slot is then counted by its node
and device, not by its name, since the names of a cluster's slots are renumbered as
nodes come and go; an allocation on a node that left is swapped for a live slot when
its pipeline starts again (`refit`). A gang's k slots come from one node when one has them
free (its collectives then never cross the network: Ray's STRICT_PACK), else from as few
nodes as hold them (Ray's PACK); on this machine every slot's node is "", so neither rule
changes anything.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable

from ..hardware.placement import Slot


def _kind(slot: Slot) -> Hashable:
    """What a slot is for counting: itself on this machine, its node and device on a cluster."""
    return slot if not slot.node else (slot.node, slot.device)


def _one_node(free: list[Slot], need: int) -> list[Slot] | None:
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


@dataclass(frozen=True)
class _Waiting:
    priority: int
    order: int
    need: int


class Scheduler:
    """Hands out allocations of slots to queued pipelines, highest priority first."""

    def __init__(self, slots: list[Slot]):
        self.slots = list(slots)
        self._free = list(slots)
        self._taken: list[Slot] = []  # allocated now, possibly on a node no longer in the pool
        self._waiting: dict[Hashable, _Waiting] = {}

    @property
    def free(self) -> list[Slot]:
        return list(self._free)

    def enqueue(self, key: Hashable, priority: int, order: int, need: int = 1) -> None:
        if need > len(self.slots):
            raise ValueError(f"{key} needs {need} slots; this session has {len(self.slots)}")
        self._waiting[key] = _Waiting(priority, order, need)

    def dequeue(self, key: Hashable) -> None:
        self._waiting.pop(key, None)

    def queued(self) -> list[Hashable]:
        """Waiting pipelines in the order they will start."""
        return sorted(self._waiting, key=lambda k: (-self._waiting[k].priority, self._waiting[k].order))

    def position(self, key: Hashable) -> int:
        """1 for the next to start; 0 if not waiting."""
        order = self.queued()
        return order.index(key) + 1 if key in self._waiting else 0

    def allocate(self) -> list[tuple[Hashable, list[Slot]]]:
        """Take slots for every waiting pipeline that can start now, in queue order."""
        granted = []
        for key in self.queued():
            need = self._waiting[key].need
            taken = _one_node(self._free, need)
            if taken is None:
                break  # strict order: the head waits for its k slots, nobody overtakes it
            self._free = [s for s in self._free if s not in taken]
            self._taken += taken
            del self._waiting[key]
            granted.append((key, taken))
        return granted

    def release(self, slots: list[Slot]) -> None:
        """Give slots back to the pool (kept in the machine's order); a slot of a node that left is dropped."""
        for slot in slots:
            if slot in self._taken:
                self._taken.remove(slot)
        self._refree()

    def resize(self, slots: list[Slot]) -> None:
        """The pool is now `slots` (a cluster's nodes joined or left); allocations stay as they are."""
        self.slots = list(slots)
        self._refree()

    def refit(self, slots: list[Slot]) -> list[Slot] | None:
        """An allocation with each slot on a node that left swapped for a free live one; None if too few
        are free (the allocation is then left as it was)."""
        live = {_kind(s) for s in self.slots}
        stale = [s for s in slots if _kind(s) not in live]
        if not stale:
            return slots
        if len(slots) > 1:  # a gang: all of it moves, to one node with room for every rank or as few as hold it
            for slot in slots:  # its own live slots are free for it to move to
                self._taken.remove(slot)
            self._refree()
            out = _one_node(self._free, len(slots))
            self._taken += slots if out is None else out
            self._refree()
            return out
        if len(stale) > len(self._free):
            return None
        fresh = iter(self._free[:len(stale)])
        out = [next(fresh) if _kind(s) not in live else s for s in slots]
        for slot in stale:
            self._taken.remove(slot)
        self._taken += [s for s in out if s not in slots]
        self._refree()
        return out

    def _refree(self) -> None:
        """Free = the pool less what is allocated, counted per slot kind, in the pool's order."""
        used = Counter(_kind(s) for s in self._taken)
        free = []
        for slot in self.slots:
            if used[_kind(slot)] > 0:
                used[_kind(slot)] -= 1
            else:
                free.append(slot)
        self._free = free
