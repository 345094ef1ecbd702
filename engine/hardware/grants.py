"""Granting one pipeline's request from this machine's devices, given the ledger's leases and what NVML sees.

`grant` is the whole decision, with no I/O: a `Request` (ranks, and per rank whole GPUs or a share of one
GPU's memory, or a CPU slot) against the session's pool of devices, every run's leases, the foreign
processes on each GPU and the links between GPUs. It returns one slot per rank, or a `Wait` saying what
holds the devices it needs.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from ..config.schema import Pipeline
from ..config.units import memory_bytes
from .ledger import Lease
from .occupancy import SYSTEM, Foreign, GpuOccupancy
from .slots import Slot

GiB = 2**30
THIS_RUN = "(this run)"  # the run id a plan made before its run exists grants as


def gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.1f} GiB"


@dataclass(frozen=True)
class Request:
    """What a pipeline asks for: `ranks` processes, each with `gpus` whole GPUs or `memory` bytes of one."""

    ranks: int = 1
    gpus: int = 1  # whole GPUs per rank (GPU pools only)
    memory: int | None = None  # bytes of one GPU per rank, shared with others; None: whole GPUs
    share: float | None = None  # a fraction of one GPU per rank where GPU memory is not known (a Ray cluster)
    min_ranks: int | None = None  # an elastic gang: any size from this to `ranks` will do; None: `ranks` exactly

    def sizes(self) -> list[Request]:
        """The fixed requests it may be granted as, largest first (itself alone when it is not elastic)."""
        low = self.ranks if self.min_ranks is None else self.min_ranks
        return [replace(self, ranks=n, min_ranks=None) for n in range(self.ranks, low - 1, -1)]

    def label(self, gpu_pool: bool) -> str:
        """"2 GPUs", "a 6.0 GiB share of a GPU", "2 CPU slots"... for what a pipeline waits for."""
        if not gpu_pool:
            return f"{self.ranks} CPU slot{'s' if self.ranks != 1 else ''}"
        if self.memory is not None or self.share is not None:
            each = f"{gib(self.memory)} of a GPU" if self.memory is not None else f"{self.share:g} of a GPU"
            return each if self.ranks == 1 else f"{each} for each of {self.ranks} ranks"
        count = self.ranks * self.gpus
        return f"{count} GPU{'s' if count != 1 else ''}" + (f" ({self.gpus} per rank)" if self.gpus > 1 else "")


@dataclass(frozen=True)
class Policy:
    """How this run shares GPUs with others ([devices] keep_free and share)."""

    keep_free: int = 0  # GPUs left wholly free for others
    share: Literal["memory", "exclusive"] = "memory"  # "exclusive": never a GPU a foreign process uses


@dataclass(frozen=True)
class Wait:
    """The request cannot be granted now: why, for people."""

    why: str
    outside: bool = True  # something outside this run holds it up (another run, another program, keep_free)
    held: str = ""  # what holds the devices: "cpu1 held by this run (urgent)"; "" when not said


@dataclass(frozen=True)
class Holdings:
    """What others hold on this machine now: every run's leases, the foreign processes NVML sees on each GPU
    (by NVML index) and the links between GPUs."""

    leases: tuple[Lease, ...] = ()
    occupancy: dict[int, GpuOccupancy] = field(default_factory=dict)
    links: dict[tuple[int, int], int] = field(default_factory=dict)
    notices: tuple[str, ...] = ()  # files of the ledger skipped as none torchherd wrote, for people

    def gpus_taken(self) -> frozenset[int]:
        """The GPUs (NVML indices) a lease of any run holds or a foreign process uses."""
        names = {lease.device for lease in self.leases}
        leased = {int(name[3:]) for name in names if name.startswith("gpu") and name[3:].isdigit()}
        return frozenset(leased | {i for i, occ in self.occupancy.items() if occ.foreign})


def held_lines(pool: list[Slot], held: Holdings, run: str = THIS_RUN) -> list[str]:
    """"held now: cpu0 by run R (you)" lines for the devices of `pool` that a lease or a foreign process holds."""
    lines = []
    for slot in pool:
        who = [holder(lease, run) + (f", {gib(lease.memory)}" if lease.memory is not None else "")
               for lease in held.leases if lease.device == slot.name]
        occ = held.occupancy.get(slot.gpu.index) if slot.gpu is not None else None
        who += [f.describe() for f in (occ.foreign if occ is not None else ())]
        if who:
            lines.append(f"{slot.name} held now by " + "; ".join(dict.fromkeys(who)))
    return lines


def holder(lease: Lease, run: str) -> str:
    """Who holds a lease, for people: a pipeline of this run, or another run of yours."""
    return f"{lease.pipeline} of this run" if lease.run == run else f"run {lease.run} (you)"


def leases_for(slots: list[Slot], run: str, pipeline: str, pid: int, run_dir: str = "") -> list[Lease]:
    """The leases that hold `slots` (one per rank) for `pipeline`: one per device each rank uses."""
    out = []
    for rank, slot in enumerate(slots):
        names = [f"gpu{g.index}" for g in slot.gpus] or [slot.name]
        out += [Lease(device=name, run=run, pipeline=pipeline, rank=rank, memory=slot.memory, pid=pid,
                      run_dir=run_dir) for name in names]
    return out


class _Books:
    """The pool as it stands for one decision: who holds each device and how much GPU memory is left."""

    def __init__(self, pool: list[Slot], leases: list[Lease], occupancy: dict[int, GpuOccupancy], policy: Policy):
        self.pool, self.policy, self.occupancy = pool, policy, occupancy
        self.by_device: dict[str, list[Lease]] = {}
        for lease in leases:
            self.by_device.setdefault(lease.device, []).append(lease)

    def foreign(self, slot: Slot) -> tuple[Foreign, ...]:
        occ = self.occupancy.get(slot.gpu.index) if slot.gpu is not None else None
        return occ.foreign if occ is not None else ()

    def whole_free(self, slot: Slot) -> bool:
        """No lease of any run on it, and (a GPU) no foreign process."""
        return not self.by_device.get(slot.name) and not self.foreign(slot)

    def available(self, slot: Slot) -> int:
        """Bytes of a GPU a share may still reserve: its total less every lease's share and foreign memory."""
        held = self.by_device.get(slot.name, [])
        if any(lease.memory is None for lease in held):
            return 0
        occ = self.occupancy.get(slot.first_gpu.index)
        total = occ.total if occ is not None and occ.total else slot.first_gpu.memory_total or 0
        foreign = occ.foreign_memory if occ is not None else 0
        return max(0, total - sum(lease.memory or 0 for lease in held) - foreign)

    def after_taking(self, taken: list[Slot]) -> int:
        """GPUs of the pool left wholly free if `taken` were granted."""
        names = {s.name for s in taken}
        return sum(1 for s in self.pool if s.name not in names and self.whole_free(s))

    def outside(self, slots: list[Slot], run: str) -> bool:
        """Whether another run or another program holds any of `slots` (else this run waits for itself)."""
        return any(lease.run != run for s in slots for lease in self.by_device.get(s.name, [])) or \
            any(self.foreign(s) for s in slots)

    def busy(self, slots: list[Slot], run: str) -> str:
        """"gpu0, gpu1 held by run R (you); gpu3 held by pid 4242 (user bob, 31 GiB)": what holds `slots`."""
        groups: dict[str, list[str]] = {}
        mine: list[str] = []  # this run's pipelines that hold some
        for slot in slots:
            for lease in self.by_device.get(slot.name, []):
                who = "this run" if lease.run == run else f"run {lease.run} (you)"
                groups.setdefault(who, []).append(slot.name)
                if lease.run == run:
                    mine.append(lease.pipeline)
            for foreign in self.foreign(slot):
                groups.setdefault(foreign.describe(), []).append(slot.name)
        said = []
        for who, names in groups.items():
            if who == "this run":
                who = f"this run ({', '.join(dict.fromkeys(mine))})"
            said.append(f"{', '.join(dict.fromkeys(names))} held by {who}")
        return "; ".join(said)


