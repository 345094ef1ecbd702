"""The scheduler: a priority queue of pipelines waiting for device slots, and the grants that start them.

A pipeline asks for a slot per rank (engine/hardware/grants.py: whole GPUs, a share of one, or a CPU slot)
and gets them all at once or waits, strictly in order (priority, then arrival), so a big gang is never
starved by small pipelines slipping past it. On this machine every grant is a lease in the user's ledger
(engine/hardware/ledger.py), so runs never double-book a device and the order holds across them; on a
cluster the grants come from its pool (`ClusterPool` in pool.py), counted by node as nodes come and go.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..config.schema import DevicesConfig
from ..hardware.grants import Holdings, Policy, Request, Wait, grant, leases_for
from ..hardware.ledger import Lease, MemoryLedger, Presence, Waiter
from ..hardware.occupancy import OccupancyReader
from ..hardware.slots import Slot
from ..launch.backend import Backend
from .pool import ClusterPool


def _devices(slot: Slot) -> set[str]:
    """The devices a slot holds, named as the ledger's leases name them ("gpu0", "cpu1")."""
    return {f"gpu{g.index}" for g in slot.gpus} or {slot.name}


@dataclass(frozen=True)
class _Waiting:
    priority: int
    order: int
    request: Request
    since: float  # wall-clock seconds it began to wait: the order across runs


