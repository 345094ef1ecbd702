"""Telemetry as it crosses a process boundary: a `TelemetrySnapshot` event of GPU, process and host readings.

A value that could not be read (no driver, no permission, a process that vanished, a first reading with
nothing to compare against) is None: a marked absence, never an exception.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .messages import Event

# GpuProcess, GpuSample and ProcessSample are parts of a TelemetrySnapshot, not events of their own.

OWNER_OTHER = "other"  # a process outside our workers' trees, seen in our pid namespace
OWNER_UNKNOWN = "unknown owner"  # a pid we cannot place (gone, or a host pid inside a container)


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuProcess:
    """A compute process on a GPU, the memory it holds, and whose it is."""

    pid: int  # as NVML reports it; a host pid when we run in a container
    used_memory: int | None  # bytes
    owner: str  # a pipeline name, OWNER_OTHER or OWNER_UNKNOWN


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSample:
    """One GPU's readings in one sampling pass."""

    index: int  # NVML (physical) index
    uuid: str
    name: str
    util_gpu: int | None = None  # percent of the last sample period a kernel ran
    util_mem: int | None = None  # percent of it the memory controller was busy
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    temperature: int | None = None  # degrees Celsius
    power_draw: float | None = None  # watts
    power_limit: float | None = None  # watts (enforced limit)
    processes: tuple[GpuProcess, ...] | None = None
    mem_other: int | None = None  # bytes held by processes that are not our workers'
    note: str = ""  # why readings are missing, e.g. "GPU is lost"
    node: str = ""  # the cluster node's label; "" for this machine


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessSample:
    """A worker process and its descendants (DataLoader workers ...), summed."""

    pipeline: str
    pid: int
    cpu_percent: float | None  # percent of one core (can exceed 100); None on its first pass
    rss: int | None  # bytes; pages shared between forked children count once per process
    children: int  # descendants counted into the figures
    gpu_memory: int | None = None  # bytes on all GPUs; None when no GPU could be read
    node: str = ""  # the cluster node's label; "" for this machine


@dataclass(frozen=True, kw_only=True, slots=True)
class TelemetrySnapshot(Event):
    """GPU, worker and host readings from one sampling pass."""

    type: ClassVar[str] = "telemetry"
    gpus: tuple[GpuSample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    host_cpu_percent: float | None = None  # percent of all cores
    host_mem_used: int | None = None  # bytes (total minus available)
    host_mem_total: int | None = None  # bytes
    load1: float | None = None  # 1-minute load average
    sample_ms: float = 0.0  # milliseconds the pass took
    gpu_note: str = ""  # one line on why there are no GPUs, or which of this machine's NVML could not open
