"""A fake NVIDIA driver below nvidia-ml-py: `fake_nvml.c` built as libnvidia-ml.so.1, scripted from a test.

pynvml's real ctypes bindings load it, so discovery and telemetry run the same code they run on a GPU
machine, down to the C calls, struct layouts and return codes. `FakeDriver` writes the state file the
library re-reads on every call (so a GPU can fall off the bus mid-run) and reads back the calls it logged.

In this process, `bound_in_process` loads the library by its path first: glibc then answers pynvml's
`CDLL("libnvidia-ml.so.1")` with it, since a loaded library is matched by its SONAME (on a machine whose
driver's library an earlier test loaded, pynvml is handed the fake directly). A subprocess finds it
through LD_LIBRARY_PATH (`FakeDriver.env`).
"""
from __future__ import annotations

import _ctypes
import ctypes
import os
import shutil
import subprocess
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"  # the name pynvml asks for, and the fake's SONAME
GiB = 1 << 30

# NVML return codes (nvml.h)
SUCCESS, UNINITIALIZED, NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED, GPU_IS_LOST = 0, 1, 3, 4, 9, 15


def compiler() -> str | None:
    """The C compiler the fake is built with ($CC, cc or gcc); None when there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(directory: Path) -> Path:
    """Compile the fake into `directory`/libnvidia-ml.so.1 with `compiler()`; RuntimeError if that fails."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / LIBRARY
    result = subprocess.run([compiler() or "cc", "-shared", "-fPIC", "-O1", "-Wall", f"-Wl,-soname,{LIBRARY}",
                             "-o", str(out), str(SOURCE), "-lpthread"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the fake NVML library did not build:\n{result.stderr}")
    return out


@dataclass
class FakeGpu:
    """One scripted GPU; `fail` makes every call on it return that NVML code, `fails` one call each."""

    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = ""  # "" : GPU-fake-<index> when written
    memory_total: int = 80 * GiB  # bytes
    memory_used: int = 1 * GiB  # bytes
    util_gpu: int = 90  # percent
    util_memory: int = 40  # percent
    temperature: int = 61  # degrees C
    power: int = 250_500  # milliwatts
    power_limit: int = 400_000  # milliwatts
    mig: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes or None: n/a)
    nvlink: list[int] = field(default_factory=list)  # GPUs it has an NVLink to
    topology: dict[int, int] = field(default_factory=dict)  # GPU -> common ancestor level (default 50, system)
    fail: int = SUCCESS
    fails: dict[str, int] = field(default_factory=dict)  # call (see fake_nvml.c) -> NVML code


def uuid_of(index: int) -> str:
    return f"GPU-fa4e{index:04d}-0000-4000-8000-{index:012d}"


class FakeDriver:
    """The state file and call log of the fake library at `library`; change `gpus` and call `write()`."""

    def __init__(self, directory: Path, library: Path, gpus: list[FakeGpu] | None = None,
                 driver: str = "550.54.15") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.library = library
        self.state, self.log = directory / "state.txt", directory / "calls.txt"
        self.gpus = gpus if gpus is not None else []
        self.driver = driver
        self.init = SUCCESS  # what nvmlInit returns
        self.write()

    def write(self) -> None:
        """Replace the state file in one step: a call in flight reads the old state or the new, never half."""
        lines = [f"driver={self.driver}", f"init={self.init}"]
        for i, g in enumerate(self.gpus):
            lines += ["[gpu]", f"name={g.name}", f"uuid={g.uuid or uuid_of(i)}",
                      f"memory_total={g.memory_total}", f"memory_used={g.memory_used}",
                      f"util_gpu={g.util_gpu}", f"util_memory={g.util_memory}", f"temperature={g.temperature}",
                      f"power={g.power}", f"power_limit={g.power_limit}", f"mig={g.mig}", f"fail={g.fail}"]
            lines += [f"process={pid} {'n/a' if used is None else used}" for pid, used in g.processes]
            lines += [f"fail.{call}={code}" for call, code in g.fails.items()]
            lines += [f"nvlink={peer}" for peer in g.nvlink]
            lines += [f"topology={peer} {level}" for peer, level in g.topology.items()]
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.state)

    def calls(self, index: int) -> Counter:
        """How many times each NVML function was called on GPU `index`."""
        if not self.log.exists():
            return Counter()
        return Counter(fn for fn, i in (line.split() for line in self.log.read_text().splitlines())
                       if int(i) == index)

    def env(self, **extra: str) -> dict[str, str]:
        """An environment in which a subprocess's pynvml loads the fake, scripted by this driver."""
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        path = [str(self.library.parent)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        return env | {"LD_LIBRARY_PATH": ":".join(path), "FAKE_NVML_STATE": str(self.state),
                      "FAKE_NVML_LOG": str(self.log)} | extra


def _forget_library(pynvml) -> None:
    """pynvml's module-level hold on a loaded library, as if it had never loaded one."""
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


@contextmanager
def bound_in_process(library: Path):
    """pynvml in this process bound to the fake at `library` for the block; after it, unloaded and forgotten."""
    import pynvml

    _forget_library(pynvml)
    ours = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    handles = [ours._handle]
    try:
        pynvml._LoadNvmlLibrary()  # its CDLL("libnvidia-ml.so.1") is answered with the fake, matched by SONAME
        handles.append(pynvml.nvmlLib._handle)
        if not hasattr(pynvml.nvmlLib, "fakeNvmlIsFake"):
            pynvml.nvmlLib = ours  # a driver's library was loaded here first, and glibc matched that one
        yield
    finally:
        _forget_library(pynvml)
        for handle in handles:  # unloaded, so a later test's pynvml finds what the machine has
            _ctypes.dlclose(handle)