class Scheduler:
    """Hands out allocations of slots to queued pipelines, highest priority first (see the module)."""

    def __init__(self, slots: list[Slot], ledger: MemoryLedger | None = None, run: str = "", run_dir: str = "",
                 occupancy: OccupancyReader | None = None, policy: Policy = Policy()):
        self.slots = list(slots)
        self._free = list(slots)  # on this machine: the slots no lease of any run holds
        self._pool = ClusterPool(slots)  # on a cluster: its accounting (this machine's grants are counted too)
        self._waiting: dict[str, _Waiting] = {}
        self._ledger = ledger if ledger is not None else MemoryLedger()
        self._run, self._run_dir, self._policy = run, run_dir, policy
        self._occupancy = occupancy
        self._held: dict[str, list[Lease]] = {}  # the ledger's leases of each allocation
        self._grants: dict[str, list[Slot]] = {}  # the slots of each allocation
        self.waits: dict[str, str] = {}  # why each waiting pipeline waits, as of the last pass
        self.short: dict[str, str] = {}  # an elastic gang granted fewer ranks than its most: what held the rest
        self._avoid: dict[str, dict[str, str]] = {}  # an elastic gang's devices granted to it no more, and why
        self._said: dict[str, str] = {}  # the waits changed_waits last handed out
        self._seen: list[Lease] = []  # every run's leases as of the last pass, with ours since
        self._announced: tuple[Waiter, ...] | None = None

    @classmethod
    def for_run(cls, backend: Backend, slots: list[Slot], run: str, run_dir: Path, devices: DevicesConfig) -> Scheduler:
        """The scheduler of a run on `backend`: its ledger, NVML's view of the slots' GPUs (if any), its policy."""
        reader = backend.occupancy() if any(s.gpu is not None for s in slots) else None
        return cls(slots, backend.ledger(), run, str(Path(run_dir).absolute()), reader,
                   Policy(devices.keep_free, devices.share))

    @property
    def free(self) -> list[Slot]:
        return self._pool.free if self.cluster else list(self._free)

    @property
    def cluster(self) -> bool:
        """The pool is a cluster's (Ray does the accounting; slots are counted by node)."""
        return any(s.node for s in self.slots)

    def enqueue(self, key: str, priority: int, order: int, need: int | Request = 1) -> None:
        request = need if isinstance(need, Request) else Request(ranks=need)
        if request.ranks > len(self.slots):
            raise ValueError(f"{key} needs {request.ranks} slots; this session has {len(self.slots)}")
        self._waiting[key] = _Waiting(priority, order, request, time.time())

    def dequeue(self, key: str) -> None:
        self._waiting.pop(key, None)
        self.waits.pop(key, None)
        if not self.cluster:
            self._announce()  # a run stopping its queue (shutdown) holds up no other run any more

    def queued(self) -> list[str]:
        """Waiting pipelines in the order they will start."""
        return sorted(self._waiting, key=lambda k: (-self._waiting[k].priority, self._waiting[k].order))

    def position(self, key: str) -> int:
        """1 for the next to start; 0 if not waiting."""
        order = self.queued()
        return order.index(key) + 1 if key in self._waiting else 0

    def allocate(self) -> list[tuple[str, list[Slot]]]:
        """Take slots for every waiting pipeline that can start now, in queue order."""
        if not self._waiting:
            self._announce()
            return []
        if self.cluster:
            return self._allocate_pool()
        granted = []
        with self._ledger.locked() as leases:
            ahead = self._ahead_elsewhere()
            occupancy, links = self._readings()
            for key in self.queued():
                waiting = self._waiting[key]
                first = ahead(waiting)
                pool, avoided = self._pool_for(key, waiting.request)
                got = Wait(f"waiting behind {first}") if first else \
                    grant(waiting.request, pool, leases, self._run, occupancy, links, self._policy)
                if isinstance(got, Wait):
                    self._wait_all(key, replace(got, why="; ".join([got.why, *avoided])) if not first else got)
                    break  # strict order: the head waits for what it needs, nobody overtakes it
                if len(got) < waiting.request.ranks:  # an elastic gang's smaller grant: say what held the rest
                    whole = grant(waiting.request.sizes()[0], pool, leases, self._run, occupancy, links,
                                  self._policy)
                    self.short[key] = self._short_of(waiting.request, len(got), whole, avoided)
                taken = leases_for(got, self._run, str(key), os.getpid(), self._run_dir)
                self._ledger.take(taken)
                leases = leases + taken
                self._held[key], self._grants[key] = taken, got
                self._pool.take(got)
                del self._waiting[key]
                self.waits.pop(key, None)
                granted.append((key, got))
        self._seen = leases
        self._refree_ledger(leases)
        self._announce()
        return granted

    def room(self, key: str, request: Request) -> int:
        """The ranks `request` (an elastic gang's) would be granted now were `key` to give its slots back; 0 while
        any pipeline waits for slots of this pool, of this run or another (what is free is theirs), and on a
        cluster (its gangs grow only at a restart)."""
        if self._waiting or self.cluster:
            return 0
        with self._ledger.locked() as leases:
            if self._rivals():
                return 0
            own = self._held.get(key, [])
            occupancy, links = self._readings()
            others = [lease for lease in leases if lease not in own]
            got = grant(request, self._pool_for(key, request)[0], others, self._run, occupancy, links, self._policy)
        return 0 if isinstance(got, Wait) else len(got)

    def _short_of(self, request: Request, got: int, whole: list[Slot] | Wait, avoided: list[str]) -> str:
        """"1 of 2 CPU slots free: cpu1 held by this run (urgent)": why an elastic grant is `got` ranks; what
        holds the rest, then the devices it is granted no more and why, when it has any."""
        gpu_pool = any(s.gpu is not None for s in self.slots)
        held = whole.held if isinstance(whole, Wait) else ""
        if avoided:
            return "; ".join(w for w in (held, *avoided) if w)
        return f"{got} of {request.label(gpu_pool)} free" + (f": {held}" if held else "")

    def avoid(self, key: str, slot: Slot, why: str, request: Request) -> str:
        """Grant `key` (an elastic gang asking `request`) none of `slot`'s devices again this session, `why` said
        where its grants are explained; "" when so, else why it may still be granted them: a gang the other
        slots could never give its fewest ranks would never start again, so it is granted them as before."""
        if self.cluster:
            return "on a cluster a gang's grants are not kept off a slot"
        before = self._avoid.get(key, {})
        self._avoid[key] = {**before, **{name: why for name in _devices(slot)}}
        if self._pool_for(key, request)[1]:
            return ""
        self._avoid[key] = before  # those it skipped already it goes on skipping
        low = request.sizes()[-1].ranks
        return f"the other slots cannot hold its {low} rank{'s' if low != 1 else ''} (its MIN)"

    def _pool_for(self, key: str, request: Request) -> tuple[list[Slot], list[str]]:
        """The slots `key` is granted from, and why any of the session's are left out: each once."""
        avoided = self._avoid.get(key)
        if not avoided:
            return self.slots, []
        pool = [s for s in self.slots if not avoided.keys() & _devices(s)]
        if isinstance(grant(request.sizes()[-1], pool, [], self._run, policy=self._policy), Wait):
            return self.slots, []  # even with all of them free it would wait for ever
        return pool, list(dict.fromkeys(avoided.values()))

    def changed_waits(self) -> list[tuple[str, str]]:
        """(pipeline, why) for each whose reason to wait changed since the last call: "" once it has none
        (granted, or waiting only behind this run's own pipelines)."""
        changed = [(k, "") for k in self._said if k not in self.waits]
        changed += [(k, why) for k, why in self.waits.items() if self._said.get(k) != why]
        self._said = dict(self.waits)
        return changed

    def release(self, slots: list[Slot], key: str | None = None) -> None:
        """Give slots back to the pool (kept in the machine's order), and `key`'s leases to the ledger; a slot
        of a node that left is dropped."""
        if self.cluster:
            self._pool.release(slots)
            return
        self._pool.give(slots)
        if key is None:  # the allocation these slots are
            key = next((k for k, got in self._grants.items() if got == list(slots)), None)
        if key is not None and key in self._held:
            self._grants.pop(key, None)
            given = self._held.pop(key)
            self._ledger.give_back(given)
            self._seen = [lease for lease in self._seen if lease not in given]
            self._refree_ledger(self._seen)

    def ledger_notices(self) -> list[str]:
        """What is wrong with the ledger's files, found since the last call: each bad file once."""
        return self._ledger.notices()

    def gpus_taken(self, indices: list[int], leases: list[Lease] | None = None) -> frozenset[int]:
        """Of the GPUs `indices`, those a lease of any run holds or another program uses now."""
        if leases is None:
            with self._ledger.locked() as now:
                return self.gpus_taken(indices, now)
        occupancy = self._occupancy.read(indices, self._supervisors()) if self._occupancy is not None else {}
        return Holdings(tuple(leases), occupancy).gpus_taken() & frozenset(indices)

    def lease_whole(self, index: int, holder: str) -> bool:
        """Lease GPU `index` whole to `holder` (the run's validator) unless it is taken (see `gpus_taken`)."""
        with self._ledger.locked() as leases:
            if index in self.gpus_taken([index], leases):
                return False
            self._ledger.take([Lease(f"gpu{index}", self._run, holder, pid=os.getpid(), run_dir=self._run_dir)])
        return True

    def close(self) -> None:
        """The session is over: every lease back to the ledger."""
        self._ledger.close()
        self._held.clear()
        if self._occupancy is not None:
            self._occupancy.close()

    # ------------------------------------------------------------ across runs

    def _ahead_elsewhere(self) -> Callable[[_Waiting], str]:
        """A test of a waiting pipeline: the first pipeline of another of the user's runs that waits ahead of
        it (higher priority, or the same and waiting longer), or ""."""
        others = self._rivals()

        def ahead(w: _Waiting) -> str:
            for entry, run in others:
                if entry.priority > w.priority or (entry.priority == w.priority and entry.since < w.since):
                    return f"{entry.pipeline} of run {run} (you, priority {entry.priority})"
            return ""
        return ahead

    def _rivals(self) -> list[tuple[Waiter, str]]:
        """(pipeline, run) of every other run's pipeline that waits for slots of this pool."""
        pool = {s.name for s in self.slots}
        return [(entry, s.run) for s in self._ledger.presences() if s.run != self._run for entry in s.waiting
                if entry.devices is None or pool & set(entry.devices)]  # one that waits for none of ours is no rival

    def _wait_all(self, head: str, wait: Wait) -> None:
        """Why the head of the queue waits, when something outside this run holds it up; the others wait
        behind it, and a run that waits for its own pipelines only is a queue, which `position` tells."""
        self.waits = {head: wait.why} if wait.outside else {}

    def _announce(self) -> None:
        """Tell the ledger (so other runs and `torchherd ls`) what of this run waits, when that changes."""
        pool = tuple(s.name for s in self.slots)
        waiting = tuple(Waiter(str(k), w.priority, w.since, self.waits.get(k, ""), pool)
                        for k, w in self._waiting.items())
        if waiting != self._announced:
            self._announced = waiting
            self._ledger.announce(Presence(run=self._run, pid=os.getpid(), run_dir=self._run_dir, waiting=waiting))

    def _readings(self) -> tuple[dict, dict]:
        """NVML's view of the pool's GPUs now (foreign processes, free memory) and their links; {} without GPUs."""
        indices = [s.gpu.index for s in self.slots if s.gpu is not None]
        if not indices or self._occupancy is None:
            return {}, {}
        return self._occupancy.read(indices, self._supervisors()), self._occupancy.links(indices)

    def _supervisors(self) -> set[int]:
        """The pids of every live run's supervisor (what descends from one is ours, not a foreign process)."""
        return {s.pid for s in self._ledger.presences()} | {os.getpid()}

    def _refree_ledger(self, leases: list[Lease]) -> None:
        """Free = the pool's slots no lease of any run holds (what the warm starter plans by)."""
        held = {lease.device for lease in leases}
        self._free = [s for s in self.slots if s.name not in held]

    # ------------------------------------------------------------ a cluster's pool

    def _allocate_pool(self) -> list[tuple[str, list[Slot]]]:
        granted = []
        gpu_pool = any(s.gpu is not None for s in self.slots)
        for key in self.queued():
            request = self._waiting[key].request
            taken = self._pool.grant(request)
            if taken is None:
                self._wait_all(key, Wait(f"waiting for {request.label(gpu_pool)}", outside=False))
                break  # strict order: the head waits for its k slots, nobody overtakes it
            del self._waiting[key]
            self.waits.pop(key, None)
            granted.append((key, taken))
        return granted

    def resize(self, slots: list[Slot]) -> None:
        """The pool is now `slots` (a cluster's nodes joined or left); allocations stay as they are."""
        self.slots = list(slots)
        self._pool.resize(self.slots)
        if not self.cluster and not self._held:
            self._free = self._pool.free

    def refit(self, slots: list[Slot]) -> list[Slot] | None:
        """An allocation with each slot on a node that left swapped for a free live one; None if too few
        are free (the allocation is then left as it was)."""
        if not self.cluster:
            return slots  # this machine's devices never leave
        return self._pool.refit(slots)
