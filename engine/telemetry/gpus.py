"""GPU readings through NVML: `GpuReader` opens NVML once and reads every visible GPU in one pass.

A reading NVML refuses (not supported, no permission, a lost GPU) is None with a
note saying why, never an exception; a lost GPU is not asked again.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, SupportsInt

from ..hardware.devices import GpuInfo, Nvml, filter_visible, gpu_is_lost, list_gpus, nvml_reason, visible_from_env
from ..protocol.telemetry import GpuProcess, GpuSample


@dataclass
class _Gpu:
    info: GpuInfo
    handle: Any
    lost: str = ""  # why NVML gave up on it; set once, then no more calls


class GpuReader:
    """NVML opened on first use (on the calling thread) and read once a pass; `note` says why GPUs are missing.

    `foreign_owner(pid)` names the owner of a GPU process that is not one of our workers.
    Not thread-safe: the sampler holds its lock around every call.
    """

    def __init__(self, nvml: Nvml | None, foreign_owner: Callable[[int], str]) -> None:
        self._nvml_given = nvml  # None: import pynvml on first use
        self._foreign_owner = foreign_owner
        self._nvml: Nvml | None = None
        self._state = "new"  # "new" -> "ready" | "off"; "off" is never retried
        self._gpus: list[_Gpu] = []
        self.note = ""

    def close(self) -> None:
        """Shut NVML down if it is open (idempotent); the next `sample` opens it again."""
        if self._state == "ready":
            try:
                if self._nvml is not None:  # it is, when ready
                    self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._state, self._gpus = "new", []

    def sample(self, owner_of: dict[int, str]) -> tuple[tuple[GpuSample, ...], dict[str, int] | None]:
        """One pass over every GPU; also GPU bytes per pipeline (None when no process list was read)."""
        if self._state == "new":
            self._open()
        if self._state != "ready":
            return (), None
        samples = []
        per_pipeline: dict[str, int] | None = None
        for gpu in self._gpus:
            sample, procs = self._read_gpu(gpu, owner_of)
            samples.append(sample)
            if procs is not None:
                per_pipeline = per_pipeline if per_pipeline is not None else defaultdict(int)
                for p in procs:
                    if p.pid in owner_of and p.used_memory is not None:
                        per_pipeline[p.owner] += p.used_memory
        return tuple(samples), per_pipeline

    def _open(self) -> None:
        """Init NVML and list the visible GPUs, once; on failure record why and never retry."""
        nvml = self._nvml_given
        try:
            if nvml is None:
                import pynvml  # from nvidia-ml-py
                nvml = pynvml
            nvml.nvmlInit()
        except ImportError:
            self._state, self.note = "off", "nvidia-ml-py is not installed; no GPU telemetry"
            return
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._state, self.note = "off", f"no NVIDIA GPU ({nvml_reason(exc)})"
            return
        try:
            found, skipped = list_gpus(nvml)
        except Exception as exc:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
            self._state, self.note = "off", f"NVML failed ({nvml_reason(exc)})"
            return
        handles = {info.index: handle for info, handle in found}
        visible = filter_visible([info for info, _ in found], visible_from_env())
        self._nvml, self._state = nvml, "ready"
        self._gpus = [_Gpu(info, handles[info.index]) for info in visible]
        if not self._gpus:
            skipped.append("no NVIDIA GPU visible to torchherd")
        self.note = "; ".join(skipped)

    def _read_gpu(self, gpu: _Gpu, owner_of: dict[int, str]) -> tuple[GpuSample, tuple[GpuProcess, ...] | None]:
        nvml, errors = self._nvml, []

        def read(name: str, *args: object) -> Any:
            fn = getattr(nvml, name)  # outside the try: a missing function is our bug, not an absence
            if gpu.lost:
                return None
            try:
                return fn(gpu.handle, *args)
            except Exception as exc:  # NotSupported, NoPermission, GpuIsLost, ...
                errors.append(exc)
                if gpu_is_lost(exc):
                    gpu.lost = nvml_reason(exc)
                return None

        util = read("nvmlDeviceGetUtilizationRates")
        mem = read("nvmlDeviceGetMemoryInfo")
        # nvmlDeviceGetTemperature is deprecated in nvidia-ml-py 13 and due to go in CUDA 14
        temp_fn = ("nvmlDeviceGetTemperature" if hasattr(nvml, "nvmlDeviceGetTemperature")
                   else "nvmlDeviceGetTemperatureV")
        temperature = read(temp_fn, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        power = read("nvmlDeviceGetPowerUsage")  # milliwatts
        limit = read("nvmlDeviceGetEnforcedPowerLimit")  # milliwatts
        raw = read("nvmlDeviceGetComputeRunningProcesses")

        procs = None
        if raw is not None:
            procs = tuple(GpuProcess(pid=int(p.pid), used_memory=_int(p.usedGpuMemory),
                                     owner=owner_of.get(int(p.pid)) or self._foreign_owner(int(p.pid)))
                          for p in raw)
        if gpu.lost:
            note = gpu.lost
        elif errors and all(v is None for v in (util, mem, temperature, power, limit, raw)):
            note = nvml_reason(errors[0])
        else:
            note = ""
        info = gpu.info
        return GpuSample(
            index=info.index, uuid=info.uuid, name=info.name,
            util_gpu=_int(getattr(util, "gpu", None)), util_mem=_int(getattr(util, "memory", None)),
            mem_used=_int(getattr(mem, "used", None)),
            mem_total=_int(getattr(mem, "total", None)) if mem is not None else info.memory_total,
            temperature=_int(temperature),
            power_draw=power / 1000.0 if power is not None else None,
            power_limit=limit / 1000.0 if limit is not None else None,
            processes=procs,
            mem_other=None if procs is None else sum(
                p.used_memory for p in procs if p.pid not in owner_of and p.used_memory is not None),
            note=note,
        ), procs


def _int(value: SupportsInt | None) -> int | None:
    return None if value is None else int(value)
