"""Faults on the status pipes: a flood of step reports, a supervisor that stops reading, a kill mid-write.

A worker never waits on its pipe for long: reports beyond a bound are dropped and
counted, events that must arrive wait in the worker, and each worker has its own
pipe, so one that floods, stalls or dies mid-write leaves the others alone.
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import signal
import struct
import termios
import threading
import time

import pytest
import torch

from torchherd.engine.protocol.messages import CheckpointSaved, EpochEnd, PipelineFinished, StepMetrics, WorkerExited, WorkerStarted
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.faults.support import RecordingLauncher, faulty_config, finish, of, run_events, supervised

pytestmark = pytest.mark.slow

FLOOD = {"batch_size": 1, "log_every_n_steps": 1, "params": {"samples": 1500}}  # a report per step, no delay
LONG_FLOOD = {**FLOOD, "params": {"samples": 5000}}
# Floods until the test stops it: catching a torn batch can take many tries on a loaded machine, and a worker
# that completed first closed the very pipe the test was watching ("handle is closed").
ENDLESS = {**LONG_FLOOD, "max_epochs": 1000}
CALM = {"params": {"samples": 256, "delay": 0.002}}


def supervisor(config) -> tuple[Supervisor, RecordingLauncher]:
    launcher = RecordingLauncher()
    return Supervisor(config, launcher=launcher), launcher


def status_handle(launcher: RecordingLauncher, name: str):
    """The ProcessHandle of a pipeline's worker: the faults below are done to its status pipe."""
    handle = launcher.handles.get(name)
    assert handle is not None, f"{name} has no worker"
    return handle


def status_fd(handle) -> int:
    return handle.status_fd


def stop_reading(handle) -> None:
    handle.pause_reading()


def start_reading(handle) -> None:
    handle.resume_reading()


def unread_bytes(handle) -> int:
    buf = fcntl.ioctl(status_fd(handle), termios.FIONREAD, b"\0\0\0\0")
    return struct.unpack("i", buf)[0]


