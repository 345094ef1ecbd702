"""The telemetry sampler against an NVML stand-in with scripted readings, and against real processes."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, namedtuple
from contextlib import contextmanager
from types import SimpleNamespace

import psutil
import pynvml
import pytest

from torchherd.engine.protocol.messages import RunStarted, ValResult
from torchherd.engine.protocol.telemetry import (OWNER_OTHER, OWNER_UNKNOWN, GpuProcess, GpuSample, ProcessSample,
                                                 TelemetrySnapshot)
from torchherd.engine.protocol.records import from_record, to_record
from torchherd.engine.hardware.devices import discover_devices
from torchherd.engine.telemetry.sampler import TelemetrySampler

MiB = 1 << 20
NO_SUCH_PID = 4_194_303  # the largest pid_max allows; not running here
LOST = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
NOT_SUPPORTED = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class FakeNvml:
    """NVML stand-in. Each GPU is a dict of readings a test may change between passes;
    a reading that is an exception is raised, and `lost=True` makes every call raise GPU-is-lost."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *gpus: dict, init_error: Exception | None = None) -> None:
        self.gpus, self.init_error, self.calls = list(gpus), init_error, Counter()

    def _get(self, h, key):
        self.calls[(h, key)] += 1
        gpu = self.gpus[h]
        value = LOST if gpu.get("lost") else gpu[key]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit(self):
        self.calls["init"] += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls["shutdown"] += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h): return self._get(h, "name")
    def nvmlDeviceGetUUID(self, h): return self._get(h, "uuid")
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(total=self._get(h, "total"), used=self._get(h, "used"))
    def nvmlDeviceGetUtilizationRates(self, h): return self._get(h, "util")
    def nvmlDeviceGetTemperature(self, h, sensor): return self._get(h, "temp")
    def nvmlDeviceGetPowerUsage(self, h): return self._get(h, "power")
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self._get(h, "limit")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self._get(h, "procs")]


def gpu(i: int, procs=(), **readings) -> dict:
    base = dict(name=f"NVIDIA A100 #{i}", uuid=f"GPU-{i:04d}", total=80_000 * MiB, used=1_000 * MiB,
                util=SimpleNamespace(gpu=90, memory=40), temp=61, power=250_500, limit=400_000, procs=procs)
    return base | readings


@pytest.fixture(autouse=True)
def all_gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def wait_for(condition, timeout: float = 10.0, every: float = 0.05):
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")


# A busy-ish loop: ~2 ms of work every ~10 ms, about 20% of a core.
BUSY = "import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.002: pass\n    time.sleep(0.008)\n"
WORKER = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {BUSY!r}])\n" + BUSY


@contextmanager
def workers(n: int = 1):
    """n real worker processes, each with one busy child; all killed and gone after the block."""
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], start_new_session=True) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the worker and its child share the session's group
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        wait_for(lambda: not any(_group_alive(p.pid) for p in procs))


def _group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            pass
    return False


def assert_none_alive(procs) -> None:
    assert not any(_group_alive(p.pid) for p in procs)


# ------------------------------------------------------------- NVML stand-in

def test_one_pass_reads_every_gpu_and_names_owners():
    me = os.getpid()
    nvml = FakeNvml(gpu(0, procs=[(me, 3_000 * MiB), (1, 500 * MiB), (NO_SUCH_PID, 200 * MiB)]),
                    gpu(1, procs=[(me, None)], temp=NOT_SUPPORTED))
    sampler = TelemetrySampler(pids=lambda: {"mnist": me}, nvml=nvml, in_container=False)
    snap = sampler.sample_once()
    g0, g1 = snap.gpus
    assert (g0.index, g0.uuid, g0.util_gpu, g0.util_mem, g0.temperature) == (0, "GPU-0000", 90, 40, 61)
    assert (g0.mem_used, g0.mem_total, g0.power_draw, g0.power_limit) == (1_000 * MiB, 80_000 * MiB, 250.5, 400.0)
    assert g0.processes == (GpuProcess(pid=me, used_memory=3_000 * MiB, owner="mnist"),
                            GpuProcess(pid=1, used_memory=500 * MiB, owner=OWNER_OTHER),
                            GpuProcess(pid=NO_SUCH_PID, used_memory=200 * MiB, owner=OWNER_UNKNOWN))
    assert g0.mem_other == 700 * MiB and g0.note == ""
    assert g1.temperature is None and g1.util_gpu == 90 and g1.mem_other == 0  # one absence, not a failure
    assert snap.processes[0].gpu_memory == 3_000 * MiB  # the None reading on GPU 1 adds nothing
    assert snap.gpu_note == "" and snap.sample_ms > 0
    sampler.stop()
    assert nvml.calls["init"] == 1 and nvml.calls["shutdown"] == 1


