"""A slot: one place a worker rank runs (a CPU slot, a GPU, several GPUs, or a share of one GPU's memory)."""
from __future__ import annotations

from dataclasses import dataclass

from .devices import GpuInfo


@dataclass(frozen=True)
class Slot:
    """One place a worker can run."""

    name: str  # "gpu0", "cpu1"; a rank over several GPUs "gpu0+gpu2"
    device: str  # "cuda" or "cpu"
    gpu: GpuInfo | None  # the GPU it starts on (its first)
    threads: int
    node: str = ""  # a cluster node's id (engine/launch/ray/placement.py); "" for this machine
    peers: tuple[GpuInfo, ...] = ()  # the rank's other GPUs (gpus_per_rank > 1), best linked to `gpu`
    memory: int | None = None  # bytes of `gpu` reserved for a share of it (gpu_memory); None: the whole GPU
    share: float | None = None  # on a Ray cluster, the fraction of `gpu` reserved (Ray's num_gpus); None: whole

    @property
    def first_gpu(self) -> GpuInfo:
        """`gpu`, of a slot known to be on one (ValueError for a CPU slot)."""
        if self.gpu is None:
            raise ValueError(f"{self.name} is not on a GPU")
        return self.gpu

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        """Every GPU the slot holds, in the order CUDA numbers them for its process."""
        return () if self.gpu is None else (self.gpu, *self.peers)

    @property
    def label(self) -> str:
        if self.gpu is not None:
            share = f", {self.memory / 2**30:.1f} GiB share" if self.memory is not None else \
                f", {self.share:g} share" if self.share is not None else ""
            return f"{self.name} ({self.gpu.name}{share})"
        return f"{self.name} ({self.threads} thread{'s' if self.threads != 1 else ''})"