async def pipe_full(handle, timeout: float = 60.0) -> int:
    """Wait until a flooding worker's unread bytes stop growing: its writer is blocked on the full pipe."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    before = -1
    while True:
        now = unread_bytes(handle)
        if now >= 16_384 and now == before:  # a pipe holds ~58 KiB on Linux, depending on how writes pack
            return now
        assert loop.time() < deadline, f"the pipe never filled (last {now} bytes unread)"
        before = now
        await asyncio.sleep(0.25)


async def poll(predicate, timeout: float, what: str, interval: float = 0.02):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := predicate()):
        assert loop.time() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(interval)
    return value


def last_checkpoint_epoch(sup: Supervisor, name: str) -> int:
    path = sup.run_dir / name / "checkpoints" / "last.pt"
    try:
        return torch.load(path, weights_only=False)["epoch"]
    except Exception:  # not there yet, or being replaced this instant
        return -1


async def test_a_flood_and_a_kill_mid_write_leave_the_other_channels_alone(tmp_path):
    # The victim is caught while still training; "flood" and "calm" wait at a gate until it has been killed,
    # however long catching it takes on a loaded machine, so both are still running when it dies.
    gate = tmp_path / "victim-killed"
    config = faulty_config(tmp_path, [{"name": "flood", **LONG_FLOOD,
                                       "params": {**LONG_FLOOD["params"], "gate_file": str(gate), "gate_at_call": 2000}},
                                      {"name": "victim", **ENDLESS},
                                      {"name": "calm", "params": {"samples": 256, "delay": 0.002,
                                                                  "gate_file": str(gate), "gate_at_call": 3}}],
                           defaults={"max_epochs": 3}, devices={"cpu_slots": 3}, restart={"min_uptime": 0.0})
    sup, launcher = supervisor(config)
    async with supervised(sup) as stream:
        victim = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "victim")
        # Killed halfway through writing a batch: the SIGKILL leaves that batch torn in its pipe.
        await freeze_mid_write(status_handle(launcher, "victim"), victim.pid)
        os.kill(victim.pid, signal.SIGKILL)
        killed = await wait_for(stream, lambda e: isinstance(e, WorkerExited) and e.pipeline == "victim")
        assert killed.signal == "SIGKILL"
        gate.touch()
        # Its next attempt reports over a channel of its own, untouched by the torn batch; then it is stopped.
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "victim" and e.time > killed.time)
        sup.stop("victim")
        statuses = await finish(sup, timeout=120)
    assert statuses == {"flood": "completed", "victim": "stopped", "calm": "completed"}
    events = run_events(sup)
    for name in ("flood", "calm"):
        # Their reports kept arriving after the kill, and nothing that must arrive went missing.
        assert [e for e in of(events, StepMetrics, name) if e.time > killed.time]
        assert [e.epoch for e in of(events, EpochEnd, name)] == [0, 1, 2]
        assert len(of(events, WorkerStarted, name)) == 1
        steps = [e.step for e in of(events, StepMetrics, name)]
        assert steps == sorted(steps)
    flood = of(events, StepMetrics, "flood")
    # Every step is accounted for: reported, or counted as dropped in the next report.
    assert len(flood) + sum(e.dropped for e in flood) >= 3 * 5000 - 1


async def test_a_supervisor_that_stops_reading_never_deadlocks_a_worker(tmp_path):
    config = faulty_config(tmp_path, [{"name": "stalled", **FLOOD}, {"name": "forever", **FLOOD},
                                      {"name": "calm", **CALM}],
                           defaults={"max_epochs": 3}, devices={"cpu_slots": 3})
    sup, launcher = supervisor(config)
    async with supervised(sup):
        # From the moment they are spawned, not one byte of theirs is read.
        handles = {n: status_handle(launcher, n) for n in ("stalled", "forever")}
        for handle in handles.values():
            stop_reading(handle)
        for handle in handles.values():
            await pipe_full(handle)
        # Unread, they train on: their checkpoints move although not one event of theirs gets through.
        await poll(lambda: last_checkpoint_epoch(sup, "stalled") >= 2, 60, "stalled to train two epochs unread")
        assert not sup.finished and sup.view("stalled").epoch == 0
        start_reading(handles["stalled"])
        # "forever" is never read again: it finishes training, gives its events 10 s and exits on its own.
        statuses = await finish(sup, timeout=120)
    assert statuses == {"stalled": "completed", "forever": "completed", "calm": "completed"}
    events = run_events(sup)
    # Once read again, everything that must arrive did, and every step report is there or counted as dropped.
    assert [e.epoch for e in of(events, EpochEnd, "stalled")] == [0, 1, 2]
    assert [e.reason for e in of(events, CheckpointSaved, "stalled") if e.reason != "best"] == \
        ["epoch", "epoch", "epoch", "final"]
    stalled = of(events, StepMetrics, "stalled")
    assert len(stalled) + sum(e.dropped for e in stalled) == 3 * 1500
    for name in ("stalled", "forever"):
        exited = of(events, WorkerExited, name)
        assert len(exited) == 1 and exited[0].exit_code == 0 and exited[0].reason == "completed"
        assert of(events, PipelineFinished, name)[0].status == "completed"
    assert last_checkpoint_epoch(sup, "forever") == 3  # it did train to the end
    assert [e.epoch for e in of(events, EpochEnd, "calm")] == [0, 1, 2]


def torn_batch_at_end(handle) -> bool:
    """Whether the unread bytes end halfway through a batch; looked at with tee(2), so nothing is consumed."""
    libc = ctypes.CDLL(None, use_errno=True)
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        n = libc.tee(status_fd(handle), w, 1 << 20, 2)  # SPLICE_F_NONBLOCK
        assert n >= 0, os.strerror(ctypes.get_errno())
        data = b""
        while len(data) < n:
            data += os.read(r, n - len(data))
    finally:
        os.close(r)
        os.close(w)
    # The supervisor may have read the start of a batch before it stopped reading: the pipe's bytes
    # carry on from what it holds.
    data = handle.status_held + data
    i = 0
    while i + 4 <= len(data):
        (size,) = struct.unpack("!i", data[i:i + 4])  # multiprocessing.connection's frame header
        assert 0 < size < 1 << 24, f"a frame header of {size} bytes: the stream is misread"
        if i + 4 + size > len(data):
            return True
        i += 4 + size
    return i != len(data)


async def freeze_mid_write(handle, pid: int, tries: int = 100) -> None:
    """SIGSTOP the worker while its pipe is full and it is halfway through writing a batch.

    A write under 4 KiB is atomic, so not every full pipe ends in a torn batch: look,
    and if not, let it go on and try again (on a loaded machine, dozens of times: the workers flood endlessly).
    """
    for _ in range(tries):
        stop_reading(handle)
        await pipe_full(handle)
        os.kill(pid, signal.SIGSTOP)
        if torn_batch_at_end(handle):
            return
        os.kill(pid, signal.SIGCONT)
        start_reading(handle)
        await poll(lambda: unread_bytes(handle) < 16_384, 30, "the supervisor to catch up")
    os.kill(pid, signal.SIGCONT)
    pytest.fail("never caught the worker halfway through writing a batch")


# Regression: the status reader (now ChannelHandle._readable) used a blocking recv_bytes(), so a worker frozen
# half-way through writing a batch (SIGSTOP, a cgroup freezer) froze the supervisor and every other pipeline's events.
async def test_a_worker_frozen_mid_write_does_not_freeze_the_supervisor(tmp_path):
    config = faulty_config(tmp_path, [{"name": "frozen", **ENDLESS}, {"name": "calm", **CALM}],
                           defaults={"max_epochs": 3}, devices={"cpu_slots": 2})
    sup, launcher = supervisor(config)
    responsive = threading.Event()
    in_time: list[bool] = []
    async with supervised(sup) as stream:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "frozen")
        handle = status_handle(launcher, "frozen")
        await freeze_mid_write(handle, started.pid)
        loop = asyncio.get_running_loop()

        def watchdog() -> None:
            # Off the event loop: once the supervisor has read all it can, is its loop still turning?
            try:
                deadline = time.monotonic() + 10.0
                while unread_bytes(handle) and time.monotonic() < deadline:
                    time.sleep(0.05)
                loop.call_soon_threadsafe(responsive.set)
                in_time.append(responsive.wait(5.0))
            finally:
                os.kill(started.pid, signal.SIGCONT)  # never leave it frozen, whatever happened

        dog = threading.Thread(target=watchdog, daemon=True)
        dog.start()
        start_reading(handle)
        await asyncio.to_thread(dog.join, 30)
        sup.stop("frozen")  # thawed, it reports and stops as asked
        assert await finish(sup) == {"frozen": "stopped", "calm": "completed"}
    assert in_time == [True], "the supervisor's event loop stood still while one worker was frozen mid-write"
