"""Device discovery: the real machine (GPU or not) and an NVML stand-in with scripted GPUs."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pynvml
import pytest

from torchherd.engine.hardware.devices import GpuInfo, Inventory, discover_devices

GiB = 1 << 30


class DiscoveryNvml:
    """The NVML calls discovery makes; a GPU given as an exception raises it when opened."""

    def __init__(self, gpus: list, init_error: Exception | None = None) -> None:
        self.gpus, self.init_error, self.calls = gpus, init_error, Counter()

    def nvmlInit(self):
        self.calls["init"] += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls["shutdown"] += 1

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"  # older pynvml returned bytes

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if isinstance(self.gpus[i], Exception):
            raise self.gpus[i]
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h][0]

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.gpus[h][2], used=0, free=self.gpus[h][2])


def three_gpus() -> DiscoveryNvml:
    return DiscoveryNvml([("NVIDIA A100", "GPU-aaaa-0000", 80 * GiB),
                          ("NVIDIA A100", "GPU-bbbb-1111", 80 * GiB),
                          ("NVIDIA L4", "GPU-cccc-2222", 24 * GiB)])


def test_real_machine_gives_cpu_slots_or_gpus_without_raising():
    inv = discover_devices()
    assert isinstance(inv, Inventory) and inv.cpu_count >= 1
    if not inv.gpus:  # the usual case on CI: one clear line, no exception
        assert "CPU slots" in inv.note and "\n" not in inv.note


def test_lists_every_gpu_and_shuts_nvml_down(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = three_gpus()
    inv = discover_devices(nvml)
    assert inv.gpus[2] == GpuInfo(index=2, name="NVIDIA L4", uuid="GPU-cccc-2222", memory_total=24 * GiB)
    assert [g.index for g in inv.gpus] == [0, 1, 2]
    assert inv.driver == "550.54.15" and inv.note == "" and inv.visible is None
    assert nvml.calls == Counter(init=1, shutdown=1)


@pytest.mark.parametrize("visible, indices", [
    ("2,0", [2, 0]),                      # CUDA's order, by index
    ("GPU-bbbb", [1]),                    # by UUID prefix
    ("GPU-cccc-2222, 0", [2, 0]),
    ("1,7,2", [1]),                       # CUDA stops at the first invalid entry
])
def test_cuda_visible_devices_set_for_torchherd_is_respected(monkeypatch, visible, indices):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    inv = discover_devices(three_gpus())
    assert [g.index for g in inv.gpus] == indices
    assert inv.gpu(indices[0]).index == indices[0] and inv.gpu(99) is None


@pytest.mark.parametrize("visible", ["", "-1", "GPU-none"])
def test_cuda_visible_devices_hiding_every_gpu_gives_cpu_slots(monkeypatch, visible):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    inv = discover_devices(three_gpus())
    assert inv.gpus == () and "CUDA_VISIBLE_DEVICES" in inv.note and "CPU slots" in inv.note


@pytest.mark.parametrize("code, words", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
])
def test_no_driver_is_a_note_not_an_error(monkeypatch, code, words):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = DiscoveryNvml([], init_error=pynvml.NVMLError(code))
    inv = discover_devices(nvml)
    assert inv.gpus == () and words in inv.note and "CPU slots" in inv.note


def test_a_lost_gpu_is_skipped_and_the_others_kept(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = three_gpus()
    nvml.gpus[1] = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    inv = discover_devices(nvml)
    assert [g.index for g in inv.gpus] == [0, 2]
    assert "GPU 1 skipped" in inv.note and "GPU is lost" in inv.note
    assert nvml.calls["shutdown"] == 1


def test_a_machine_with_zero_gpus_says_so(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inv = discover_devices(DiscoveryNvml([]))
    assert inv.gpus == () and "CPU slots" in inv.note and "CUDA_VISIBLE_DEVICES" not in inv.note


# Regression: validation "auto" counted every slot as training: one pipeline on two CPU slots was validated
# inline ("no spare core (2 of 2 train)") while cpu1 sat idle, and one pipeline on an 8-GPU box shared the last
# GPU with nothing on it spare.
@pytest.mark.parametrize("inventory, pipelines, mode, why", [
    (Inventory(cpu_count=2), 1, "background", "1 spare core(s)"),
    (Inventory(cpu_count=2), 2, "inline", "no spare core (2 of 2 train)"),
    (Inventory(gpus=tuple(GpuInfo(i, "Test GPU", f"GPU-{i}", 80 << 30) for i in range(8)), cpu_count=16), 1,
     "background", "a GPU no worker uses"),
])
def test_auto_validation_counts_the_slots_the_config_occupies(tmp_path, inventory, pipelines, mode, why):
    from torchherd.engine.config.load import parse_config
    from torchherd.engine.hardware.placement import plan_slots, plan_validation

    config = parse_config({"pipelines": [{"name": f"p{i}", "task": "regression"} for i in range(pipelines)]},
                          str(tmp_path / "c.toml"), tmp_path)
    slots, problems = plan_slots(config.devices, inventory, "c.toml")
    assert not problems
    plan = plan_validation(config, slots, inventory)
    assert (plan.mode, plan.why) == (mode, why)
    if inventory.gpus:
        assert plan.gpu.index == 1  # the first GPU trains; the next one validates
