"""Following a cluster's nodes under a session: when nodes join or leave, the slots are planned again on the
devices of those alive (`NodeFollower.follow`), and an attempt whose slot's node left is given another slot
where one is free (`NodeFollower.refit`). A machine's devices never change, so there it does nothing.
"""
from __future__ import annotations

from ..config.schema import RunConfig
from ..hardware.devices import Inventory
from ..launch.backend import Backend, NoRoom
from .scheduler import Scheduler

NODE_REFRESH = 2.0  # seconds between looks at a cluster's nodes (Ray itself sees a node leave in ~2 s)


class NodeFollower:
    """Plans `scheduler`'s slots again whenever `backend`'s nodes change; `inventory` is the devices of now."""

    def __init__(self, backend: Backend, config: RunConfig, scheduler: Scheduler, inventory: Inventory):
        self._backend, self._config, self._scheduler = backend, config, scheduler
        self.inventory = inventory
        self._generation = 0  # of the cluster's nodes the slots were planned for (backend.follow)

    def follow(self, max_age: float = NODE_REFRESH) -> None:
        """Plan the slots again when nodes have joined or left (seen at most `max_age` seconds ago)."""
        generation = self._backend.follow(max_age)
        if generation != self._generation:
            self._generation = generation
            self.inventory = self._backend.inventory
            config = self._config
            slots, _ = self._backend.plan_slots(config.devices, self.inventory, config.source, fit=True)
            self._scheduler.resize(slots)

    def refit(self, slots: list) -> list:
        """`slots` for an attempt about to start, a slot on a node that left swapped for a free one (raises
        NoRoom when no live node has room)."""
        self.follow(NODE_REFRESH / 4)
        fitted = self._scheduler.refit(slots)
        if fitted is None:
            raise NoRoom(f"its slots' node left the cluster and no live node has room for {len(slots)} now")
        return fitted