def grant(request: Request, pool: list[Slot], leases: list[Lease], run: str,
          occupancy: dict[int, GpuOccupancy] | None = None, links: dict[tuple[int, int], int] | None = None,
          policy: Policy = Policy()) -> list[Slot] | Wait:
    """One slot per rank for `request` from `pool`, or why it waits (see the module docstring); an elastic
    request gets as many ranks as fit, from its most down to its fewest, and waits for its fewest."""
    if request.min_ranks is not None:
        got: list[Slot] | Wait = Wait("")
        for fixed in request.sizes():
            got = grant(fixed, pool, leases, run, occupancy, links, policy)
            if isinstance(got, list):
                return got
        return got
    books = _Books(pool, leases, occupancy or {}, policy)
    if not any(s.gpu is not None for s in pool):
        free = [s for s in pool if books.whole_free(s)]
        if len(free) >= request.ranks:
            return free[:request.ranks]
        busy = books.busy(pool, run)
        return Wait(f"waiting for {request.label(False)}: {busy}", books.outside(pool, run), busy)
    if request.memory is not None:
        return _shares(request, books, run)
    return _whole(request, books, run, links or {})


def _whole(request: Request, books: _Books, run: str, links: dict[tuple[int, int], int]) -> list[Slot] | Wait:
    free = [s for s in books.pool if books.whole_free(s)]
    need = request.ranks * request.gpus
    label = request.label(True)
    if len(free) < need:
        busy = books.busy(books.pool, run)
        return Wait(f"waiting for {label}: {busy}", books.outside(books.pool, run), busy)
    slots = []
    for _ in range(request.ranks):
        group = _nearest(free, request.gpus, links)
        free = [s for s in free if s not in group]
        slots.append(merge_gpus(group))
    if books.after_taking([g for s in slots for g in _parts(s, books.pool)]) < books.policy.keep_free:
        return Wait(f"waiting for {label}: [devices] keep_free = {books.policy.keep_free} leaves "
                    f"{len(free) + need - books.policy.keep_free} of {len(free) + need} free GPUs to take")
    return slots


