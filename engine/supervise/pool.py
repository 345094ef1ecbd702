"""A cluster's pool of slots and what of it is allocated (`ClusterPool`), counted by node and device rather
than by name, since the names of a cluster's slots are renumbered as nodes come and go (`resize`). A grant
takes a gang's slots from one node when one has them free (Ray's STRICT_PACK) else from as few nodes as hold
them (PACK), a rank's several GPUs from one node, and a share of a GPU from the fullest one with room. An
allocation on a node that left is swapped for a live slot when its pipeline starts again (`refit`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from ..hardware.grants import Request, merge_gpus
from ..hardware.slots import Slot
from .node_groups import kind_of, node_group, one_node


class ClusterPool:
    """A cluster's slots: those free, those allocated and the GPUs held for shares (see the module)."""

    def __init__(self, slots: list[Slot]):
        self.slots = list(slots)
        self._free = list(slots)
        self._taken: list[Slot] = []  # allocated now, possibly on a node no longer in the pool
        self._shared: list[tuple[Slot, float]] = []  # GPUs held for shares, and how full each is (0 to 1)

    @property
    def free(self) -> list[Slot]:
        return list(self._free)

    def grant(self, request: Request) -> list[Slot] | None:
        """The slots for `request` (one per rank), taken from the pool; None when too few are free. An
        elastic request takes as many ranks as are free, from its most down to its fewest."""
        if request.min_ranks is not None:
            for fixed in request.sizes():
                taken = self.grant(fixed)
                if taken is not None:
                    return taken
            return None
        if request.share is not None:
            return self._shares(request)
        gpu_pool = any(s.gpu is not None for s in self.slots)
        if request.gpus > 1 and gpu_pool:
            return self._gpus(request)
        taken = one_node(self._free, request.ranks)
        if taken is not None:
            self._free = [s for s in self._free if s not in taken]
            self._taken += taken
        return taken

    def release(self, slots: list[Slot]) -> None:
        """Give an allocation's slots back; a slot of a node that left is dropped."""
        for slot in slots:
            self._release_one(slot)
        self._recount()

    def resize(self, slots: list[Slot]) -> None:
        """The pool is now `slots` (nodes joined or left); allocations stay as they are."""
        self.slots = list(slots)
        self._recount()

    def refit(self, slots: list[Slot]) -> list[Slot] | None:
        """An allocation with each slot on a node that left swapped for a free live one; None if too few
        are free (the allocation is then left as it was)."""
        live = {kind_of(s) for s in self.slots}
        stale = [s for s in slots if kind_of(s) not in live]
        if not stale:
            return slots
        if any(s.share is not None or s.peers for s in slots):  # ranks of several GPUs, or shares: asked again
            self.release(slots)  # (held by nothing meanwhile when too few are free: the next try asks again)
            return self.grant(Request(ranks=len(slots), gpus=len(slots[0].gpus), share=slots[0].share))
        if len(slots) > 1:  # a gang: all of it moves, to one node with room for every rank or as few as hold it
            for slot in slots:  # its own live slots are free for it to move to
                self._taken.remove(slot)
            self._recount()
            out = one_node(self._free, len(slots))
            self._taken += slots if out is None else out
            self._recount()
            return out
        if len(stale) > len(self._free):
            return None
        fresh = iter(self._free[:len(stale)])
        out = [next(fresh) if kind_of(s) not in live else s for s in slots]
        for slot in stale:
            self._taken.remove(slot)
        self._taken += [s for s in out if s not in slots]
        self._recount()
        return out

    def take(self, slots: list[Slot]) -> None:
        """Count `slots`, granted by the ledger on this machine, as allocated: each once."""
        self._taken += slots

    def give(self, slots: list[Slot]) -> None:
        """Count `slots`, given back to the ledger on this machine, as allocated no more: each once."""
        for slot in slots:
            if slot in self._taken:
                self._taken.remove(slot)

    def _gpus(self, request: Request) -> list[Slot] | None:
        """Each rank's `request.gpus` GPUs from one node (Ray's num_gpus=N), the gang's ranks packed on as few
        nodes as hold them. A rank's slot is counted once per GPU it holds."""
        free, out = list(self._free), list[Slot]()
        for _ in range(request.ranks):
            group = node_group(free, request.gpus, prefer=out[-1].node if out else "")
            if group is None:
                return None
            free = [s for s in free if s not in group]
            out.append(merge_gpus(group))
        self._free = free
        for slot in out:
            self._taken += [slot] * len(slot.gpus)
        return out

    def _shares(self, request: Request) -> list[Slot] | None:
        """A fraction of one GPU for each rank (Ray's fractional num_gpus): on the fullest GPU already shared
        that has room, else on a whole free one, which is then held for shares until the last one ends."""
        assert request.share is not None
        shared: list[list[Any]] = [[slot, fill] for slot, fill in self._shared]  # [slot, fill]: fills grow in place
        free, out = list(self._free), list[Slot]()
        for _ in range(request.ranks):
            fits = [entry for entry in shared if entry[1] + request.share <= 1 + 1e-9
                    and all(entry[0] != replace(t, share=None) for t in out)]  # a GPU of its own for each rank
            if not fits:
                whole = next((s for s in free if s.gpu is not None), None)
                if whole is None:
                    return None
                free.remove(whole)
                # Counted by node, a free slot may bear the name of a GPU held for shares: take one that does not.
                names = {held.name for held, _ in shared}
                whole = next(s for s in self.slots if kind_of(s) == kind_of(whole) and s.name not in names)
                fits = [[whole, 0.0]]
                shared.append(fits[0])
            entry = max(fits, key=lambda e: e[1])  # the tightest fit: whole GPUs stay whole
            entry[1] += request.share
            out.append(replace(entry[0], share=request.share))
        self._taken += [s for s, _ in shared if all(s is not t for t, _ in self._shared)]
        self._shared = [(slot, fill) for slot, fill in shared]
        self._free = free
        return out

    def _release_one(self, slot: Slot) -> None:
        """Give one allocated slot back: a share to its GPU (freed with its last share), else the slot once
        for every GPU it holds."""
        if slot.share is not None:
            whole = replace(slot, share=None)
            for i, (held, fill) in enumerate(self._shared):
                if held == whole:
                    fill -= slot.share
                    self._shared[i] = (held, fill)
                    if fill <= 1e-9:
                        del self._shared[i]
                        self._taken.remove(held)
                    return
            return
        for _ in range(max(1, len(slot.gpus))):
            if slot in self._taken:
                self._taken.remove(slot)

    def _recount(self) -> None:
        """Free = the pool less what is allocated, counted per slot kind, in the pool's order."""
        used = Counter(kind_of(s) for s in self._taken)
        free = []
        for slot in self.slots:
            if used[kind_of(slot)] > 0:
                used[kind_of(slot)] -= 1
            else:
                free.append(slot)
        self._free = free
