"""Placement: the device slots a run gets from its config and this machine, and a plan of who goes where.

A slot is one GPU, or a share of CPU cores. Pipelines take slots by priority; the
rest wait in a queue until one frees.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..config.problems import Problem
from ..config.schema import DevicesConfig, Pipeline, RunConfig
from ..protocol.names import ValidationMode
from .devices import GpuInfo, Inventory
from .grants import gib, request_of
from .slots import Slot


def plan_slots(devices: DevicesConfig, inventory: Inventory, file: str = "") -> tuple[list[Slot], list[Problem]]:
    """The slots `devices` asks for on this machine, or the problems that prevent it."""
    placement = devices.placement
    if isinstance(placement, list):
        problems = []
        slots = []
        for i, index in enumerate(placement):
            gpu = inventory.gpu(index)
            if gpu is None:
                have = ", ".join(str(g.index) for g in inventory.gpus) or "none"
                why = f" ({inventory.note})" if inventory.note else ""
                problems.append(Problem(file, f"devices.placement[{i}]",
                                        f"GPU {index} does not exist (visible GPUs: {have}){why}"))
                continue
            slots.append(Slot(f"gpu{index}", "cuda", gpu, devices.threads_per_worker))
        return slots, problems
    if placement == "auto" and inventory.gpus:
        return [Slot(f"gpu{g.index}", "cuda", g, devices.threads_per_worker) for g in inventory.gpus], []
    threads = devices.threads_per_worker
    if devices.cpu_slots == "auto":
        count = max(1, inventory.cpu_count // threads)
    else:
        count = devices.cpu_slots
    return [Slot(f"cpu{i}", "cpu", None, threads) for i in range(count)], []


def request_problem(p: Pipeline, slots: list[Slot], devices: DevicesConfig) -> tuple[str, str] | None:
    """(key, why) when no state of this machine could ever grant what `p` asks for; None if some could."""
    gpus = [s for s in slots if s.gpu is not None]
    have = ", ".join(s.name for s in slots)
    asks_gpu = p.gpus_per_rank > 1 or p.gpu_memory is not None
    if asks_gpu and not gpus:
        key = "gpus_per_rank" if p.gpus_per_rank > 1 else "gpu_memory"
        return key, f"asks for GPUs, but this run has CPU slots only ({have}): remove {key}, or run it on a GPU machine"
    if p.gpus_per_rank > 1 and p.gpu_memory is not None:
        return "gpu_memory", f"a share of one GPU cannot go with gpus_per_rank = {p.gpus_per_rank}: choose one"
    if p.gpu_memory is not None and p.max_ranks > len(gpus):
        return "ranks", (f"each of {p.max_ranks} ranks needs a share of a GPU of its own (NCCL puts no two ranks of a "
                         f"gang on one GPU), and this run has {len(gpus)} GPU(s)")
    if asks_gpu and any(s.node for s in slots):
        problem = cluster_request_problem(p, gpus)
        if problem is not None or p.gpu_memory is not None:
            return problem  # a fraction of one GPU always fits one
    if p.gpu_memory is not None:
        need = request_of(p, slots).memory or 0
        largest = max((s.first_gpu.memory_total or 0 for s in gpus), default=0)
        if largest and need > largest:
            return "gpu_memory", f"{gib(need)} is more than the largest GPU here has ({gib(largest)})"
        return None
    need = p.max_ranks * (p.gpus_per_rank if gpus else 1)
    usable = len(slots) - (devices.keep_free if gpus else 0)
    if need <= usable:
        return None
    if p.gpus_per_rank > 1:
        return "gpus_per_rank", (f"{p.max_ranks} rank(s) x {p.gpus_per_rank} GPUs need {need} GPUs at once; this "
                                 f"machine gives {usable} ({have}" + (f", less keep_free = {devices.keep_free}"
                                                                      if devices.keep_free else "") + ")")
    return "ranks", (f"{p.max_ranks} ranks need {p.max_ranks} device slots at once; this machine gives {usable} "
                     f"({have}" + (f", less keep_free = {devices.keep_free}" if devices.keep_free and gpus else "")
                     + "): lower ranks, or add slots with [devices] cpu_slots / placement")


def cluster_request_problem(p: Pipeline, gpus: list[Slot]) -> tuple[str, str] | None:
    """(key, why) when a Ray cluster could never grant `p`'s request: Ray accounts whole GPUs and fractions of
    one (num_gpus), not GPU memory, and one rank's GPUs must be on one node."""
    if isinstance(p.gpu_memory, str):
        return "gpu_memory", (f"{p.gpu_memory!r} is bytes, and a Ray cluster accounts fractions of a GPU, not its "
                              "memory: give a fraction such as gpu_memory = 0.25 (Ray's num_gpus)")
    per_node = Counter(s.node for s in gpus)
    if p.gpus_per_rank > max(per_node.values(), default=0):
        return "gpus_per_rank", (f"one rank's {p.gpus_per_rank} GPUs must be on one node, and no node of the cluster "
                                 f"has that many (" + ", ".join(f"{n[:6]}: {k}" for n, k in per_node.items()) + ")")
    return None