def test_inside_a_container_pids_that_are_not_ours_have_unknown_owner():
    nvml = FakeNvml(gpu(0, procs=[(os.getpid(), 10 * MiB), (1, 20 * MiB)]))
    sampler = TelemetrySampler(pids=lambda: {"a": os.getpid()}, nvml=nvml, in_container=True)
    owners = [p.owner for p in sampler.sample_once().gpus[0].processes]
    assert owners == ["a", OWNER_UNKNOWN]  # pid 1 exists here, but may be a host pid
    sampler.stop()


def test_a_gpu_that_disappears_mid_way_is_reported_lost_and_not_asked_again():
    nvml = FakeNvml(gpu(0), gpu(1))
    sampler = TelemetrySampler(nvml=nvml, in_container=False)
    assert [g.util_gpu for g in sampler.sample_once().gpus] == [90, 90]
    nvml.gpus[1]["lost"] = True
    gone = sampler.sample_once().gpus[1]
    assert gone.note and "lost" in gone.note
    assert (gone.util_gpu, gone.mem_used, gone.temperature, gone.power_draw, gone.processes) == (None,) * 5
    asked = sum(n for key, n in nvml.calls.items() if isinstance(key, tuple) and key[0] == 1)
    snap = sampler.sample_once()
    assert sum(n for key, n in nvml.calls.items() if isinstance(key, tuple) and key[0] == 1) == asked
    assert snap.gpus[0].util_gpu == 90 and "lost" in snap.gpus[1].note  # the other GPU carries on
    sampler.stop()


def test_errors_that_are_not_loss_are_retried_on_the_next_pass():
    nvml = FakeNvml(gpu(0, procs=pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)))
    sampler = TelemetrySampler(nvml=nvml, in_container=False)
    first = sampler.sample_once().gpus[0]
    assert first.processes is None and first.mem_other is None and first.util_gpu == 90
    nvml.gpus[0]["procs"] = [(1, 5 * MiB)]
    assert sampler.sample_once().gpus[0].processes == (GpuProcess(pid=1, used_memory=5 * MiB, owner=OWNER_OTHER),)
    sampler.stop()