def _shares(request: Request, books: _Books, run: str) -> list[Slot] | Wait:
    """A share of one GPU for each rank, each rank on a GPU of its own (NCCL puts no two ranks on one)."""
    room = {s.name: books.available(s) for s in books.pool}
    slots: list[Slot] = []
    memory = request.memory
    assert memory is not None, "a share is asked for in bytes"
    for _ in range(request.ranks):
        fits = [s for s in books.pool if room[s.name] >= memory and s.name not in {t.name for t in slots}
                and not (books.policy.share == "exclusive" and books.foreign(s))
                and (not books.whole_free(s) or books.after_taking([s, *slots]) >= books.policy.keep_free)]
        if not fits:
            said = ", ".join(f"{s.name} {gib(room[s.name])} free" for s in books.pool)
            busy = books.busy(books.pool, run)
            return Wait(f"waiting for {request.label(True)}: {said}" + (f" ({busy})" if busy else ""),
                        books.outside(books.pool, run), busy)
        best = min(fits, key=lambda s: (room[s.name], s.first_gpu.index))  # the tightest fit: whole GPUs stay whole
        room[best.name] -= memory
        slots.append(replace(best, memory=memory))
    return slots


def _nearest(free: list[Slot], count: int, links: dict[tuple[int, int], int]) -> list[Slot]:
    """The `count` GPUs of `free` best linked to each other: the worst pair's link first, then the sum."""
    if count == 1:
        return free[:1]

    def cost(group: Iterable[Slot]) -> tuple[int, int, list[int]]:
        index = [s.first_gpu.index for s in group]
        pairs = [links.get((min(a, b), max(a, b)), SYSTEM) for a, b in itertools.combinations(index, 2)]
        return max(pairs), sum(pairs), index
    return list(min(itertools.combinations(free, count), key=cost))


def merge_gpus(group: list[Slot]) -> Slot:
    """One rank's slot over the GPUs of `group`: named by them all, its first GPU the one it starts on."""
    if len(group) == 1:
        return group[0]
    first = group[0]
    return replace(first, name="+".join(s.name for s in group), peers=tuple(s.first_gpu for s in group[1:]))


def _parts(slot: Slot, pool: list[Slot]) -> list[Slot]:
    """The pool's slots a (merged) slot is made of."""
    names = {f"gpu{g.index}" for g in slot.gpus} or {slot.name}
    return [s for s in pool if s.name in names]


def request_of(pipe: Pipeline, pool: list[Slot]) -> Request:
    """What `pipe` asks of `pool`: a CPU slot per rank on CPU slots; on GPUs its gpus_per_rank, or its
    gpu_memory share (a fraction of the pool's smallest GPU; on a Ray cluster, which knows no GPU's memory,
    the fraction itself: Ray's num_gpus); an elastic gang's ranks from its MIN to its MAX."""
    low = pipe.min_ranks if pipe.elastic else None
    if not any(s.gpu is not None for s in pool):
        return Request(ranks=pipe.max_ranks, min_ranks=low)
    memory = pipe.gpu_memory
    if any(s.node for s in pool):
        share = float(memory) if memory is not None and not isinstance(memory, str) else None
        return Request(ranks=pipe.max_ranks, gpus=pipe.gpus_per_rank, share=share, min_ranks=low)
    if isinstance(memory, str):
        memory = memory_bytes(memory)
    elif memory is not None:
        totals = [s.gpu.memory_total for s in pool if s.gpu is not None and s.gpu.memory_total]
        memory = int(memory * min(totals)) if totals else None
    return Request(ranks=pipe.max_ranks, gpus=pipe.gpus_per_rank, memory=memory, min_ranks=low)