def order_pipelines(config: RunConfig) -> list[str]:
    """Pipeline names in start order: higher priority first, then as written."""
    indexed = list(enumerate(config.pipelines))
    indexed.sort(key=lambda ip: (-ip[1].priority, ip[0]))
    return [p.name for _, p in indexed]


def validation_line(config: RunConfig, plan: ValidationPlan) -> str:
    """`check`'s line on where and how often validation runs, and what it keeps."""
    v = config.validation
    background = plan.mode == ValidationMode.BACKGROUND
    return "validation: " + ("off" if plan.mode == ValidationMode.OFF else
                             f"{plan.label} ({plan.why}), every {v.every_n_epochs} epoch(s)"
                             + (f" and {v.every_n_steps} steps" if v.every_n_steps and background else "")
                             + f", best by {v.metric} ({v.metric_mode})"
                             + (f", policy {v.policy}" if background else "")
                             + (f", early stop after {v.patience}" if v.patience else ""))


@dataclass(frozen=True)
class ValidationPlan:
    """Where validation runs for a config: its resolved mode and, in the background, on which device."""

    mode: ValidationMode  # BACKGROUND, INLINE or OFF (never AUTO: that is resolved here)
    device: str  # "cpu" or "cuda" (background only)
    gpu: GpuInfo | None
    threads: int
    why: str
    per_node: bool = False  # one validator on each cluster node that hosts validated workers

    @property
    def label(self) -> str:
        if self.mode != ValidationMode.BACKGROUND:
            return self.mode
        where = f"gpu{self.gpu.index}" if self.gpu is not None else f"cpu ({self.threads} thread)"
        return f"background on {where}"


SPARE_GPU = "a GPU no worker uses"  # why a validator has a GPU to itself, which the run then leases


def plan_validation(config: RunConfig, slots: list[Slot], inventory: Inventory,
                    taken: frozenset[int] = frozenset()) -> ValidationPlan:
    """Resolve `validation.mode` and `validation.device` against the slots this run uses, on one machine
    (a backend plans its own: Backend.plan_validation, engine/launch/backend.py). `taken`: GPUs another
    run or program holds now, never a spare one."""
    v = config.validation
    if v.mode in (ValidationMode.OFF, ValidationMode.INLINE):
        return ValidationPlan(v.mode, "", None, v.threads, "as configured")
    # What the config occupies at once, not every slot planned: one pipeline on a box of eight GPUs (or two
    # cores) leaves the rest spare. Slots are taken in order.
    free = [s for s in slots if s.gpu is None or s.gpu.index not in taken]
    slots = (free or slots)[:sum(p.max_ranks * p.gpus_per_rank for p in config.pipelines)]
    used = {g.index for s in slots for g in s.gpus}
    spare = [g for g in inventory.gpus if g.index not in used and g.index not in taken]
    if isinstance(v.device, int):
        gpu = inventory.gpu(v.device)
        if gpu is not None:
            return ValidationPlan(ValidationMode.BACKGROUND, "cuda", gpu, v.threads, "as configured")
    if v.device == "cpu":
        return ValidationPlan(ValidationMode.BACKGROUND, "cpu", None, v.threads, "as configured")
    if spare:
        return ValidationPlan(ValidationMode.BACKGROUND, "cuda", spare[0], v.threads, SPARE_GPU)
    if inventory.gpus:  # the last of the run's own, when others hold GPUs of this machine
        gpu = next((s.gpu for s in reversed(slots) if s.gpu is not None), inventory.gpus[-1])
        return ValidationPlan(ValidationMode.BACKGROUND, "cuda", gpu, v.threads, "sharing the last GPU")
    busy = sum(s.threads for s in slots if s.gpu is None)
    if v.mode == ValidationMode.BACKGROUND or inventory.cpu_count > busy:
        why = "as configured" if v.mode == ValidationMode.BACKGROUND else f"{inventory.cpu_count - busy} spare core(s)"
        return ValidationPlan(ValidationMode.BACKGROUND, "cpu", None, v.threads, why)
    # Every core already trains: a validator would only slow the workers down (see
    # benchmarks/validation_overlap.py), so validate inline.
    return ValidationPlan(ValidationMode.INLINE, "", None, v.threads,
                          f"no spare core ({busy} of {inventory.cpu_count} train)")
