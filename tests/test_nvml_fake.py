"""Discovery, placement and telemetry through nvidia-ml-py's real bindings, on a fake NVIDIA driver library.

The library (tests/nvml_fake) answers the C calls pynvml makes with the GPUs and NVML return codes a test
writes, so the code paths here are the ones a GPU machine runs: nothing of pynvml is replaced.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from torchherd.engine.config.schema import DevicesConfig
from torchherd.engine.hardware.devices import GpuInfo, discover_devices
from torchherd.engine.hardware.placement import plan_slots
from torchherd.engine.preflight.plan import describe_plan
from torchherd.engine.protocol.messages import WorkerStarted
from torchherd.engine.protocol.telemetry import OWNER_OTHER, OWNER_UNKNOWN, GpuProcess, TelemetrySnapshot
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.engine.telemetry.sampler import TelemetrySampler
from tests.conftest import make_config, wait_for as wait_for_event
from tests.faults.support import faulty_config, finish, poll_until, supervised
from tests.nvml_fake import (GPU_IS_LOST, NO_PERMISSION, NOT_SUPPORTED, UNINITIALIZED, FakeDriver, FakeGpu,
                             GiB, bound_in_process, uuid_of)

MiB = 1 << 20
SAMPLE_CONFIGS = Path(__file__).resolve().parent.parent / "sample_configs"


def gpus(n: int, **readings) -> list[FakeGpu]:
    return [FakeGpu(**readings) for _ in range(n)]


# ------------------------------------------------------------------------------------- the fake itself

def test_pynvml_binds_the_fake_and_gets_nvml_answers(fake_nvml: FakeDriver):
    fake_nvml.gpus = [FakeGpu(processes=[(4242, 3 * GiB), (4243, None)])]
    fake_nvml.write()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetCount() == 1 and pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
        assert pynvml.nvmlDeviceGetUUID(handle) == uuid_of(0)
        assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
        assert [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [
            (4242, 3 * GiB), (4243, None)]  # n/a reaches Python as None, as on Windows WDDM
        assert pynvml.nvmlErrorString(GPU_IS_LOST) == "GPU is lost"
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(1)
    finally:
        pynvml.nvmlShutdown()


def test_the_fake_is_unloaded_after_a_test_so_later_ones_meet_the_machine(fake_nvml_library, monkeypatch):
    monkeypatch.delenv("FAKE_NVML_STATE", raising=False)
    with bound_in_process(fake_nvml_library):
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):  # no state file: a library without its driver
            pynvml.nvmlInit()
        assert str(fake_nvml_library) in Path("/proc/self/maps").read_text()
    assert str(fake_nvml_library) not in Path("/proc/self/maps").read_text() and pynvml.nvmlLib is None


# ------------------------------------------------------------------------------------------- discovery

def test_discovery_lists_the_fake_gpus(fake_nvml: FakeDriver):
    fake_nvml.gpus = gpus(3)
    fake_nvml.gpus[2] = FakeGpu(name="NVIDIA L4", memory_total=24 * GiB)
    fake_nvml.write()
    inv = discover_devices()
    assert [g.index for g in inv.gpus] == [0, 1, 2] and inv.driver == "550.54.15" and inv.note == ""
    assert inv.gpus[2] == GpuInfo(index=2, name="NVIDIA L4", uuid=uuid_of(2), memory_total=24 * GiB)
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # shut down again after looking
        pynvml.nvmlDeviceGetCount()


@pytest.mark.parametrize("visible, indices", [
    ("2,0", [2, 0]),                          # by index, in CUDA_VISIBLE_DEVICES' order
    (f"{uuid_of(3)},{uuid_of(1)}", [3, 1]),   # by full UUID
    (uuid_of(2)[:12], [2]),                   # by a UUID prefix
    ("1,9,0", [1]),                           # CUDA stops at the first entry that names no GPU
])
def test_cuda_visible_devices_narrows_and_orders_the_fake_gpus(fake_nvml: FakeDriver, monkeypatch, visible,
                                                                indices):
    fake_nvml.gpus = gpus(4)
    fake_nvml.write()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [g.index for g in discover_devices().gpus] == indices
    sampler = TelemetrySampler(in_container=False)
    assert [g.index for g in sampler.sample_once().gpus] == indices
    sampler.stop()


@pytest.mark.parametrize("code, reason", [
    (GPU_IS_LOST, "GPU is lost"),
    (NO_PERMISSION, "Insufficient Permissions"),
    (UNINITIALIZED, "Uninitialized"),
])
def test_a_gpu_that_cannot_be_opened_is_skipped_with_a_note(fake_nvml: FakeDriver, code, reason):
    fake_nvml.gpus = gpus(3)
    fake_nvml.gpus[1].fail = code
    fake_nvml.write()
    inv = discover_devices()
    assert [g.index for g in inv.gpus] == [0, 2]
    assert inv.note.startswith("GPU 1 skipped") and reason in inv.note


# Regression: a GPU whose memory NVML does not report (NOT_SUPPORTED: unified memory, as on GB10 or Jetson)
# was skipped by discovery, so such a machine trained on CPU slots.
def test_a_gpu_whose_memory_nvml_does_not_report_is_still_used(fake_nvml: FakeDriver, tmp_path):
    fake_nvml.gpus = [FakeGpu(name="NVIDIA GB10", fails={"memory": NOT_SUPPORTED})]
    fake_nvml.write()
    inv = discover_devices()
    assert inv.gpus == (GpuInfo(index=0, name="NVIDIA GB10", uuid=uuid_of(0), memory_total=None),)
    assert inv.note == ""
    config = make_config(tmp_path, [{"name": "a"}], devices={"placement": "auto"})
    slots, _ = plan_slots(config.devices, inv)
    assert [s.name for s in slots] == ["gpu0"]
    assert describe_plan(config, slots, inv)[0] == f"GPU 0: NVIDIA GB10, memory n/a ({uuid_of(0)})"
    sampler = TelemetrySampler(in_container=False)
    (g,) = sampler.sample_once().gpus
    assert (g.mem_used, g.mem_total, g.util_gpu, g.note) == (None, None, 90, "")
    sampler.stop()


def test_a_driver_that_is_not_loaded_gives_cpu_slots(fake_nvml: FakeDriver):
    fake_nvml.gpus, fake_nvml.init = gpus(2), 9  # NVML_ERROR_DRIVER_NOT_LOADED
    fake_nvml.write()
    inv = discover_devices()
    assert inv.gpus == () and inv.note == "no NVIDIA GPU (NVIDIA driver not loaded); using CPU slots"
    sampler = TelemetrySampler()
    snap = sampler.sample_once()
    assert snap.gpus == () and snap.gpu_note == "no NVIDIA GPU (NVIDIA driver not loaded)"
    sampler.stop()


# ------------------------------------------------------------------------------------------- placement

def test_placement_puts_one_pipeline_on_each_fake_gpu(fake_nvml: FakeDriver, tmp_path):
    fake_nvml.gpus = gpus(4)
    fake_nvml.write()
    inventory = discover_devices()
    config = make_config(tmp_path, [{"name": f"p{i}"} for i in range(4)], devices={"placement": "auto"})
    slots, problems = plan_slots(config.devices, inventory)
    assert problems == [] and [(s.name, s.device, s.gpu.uuid) for s in slots] == [
        (f"gpu{i}", "cuda", uuid_of(i)) for i in range(4)]
    lines = describe_plan(config, slots, inventory)
    for i in range(4):
        assert any(line.startswith(f"p{i}: ") and line.endswith(f"-> gpu{i} (NVIDIA A100-SXM4-80GB)")
                   for line in lines), lines
    assert plan_slots(DevicesConfig(placement=[3, 1]), inventory)[0][1].gpu.index == 1


# ------------------------------------------------------------------------------------------- telemetry

def test_the_sampler_reads_every_fake_gpu_and_gives_each_pipeline_its_gpu_memory(fake_nvml: FakeDriver):
    me = os.getpid()
    fake_nvml.gpus = [FakeGpu(memory_used=30_000 * MiB, processes=[(me, 3_000 * MiB), (1, 500 * MiB)]),
                      FakeGpu(util_gpu=7, util_memory=3, temperature=45, power=80_250, power_limit=300_000,
                              processes=[(me, 1_000 * MiB), (1, None)])]
    fake_nvml.write()
    sampler = TelemetrySampler(pids=lambda: {"mnist": me}, in_container=False)
    snap = sampler.sample_once()
    g0, g1 = snap.gpus
    assert (g0.index, g0.uuid, g0.name) == (0, uuid_of(0), "NVIDIA A100-SXM4-80GB")
    assert (g0.util_gpu, g0.util_mem, g0.temperature, g0.power_draw, g0.power_limit) == (90, 40, 61, 250.5, 400.0)
    assert (g0.mem_used, g0.mem_total) == (30_000 * MiB, 80 * GiB)
    assert g0.processes == (GpuProcess(pid=me, used_memory=3_000 * MiB, owner="mnist"),
                            GpuProcess(pid=1, used_memory=500 * MiB, owner=OWNER_OTHER))
    assert g0.mem_other == 500 * MiB and g0.note == ""
    assert (g1.util_gpu, g1.util_mem, g1.temperature, g1.power_draw, g1.power_limit) == (7, 3, 45, 80.25, 300.0)
    assert g1.processes[1] == GpuProcess(pid=1, used_memory=None, owner=OWNER_OTHER) and g1.mem_other == 0
    assert snap.processes[0].gpu_memory == 4_000 * MiB and snap.gpu_note == ""
    sampler.stop()
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # the sampler shut NVML down
        pynvml.nvmlDeviceGetCount()


READINGS = {"utilization": "util_gpu", "memory": "mem_used", "temperature": "temperature",
            "power": "power_draw", "power_limit": "power_limit", "processes": "processes"}


# memory-*: discovery skipped a GPU whose memory info it could not read, so the GPU was not sampled at all
@pytest.mark.parametrize("code", [NOT_SUPPORTED, NO_PERMISSION, UNINITIALIZED])
@pytest.mark.parametrize("call", list(READINGS))
def test_a_reading_nvml_refuses_is_none_and_the_others_are_read(fake_nvml: FakeDriver, call, code):
    fake_nvml.gpus = gpus(2)
    fake_nvml.gpus[1].fails = {call: code}
    fake_nvml.write()
    sampler = TelemetrySampler(in_container=False)
    sampler.sample_once()
    asked = fake_nvml.calls(1)[_function(call)]
    for _ in range(2):  # refused again on the next pass: asked again, and still no exception
        g0, g1 = sampler.sample_once().gpus
        assert getattr(g1, READINGS[call]) is None
        assert all(getattr(g0, r) is not None for r in READINGS.values())
        assert all(getattr(g1, r) is not None for c, r in READINGS.items() if c != call)
    assert fake_nvml.calls(1)[_function(call)] == asked + 2
    sampler.stop()


@pytest.mark.parametrize("code, reason", [
    (NOT_SUPPORTED, "NVMLError_NotSupported: Not Supported"),
    (NO_PERMISSION, "NVMLError_NoPermission: Insufficient Permissions"),
    (UNINITIALIZED, "NVMLError_Uninitialized: Uninitialized"),
])
def test_a_gpu_that_refuses_every_reading_is_none_with_a_note(fake_nvml: FakeDriver, code, reason):
    fake_nvml.gpus = gpus(2)
    fake_nvml.write()
    sampler = TelemetrySampler(in_container=False)
    sampler.sample_once()  # opened and listed while it answered
    fake_nvml.gpus[0].fails = dict.fromkeys(READINGS, code)
    fake_nvml.write()
    g0, g1 = sampler.sample_once().gpus
    assert all(getattr(g0, r) is None for r in READINGS.values()) and g0.note == reason
    assert g0.mem_total == 80 * GiB  # known from discovery
    assert g1.util_gpu == 90 and g1.note == ""
    sampler.stop()


def test_a_gpu_that_falls_off_the_bus_mid_run_is_lost_not_asked_again_and_the_others_go_on(fake_nvml: FakeDriver):
    fake_nvml.gpus = gpus(3)
    fake_nvml.write()
    passes = []
    sampler = TelemetrySampler(interval=0.01, on_snapshot=passes.append, in_container=False)
    sampler.start()
    poll_until(lambda: len(passes) >= 2, 10, "two sampling passes")
    fake_nvml.gpus[1].fail = GPU_IS_LOST
    fake_nvml.write()
    lost_at = poll_until(lambda: next((i for i, s in enumerate(passes) if s.gpus[1].note), None), 10,
                         "a pass that sees GPU 1 lost")
    asked = sum(fake_nvml.calls(1).values())
    poll_until(lambda: len(passes) >= lost_at + 5, 10, "five passes after the loss")
    sampler.stop()
    assert sum(fake_nvml.calls(1).values()) == asked  # never asked again after it was lost
    for snap in passes[lost_at:]:
        g0, g1, g2 = snap.gpus
        assert g1.note == "NVMLError_GpuIsLost: GPU is lost"
        assert g0.util_gpu == g2.util_gpu == 90 and g0.note == g2.note == ""
    # the pass it was lost in keeps what it read before; every pass after has nothing of it
    assert all(s.gpus[1].util_gpu is None and s.gpus[1].mem_used is None for s in passes[lost_at + 1:])
    assert passes[lost_at - 1].gpus[1].util_gpu == 90
    assert not sampler.latest.gpu_note


def _function(call: str) -> str:
    return {"utilization": "nvmlDeviceGetUtilizationRates", "memory": "nvmlDeviceGetMemoryInfo",
            "temperature": "nvmlDeviceGetTemperature", "power": "nvmlDeviceGetPowerUsage",
            "power_limit": "nvmlDeviceGetEnforcedPowerLimit",
            "processes": "nvmlDeviceGetComputeRunningProcesses_v3"}[call]


# ------------------------------------------------------------------------------------------ subprocess

@pytest.mark.slow
async def test_a_supervisor_gives_its_training_worker_the_gpu_memory_nvml_lists_for_its_pid(fake_nvml: FakeDriver,
                                                                                            tmp_path):
    fake_nvml.gpus = gpus(2)
    fake_nvml.write()
    gate = tmp_path / "gate"
    # CPU slots: this torch may have no CUDA; the fake GPUs are there to be sampled
    config = faulty_config(tmp_path, [{"name": "a", "params": {"samples": 640, "gate_file": str(gate),
                                                               "gate_at_call": 3}}],
                           defaults={"max_epochs": 1}, devices={"placement": "cpu", "cpu_slots": 1},
                           validation={"mode": "off"}, telemetry={"interval": 0.05, "persist_every": 0.05})
    sup = Supervisor(config)
    assert [g.uuid for g in sup.inventory.gpus] == [uuid_of(0), uuid_of(1)]
    async with supervised(sup) as stream:
        started = await wait_for_event(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "a")
        fake_nvml.gpus[1].processes = [(started.pid, 2 * GiB), (1, 1 * GiB)]
        fake_nvml.write()
        snap = await wait_for_event(stream, lambda e: isinstance(e, TelemetrySnapshot) and e.processes and
                                    e.processes[0].gpu_memory == 2 * GiB)
        g0, g1 = snap.gpus
        assert g0.processes == () and g1.mem_other == 1 * GiB
        assert [(p.pid, p.owner) for p in g1.processes][0] == (started.pid, "a")
        assert g1.processes[1].owner in (OWNER_OTHER, OWNER_UNKNOWN)  # unknown inside a container
        gate.touch()
        assert (await finish(sup))["a"] == "completed"
    saved = [json.loads(line) for line in (sup.run_dir / "telemetry.jsonl").read_text().splitlines()]
    assert any(p["gpu_memory"] == 2 * GiB for r in saved for p in r["processes"])


@pytest.mark.slow
def test_check_in_a_subprocess_plans_one_pipeline_per_fake_gpu(fake_nvml_library, tmp_path):
    driver = FakeDriver(tmp_path / "fake-nvml", fake_nvml_library, gpus(2))
    result = subprocess.run([sys.executable, "-m", "torchherd", "check", str(SAMPLE_CONFIGS / "digits.toml")],
                            env=driver.env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"GPU 0: NVIDIA A100-SXM4-80GB, 80.0 GiB ({uuid_of(0)})" in out
    assert "2 slots: gpu0 (NVIDIA A100-SXM4-80GB), gpu1 (NVIDIA A100-SXM4-80GB)" in out
    assert "sgd-lr0.05: " in out and "-> gpu0 (NVIDIA A100-SXM4-80GB)" in out
    assert "adam-lr1e-3: " in out and "-> gpu1 (NVIDIA A100-SXM4-80GB)" in out
    assert driver.calls(0)["nvmlDeviceGetName"] >= 1  # the fake answered, not a machine's own driver


# Regression: with CUDA_VISIBLE_DEVICES naming a lost GPU first, the note blamed the variable alone
@pytest.mark.slow
def test_a_subprocess_finds_the_fake_through_ld_library_path(fake_nvml_library, tmp_path):
    driver = FakeDriver(tmp_path / "fake-nvml", fake_nvml_library, gpus(2))
    driver.gpus[1].fail = GPU_IS_LOST
    driver.write()
    code = ("from torchherd.engine.hardware.devices import discover_devices\n"
            "inv = discover_devices()\n"
            "print([g.uuid for g in inv.gpus], inv.note, sep='|')\n")
    result = subprocess.run([sys.executable, "-c", code], env=driver.env(CUDA_VISIBLE_DEVICES="1,0"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    uuids, note = result.stdout.strip().split("|")
    assert uuids == "[]"
    # GPU 1 is lost, so CUDA_VISIBLE_DEVICES=1,0 names no usable GPU first (CUDA would stop there too): say so
    assert "GPU 1 skipped (NVMLError_GpuIsLost: GPU is lost)" in note and note.endswith("using CPU slots")
