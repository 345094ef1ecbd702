"""The scheduler: a pool of device slots and a priority queue of pipelines waiting for some of them.

A pipeline asks for k slots (one for a single worker, N for a gang) and gets all k
at once or waits. The queue is served strictly in order (priority, then arrival):
nothing starts ahead of a waiting pipeline that needs more slots than are free, so
a big gang cannot be starved for ever by small pipelines slipping past it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from torchherd.engine.placement import Slot


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
            if need > len(self._free):
                break  # strict order: the head waits for its k slots, nobody overtakes it
            taken, self._free = self._free[:need], self._free[need:]
            del self._waiting[key]
            granted.append((key, taken))
        return granted

    def release(self, slots: list[Slot]) -> None:
        """Give slots back to the pool (kept in the machine's order)."""
        self._free.extend(slots)
        self._free.sort(key=self.slots.index)
