"""Device discovery: which NVIDIA GPUs this process may use, through NVML, and how many CPU cores.

No NVIDIA driver is a normal case: `discover_devices()` then returns no GPUs and
a one-line note saying why, never an exception.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

NVML_ERROR_GPU_IS_LOST = 15  # pynvml's value


class Nvml(Protocol):
    """The NVML calls torchherd makes: the pynvml module (nvidia-ml-py), or a test's stand-in. A handle and
    what the readings return are pynvml's own objects, which it ships no hints for."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]: ...
    def nvmlDeviceGetP2PStatus(self, a: object, b: object, caps: int) -> int: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, a: object, b: object) -> int: ...


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it. `index` is the NVML (physical) index."""

    index: int
    name: str
    uuid: str
    memory_total: int | None  # bytes; None where NVML does not say (unified memory: GB10, Jetson)


@dataclass(frozen=True)
class Inventory:
    """What this machine offers torchherd: visible GPUs and CPU cores."""

    gpus: tuple[GpuInfo, ...] = ()
    cpu_count: int = 1
    note: str = ""  # why there are no GPUs, when there are none
    driver: str = ""
    visible: tuple[str, ...] | None = field(default=None)  # CUDA_VISIBLE_DEVICES, if set

    def gpu(self, index: int) -> GpuInfo | None:
        return next((g for g in self.gpus if g.index == index), None)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def visible_from_env() -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES as set for torchherd itself, split; None when unset."""
    return _parse_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))


def _parse_visible(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(v.strip() for v in value.split(",") if v.strip())


def filter_visible(gpus: list[GpuInfo], visible: tuple[str, ...] | None) -> list[GpuInfo]:
    """Keep the GPUs CUDA_VISIBLE_DEVICES names (by index or UUID), in its order."""
    if visible is None:
        return gpus
    out = []
    for item in visible:
        if item.isdigit():
            match = next((g for g in gpus if g.index == int(item)), None)
        else:
            match = next((g for g in gpus if g.uuid == item or g.uuid.startswith(item)), None)
        if match is None:
            break  # CUDA stops at the first invalid entry too
        out.append(match)
    return out


def list_gpus(nvml: Nvml) -> tuple[list[tuple[GpuInfo, Any]], list[str]]:
    """Every GPU an initialised NVML reports, with its handle, and one line per GPU it could not read.

    One bad GPU (lost, or not ours to open in a container) is skipped rather than
    hiding the others; a failure to count them at all raises. Memory NVML will not
    report (unified memory is "not supported") leaves the GPU in, its total unknown.
    """
    found, skipped = [], []
    for i in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            info = GpuInfo(index=i, name=_text(nvml.nvmlDeviceGetName(handle)),
                           uuid=_text(nvml.nvmlDeviceGetUUID(handle)), memory_total=_memory_total(nvml, handle))
        except Exception as exc:  # NVMLError_GpuIsLost, NoPermission, ...
            skipped.append(f"GPU {i} skipped ({nvml_reason(exc)})")
            continue
        found.append((info, handle))
    return found, skipped


def _memory_total(nvml: Nvml, handle: object) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
    except Exception as exc:
        if gpu_is_lost(exc):
            raise  # a lost GPU is skipped, not listed
        return None


def discover_devices(nvml: Nvml | None = None) -> Inventory:
    """Ask NVML for the GPUs; respect CUDA_VISIBLE_DEVICES set for torchherd itself."""
    visible = visible_from_env()
    cpus = _cpu_count()
    try:
        if nvml is None:
            import pynvml  # from nvidia-ml-py
            nvml = pynvml
        nvml.nvmlInit()
    except ImportError:
        return Inventory(cpu_count=cpus, note="nvidia-ml-py is not installed; using CPU slots", visible=visible)
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return Inventory(cpu_count=cpus, note=f"no NVIDIA GPU ({nvml_reason(exc)}); using CPU slots",
                         visible=visible)
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        found, skipped = list_gpus(nvml)
    except Exception as exc:
        return Inventory(cpu_count=cpus, note=f"NVML failed ({nvml_reason(exc)}); using CPU slots",
                         visible=visible)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    gpus = filter_visible([info for info, _ in found], visible)
    if gpus:
        note = "; ".join(skipped)  # GPUs that are usable, and any that were not
    elif found and visible is not None:  # it may name a GPU that was skipped: say why that one was
        note = "; ".join([*skipped, "no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES hides them all); using CPU slots"])
    else:
        note = "; ".join([*skipped, "no usable NVIDIA GPU; using CPU slots"])
    return Inventory(gpus=tuple(gpus), cpu_count=cpus, note=note, driver=driver, visible=visible)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_is_lost(exc: BaseException) -> bool:
    """NVML's "GPU is lost": the GPU fell off the bus and answers nothing until a reset."""
    return getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST or "GpuIsLost" in type(exc).__name__


def nvml_reason(exc: BaseException) -> str:
    """A short human reason for an NVML failure."""
    name = type(exc).__name__
    if "LibraryNotFound" in name:
        return "NVML library not found: no NVIDIA driver"
    if "DriverNotLoaded" in name:
        return "NVIDIA driver not loaded"
    return f"{name}: {exc}"
