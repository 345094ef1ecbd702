"""What NVML says is on each GPU now (free memory, the processes holding it) and how the GPUs are linked.

Placement reads it to see other users and other programs: a process on a GPU that does not descend from one
of this user's torchherd supervisors is foreign. Links rank pairs of GPUs for a rank that holds several:
NVLink first, then the nearest common PCIe ancestor. Any reading NVML refuses is simply absent.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

import psutil

from .devices import Nvml, nvml_reason

T = TypeVar("T")

NVLINK = 0  # a pair's link rank: NVLink, better than any PCIe level
SYSTEM = 50  # NVML_TOPOLOGY_SYSTEM: across CPU sockets, the worst
P2P_CAPS_INDEX_NVLINK = 3  # NVML_P2P_CAPS_INDEX_NVLINK
P2P_STATUS_OK = 0
REFRESH = 0.5  # seconds a reading is reused while pipelines wait


@dataclass(frozen=True)
class Foreign:
    """A process on a GPU that is not one of ours."""

    pid: int
    memory: int | None  # bytes; None where NVML does not say
    user: str  # its owner's name, "" if unknown

    def describe(self) -> str:
        memory = "" if self.memory is None else f", {self.memory / 2**30:.0f} GiB"
        return f"pid {self.pid} ({'user ' + self.user if self.user else 'another program'}{memory})"


@dataclass(frozen=True)
class GpuOccupancy:
    """One GPU now: memory NVML counts as used or free, and the foreign processes on it."""

    index: int
    total: int | None  # bytes
    used: int | None  # bytes, every process's and the driver's
    foreign: tuple[Foreign, ...] = ()

    @property
    def foreign_memory(self) -> int:
        """Bytes foreign processes hold (each one's own figure; the whole `used` where none is given)."""
        known = [f.memory for f in self.foreign if f.memory is not None]
        if self.foreign and len(known) < len(self.foreign):
            return self.used or 0
        return sum(known)


def ours(pid: int, supervisors: set[int]) -> bool:
    """Whether `pid` is one of `supervisors` or descends from one (a worker, a validator, a DataLoader)."""
    if pid in supervisors:
        return True
    try:
        return any(p.pid in supervisors for p in psutil.Process(pid).parents())
    except (psutil.Error, OSError):
        return False


def _owner(pid: int) -> str:
    try:
        return str(psutil.Process(pid).username())
    except (psutil.Error, OSError, KeyError):
        return ""


class OccupancyReader:
    """Readings for placement: taken while a pipeline waits for a GPU, at most every `REFRESH` seconds."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self._nvml = nvml
        self._cached: tuple[float, dict[int, GpuOccupancy]] | None = None
        self._links: dict[tuple[int, int], int] | None = None
        self._open: Nvml | Literal[False] | None = None  # the opened module; False once it could not be opened
        self.note = ""

    def read(self, indices: Iterable[int], supervisors: set[int], max_age: float = REFRESH) -> dict[int, GpuOccupancy]:
        """Each GPU of `indices` by NVML index; {} when NVML cannot be read (nothing is then seen as foreign)."""
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < max_age:
            return self._cached[1]
        indices = list(indices)
        out = self._with_nvml(lambda nvml: {i: self._one(nvml, i, supervisors) for i in indices}) or {}
        self._cached = (now, out)
        return out

    def links(self, indices: Iterable[int]) -> dict[tuple[int, int], int]:
        """The link rank of every pair (a, b), a < b: NVLINK, else NVML's common-ancestor level (lower is
        nearer); read once. A pair NVML says nothing of ranks SYSTEM."""
        if self._links is None:
            pairs = list(itertools.combinations(sorted(indices), 2))
            self._links = self._with_nvml(lambda nvml: {pair: _link(nvml, *pair) for pair in pairs}) or {}
        return self._links

    def _with_nvml(self, read: Callable[[Nvml], T]) -> T | None:
        """`read(nvml)` with NVML opened on first use and kept open (init can take a while on a big box);
        None when NVML cannot be opened or the reading fails."""
        if self._open is None:
            nvml = self._nvml
            try:
                if nvml is None:
                    import pynvml  # from nvidia-ml-py
                    nvml = pynvml
                nvml.nvmlInit()
                self._open = nvml
            except Exception as exc:
                self.note, self._open = nvml_reason(exc), False
        if not self._open:
            return None
        try:
            return read(self._open)
        except Exception as exc:
            self.note = nvml_reason(exc)
            return None

    def close(self) -> None:
        """Shut NVML down if this reader opened it."""
        if self._open:
            try:
                self._open.nvmlShutdown()
            except Exception:
                pass
        self._open = None

    @staticmethod
    def _one(nvml: Nvml, index: int, supervisors: set[int]) -> GpuOccupancy:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        total: int | None
        used: int | None
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total, used = int(memory.total), int(memory.used)
        except Exception:
            total = used = None
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            procs = []
        foreign = []
        for p in procs:
            if ours(p.pid, supervisors):
                continue
            held = p.usedGpuMemory
            held = None if held is None or held >= 2**64 - 1 else int(held)  # NVML_VALUE_NOT_AVAILABLE
            foreign.append(Foreign(int(p.pid), held, _owner(p.pid)))
        return GpuOccupancy(index, total, used, tuple(foreign))


def _link(nvml: Nvml, a: int, b: int) -> int:
    ha, hb = nvml.nvmlDeviceGetHandleByIndex(a), nvml.nvmlDeviceGetHandleByIndex(b)
    try:
        if nvml.nvmlDeviceGetP2PStatus(ha, hb, P2P_CAPS_INDEX_NVLINK) == P2P_STATUS_OK:
            return NVLINK
    except Exception:
        pass
    try:
        return int(nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
    except Exception:
        return SYSTEM