def test_no_nvml_means_no_gpus_one_line_and_no_retry():
    nvml = FakeNvml(init_error=pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    sampler = TelemetrySampler(nvml=nvml)
    snaps = [sampler.sample_once() for _ in range(3)]
    assert all(s.gpus == () for s in snaps)
    assert "no NVIDIA driver" in snaps[-1].gpu_note and "\n" not in snaps[-1].gpu_note
    sampler.stop()
    assert nvml.calls["init"] == 1 and nvml.calls["shutdown"] == 0


def test_cuda_visible_devices_limits_the_gpus_sampled(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0002,0")
    nvml = FakeNvml(gpu(0), gpu(1), gpu(2))
    sampler = TelemetrySampler(nvml=nvml)
    assert [g.index for g in sampler.sample_once().gpus] == [2, 0]
    assert not any(key == (1, "util") for key in nvml.calls)
    sampler.stop()


def test_real_nvml_gives_the_gpus_discovery_finds_or_one_line_saying_why():
    inventory = discover_devices()  # the same driver, asked by the other code path
    sampler = TelemetrySampler()
    snap = sampler.sample_once()
    assert [g.uuid for g in snap.gpus] == [g.uuid for g in inventory.gpus]
    if not inventory.gpus:  # the usual case on CI: no driver is a note, not an error
        assert snap.gpu_note and "\n" not in snap.gpu_note
    assert 0 < snap.host_mem_used < snap.host_mem_total and snap.load1 is not None
    sampler.stop()


CpuTimes = namedtuple("CpuTimes", psutil.cpu_times()._fields)  # this platform's fields


def cpu_times(user: float, idle: float) -> CpuTimes:
    """A psutil.cpu_times() reading in seconds; every other field is 0."""
    return CpuTimes(**(dict.fromkeys(CpuTimes._fields, 0.0) | {"user": user, "idle": idle}))


def test_host_cpu_is_the_busy_share_of_all_cores_between_readings(monkeypatch):
    readings = iter([cpu_times(10, 90),     # taken when the sampler is made
                     cpu_times(10, 90),     # pass 1: nothing elapsed, no reading yet
                     cpu_times(40, 160),    # pass 2: 30 of 100 CPU-seconds busy
                     cpu_times(40, 160.01),  # pass 3: one tick later, too little to measure
                     cpu_times(90, 210)])   # pass 4: 50 of 100.0 since pass 2
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(readings))
    sampler = TelemetrySampler(nvml=FakeNvml())
    assert [sampler.sample_once().host_cpu_percent for _ in range(4)] == [None, 30.0, 30.0, 50.0]
    sampler.stop()


# Regression: every pass replaced the host CPU baseline, so a pass less than one /proc/stat tick (10 ms)
# after the previous one reported host_cpu_percent None; test_workers_and_their_children_are_measured
# failed that way under load, when its two sample_once() calls landed in the same tick.
def test_back_to_back_passes_keep_the_host_cpu_reading():
    sampler = TelemetrySampler(nvml=FakeNvml())
    first = wait_for(lambda: sampler.sample_once().host_cpu_percent is not None)
    readings = [sampler.sample_once().host_cpu_percent for _ in range(50)]
    assert first and None not in readings and all(0.0 <= r <= 100.0 for r in readings)
    sampler.stop()


# ------------------------------------------------------------ real processes

def test_workers_and_their_children_are_measured():
    with workers(1) as (w,):
        nvml = FakeNvml(gpu(0))
        sampler = TelemetrySampler(pids=lambda: {"mnist": w.pid}, nvml=nvml, in_container=False, tree_every=0)
        # the child has started, and the host has a CPU reading to keep
        wait_for(lambda: (s := sampler.sample_once()).processes[0].children == 1 and s.host_cpu_percent is not None)
        child = psutil.Process(w.pid).children()[0].pid
        nvml.gpus[0]["procs"] = [(w.pid, 700 * MiB), (child, 100 * MiB)]  # a DataLoader worker on the GPU too
        snap = wait_for(lambda: (s := sampler.sample_once()).processes[0].cpu_percent and s)
        p = snap.processes[0]
        assert p.pid == w.pid and p.children == 1 and p.rss > 1 * MiB and p.cpu_percent > 0
        assert p.gpu_memory == 800 * MiB and snap.gpus[0].mem_other == 0
        assert {gp.owner for gp in snap.gpus[0].processes} == {"mnist"}
        assert snap.host_cpu_percent is not None
        sampler.stop()
    assert_none_alive([w])


def test_a_worker_that_exits_is_dropped_without_an_error():
    with workers(2) as (a, b):
        nvml = FakeNvml(gpu(0, procs=[(a.pid, 1 * MiB)]))
        sampler = TelemetrySampler(pids=lambda: {"a": a.pid, "b": b.pid}, nvml=nvml, in_container=False)
        assert [p.pipeline for p in sampler.sample_once().processes] == ["a", "b"]
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(timeout=10)
        snap = sampler.sample_once()  # pids() still names it, and NVML still lists it
        assert [p.pipeline for p in snap.processes] == ["b"]
        assert snap.gpus[0].processes[0].owner == OWNER_UNKNOWN
        sampler.stop()
    assert_none_alive([a, b])


def test_a_worker_that_ended_but_is_not_reaped_yet_is_dropped_too():
    # Regression: a finished pipeline's row read "RSS 0M" in the devices pane: its worker, a zombie until
    # reaped, was still read (no memory, a last CPU share), and the run's last snapshot kept it.
    with workers(2) as (a, b):
        sampler = TelemetrySampler(pids=lambda: {"a": a.pid, "b": b.pid}, nvml=FakeNvml(), in_container=False)
        assert [p.pipeline for p in sampler.sample_once().processes] == ["a", "b"]
        os.killpg(a.pid, signal.SIGKILL)
        wait_for(lambda: psutil.Process(a.pid).status() == psutil.STATUS_ZOMBIE)  # not waited for: not reaped
        snap = sampler.sample_once()
        assert [(p.pipeline, p.rss > 0) for p in snap.processes] == [("b", True)]
        a.wait(timeout=10)
        sampler.stop()
    assert_none_alive([a, b])


# ----------------------------------------------------------- thread and file

def test_the_thread_delivers_snapshots_survives_a_bad_callback_and_stops():
    nvml, got, threads = FakeNvml(gpu(0)), [], set()

    def on_snapshot(snap):
        got.append(snap)
        threads.add(threading.current_thread().name)
        if len(got) == 2:
            raise RuntimeError("a consumer's bug")

    sampler = TelemetrySampler(interval=0.01, on_snapshot=on_snapshot, nvml=nvml)
    sampler.start()
    wait_for(lambda: len(got) >= 4)
    assert threads == {"torchherd-telemetry"}  # called on the sampler's thread, never the caller's
    sampler.stop()
    assert not any(t.name == "torchherd-telemetry" for t in threading.enumerate())
    assert sampler.latest is got[-1] and nvml.calls["init"] == 1 and nvml.calls["shutdown"] == 1


def test_every_snapshot_is_persisted_when_asked_and_reads_back(tmp_path):
    path, got = tmp_path / "run" / "telemetry.jsonl", []
    sampler = TelemetrySampler(interval=0.01, on_snapshot=got.append, nvml=FakeNvml(gpu(0, procs=[(1, MiB)])),
                               persist_path=path, persist_every=0)
    sampler.start()
    wait_for(lambda: len(got) >= 3)
    sampler.stop()
    lines = path.read_text().splitlines()
    assert [from_record(json.loads(line)) for line in lines] == got
    assert json.loads(lines[0])["type"] == "telemetry"


def test_extend_adds_other_nodes_rows_before_they_are_persisted_and_delivered(tmp_path):
    path, got = tmp_path / "telemetry.jsonl", []
    remote = ProcessSample(pipeline="b", pid=9, cpu_percent=1.0, rss=1, children=0, node="node2")
    calls = []

    def extend(snap):
        calls.append(snap)
        if len(calls) == 2:
            raise RuntimeError("a node's bug")  # that pass still goes out, with this machine's rows
        return dataclasses.replace(snap, processes=snap.processes + (remote,))

    sampler = TelemetrySampler(interval=0.01, on_snapshot=got.append, nvml=FakeNvml(), extend=extend,
                               persist_path=path, persist_every=0)
    sampler.start()
    wait_for(lambda: len(got) >= 3)
    sampler.stop()
    assert [remote in s.processes for s in got[:3]] == [True, False, True]
    saved = [from_record(json.loads(line)) for line in path.read_text().splitlines()]
    assert saved == got and saved[0].processes[-1].node == "node2"


def test_the_pane_names_other_nodes_and_leaves_local_rows_alone():
    from torchherd.tui.widgets.device_pane import describe

    snap = TelemetrySnapshot(
        gpus=(GpuSample(index=0, uuid="u0", name="H"), GpuSample(index=0, uuid="u1", name="H", node="node2")),
        processes=(ProcessSample(pipeline="a", pid=7, cpu_percent=None, rss=None, children=0),
                   ProcessSample(pipeline="b", pid=8, cpu_percent=None, rss=None, children=0, node="node2")))
    lines = describe(snap).plain.splitlines()
    assert lines[0].startswith("GPU0 ") and lines[1].startswith("node2:GPU0 ")
    assert lines[-2].startswith(" a ") and lines[-1].startswith(" node2:b ")


def test_persistence_is_at_a_lower_rate(tmp_path):
    path, got = tmp_path / "telemetry.jsonl", []
    sampler = TelemetrySampler(interval=0.01, on_snapshot=got.append, nvml=FakeNvml(),
                               persist_path=path, persist_every=3600)
    sampler.start()
    wait_for(lambda: len(got) >= 5)
    sampler.stop()
    assert len(path.read_text().splitlines()) == 1  # the first, then one an hour


# ------------------------------------------------------------------ messages

def test_snapshots_round_trip_through_json():
    snap = TelemetrySnapshot(
        gpus=(GpuSample(index=0, uuid="GPU-1", name="L4", util_gpu=None, mem_total=24 * MiB,
                        processes=(GpuProcess(pid=7, used_memory=None, owner=OWNER_UNKNOWN),), mem_other=0),
              GpuSample(index=1, uuid="GPU-2", name="L4", note="GPU is lost")),
        processes=(ProcessSample(pipeline="a", pid=7, cpu_percent=None, rss=10, children=2),),
        host_cpu_percent=12.5, load1=None, sample_ms=0.4)
    assert from_record(json.loads(json.dumps(to_record(snap)))) == snap


def test_other_messages_still_round_trip():
    for msg in (RunStarted(run_id="r", run_dir="d", config_path="c", pipelines=("a", "b")),
                ValResult(pipeline="a", epoch=1, step=2, metrics={"acc": 0.5})):
        assert from_record(json.loads(json.dumps(to_record(msg)))) == msg


def test_stop_from_the_callback_ends_the_thread_and_shuts_nvml_down():
    nvml = FakeNvml(gpu(0))
    sampler = TelemetrySampler(interval=0.01, nvml=nvml, on_snapshot=lambda snap: sampler.stop())
    sampler.start()
    wait_for(lambda: nvml.calls["shutdown"] == 1)
    wait_for(lambda: not any(t.name == "torchherd-telemetry" for t in threading.enumerate()))
    assert nvml.calls["init"] == 1


def test_a_bad_pids_callback_costs_the_workers_not_the_gpus():
    calls = []

    def pids():
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("supervisor bug")
        return {"queued": None, "starting": 0}  # pids not known yet: never psutil.Process(None), i.e. us

    sampler = TelemetrySampler(pids=pids, nvml=FakeNvml(gpu(0)))
    first, second = sampler.sample_once(), sampler.sample_once()
    assert first.processes == () == second.processes and first.gpus[0].util_gpu == 90
    sampler.stop()
