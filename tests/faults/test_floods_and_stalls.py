"""Faults on the status pipes: a flood of step reports, a supervisor that stops reading, a kill mid-write.

A worker never waits on its pipe for long: reports beyond a bound are dropped and
counted, events that must arrive wait in the worker, and each worker has its own
pipe, so one that floods, stalls or dies mid-write leaves the others alone.
"""
from __future__ import annotations

import asyncio
import ctypes
import errno
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
# Floods until the test stops it: a worker that completed while the test was still catching it halfway through
# a batch (a loaded machine can take its time) would close the very pipe the test was watching.
ENDLESS = {**LONG_FLOOD, "max_epochs": 1000}
CALM = {"params": {"samples": 256, "delay": 0.002}}
PAGE = os.sysconf("SC_PAGE_SIZE")  # the smallest a pipe can be made


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


async def pipe_full(handle, at_least: int = 16_384, settle: float = 0.25, timeout: float = 120.0) -> int:
    """Wait until a flooding worker's unread bytes (at least `at_least`) stop growing for `settle` seconds: its
    writer is blocked on the full pipe (a 16-page pipe holds ~58 KiB on Linux, depending on how writes pack)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    before, since = -1, loop.time()
    while True:
        now, at = unread_bytes(handle), loop.time()
        if now != before:
            before, since = now, at
        elif now >= at_least and at - since >= settle:
            return now
        assert at < deadline, f"the pipe never filled (last {now} bytes unread)"
        await asyncio.sleep(0.05)


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
        killed = await wait_for(stream, lambda e: isinstance(e, WorkerExited) and e.pipeline == "victim", 120)
        assert killed.signal == "SIGKILL"
        gate.touch()
        # Its next attempt reports over a channel of its own, untouched by the torn batch; then it is stopped.
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "victim" and e.time > killed.time,
                       180)
        sup.stop("victim")
        statuses = await finish(sup, timeout=240)
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
        await poll(lambda: last_checkpoint_epoch(sup, "stalled") >= 2, 180, "stalled to train two epochs unread")
        assert not sup.finished and sup.view("stalled").epoch == 0
        start_reading(handles["stalled"])
        # "forever" is never read again: it finishes training, gives its events 10 s and exits on its own.
        statuses = await finish(sup, timeout=240)
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


def shrink_pipe(handle) -> bool:
    """Give a worker's status pipe a single page; False while more than that is unread (the kernel refuses)."""
    try:
        fcntl.fcntl(status_fd(handle), fcntl.F_SETPIPE_SZ, PAGE)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True


def batch_left(handle) -> int:
    """Bytes of the batch the supervisor has begun reading that it has not read yet (0 at a batch boundary)."""
    held = handle.status_held
    if len(held) < 4:
        return 0
    (size,) = struct.unpack("!i", held[:4])  # multiprocessing.connection's frame header
    assert 0 < size < 1 << 24, f"a frame header of {size} bytes: the stream is misread"
    return 4 + size - len(held)


async def stop_reading_mid_batch(handle, capacity: int, within: float) -> bool:
    """Let the supervisor read until it has begun a batch whose unread rest is bigger than the pipe, and stop
    reading right there: the worker can then never finish writing it. False if none came `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if batch_left(handle) > capacity:
            stop_reading(handle)
            return True
        # One turn of the event loop: the supervisor reads the pipe at most once meanwhile, and a one-page
        # pipe gives it at most a page, so no batch over two pages gets by unseen.
        await asyncio.sleep(0)
    return False


async def freeze_mid_write(handle, pid: int, rounds: int = 8) -> None:
    """SIGSTOP the worker while its pipe is full and it is halfway through writing a batch: certain, at once.

    A write of up to 4 KiB (PIPE_BUF) is atomic, so a writer blocked on a full pipe may sit between two whole
    batches. Instead the worker's pipe is shrunk to one page (as Linux does to every new pipe of a user
    past fs.pipe-user-pages-soft) and its writer held on it while step reports pile up behind it; once
    reading again, the supervisor is stopped as soon as it has begun a batch with more left than the pipe
    holds. Unread, that batch stays torn whatever the scheduler does; a round where the pile was too small
    to tell holds the writer twice as long the next time.
    """
    await poll(lambda: shrink_pipe(handle), 60, "the status pipe to hold no more than a page")
    capacity = fcntl.fcntl(status_fd(handle), fcntl.F_GETPIPE_SZ)
    hold = 0.25
    for _ in range(rounds):
        stop_reading(handle)
        await pipe_full(handle, at_least=1, settle=hold)
        start_reading(handle)
        if await stop_reading_mid_batch(handle, capacity, within=max(2.0, hold)):
            break
        hold *= 2
    else:
        pytest.fail(f"no batch over {capacity} bytes in {rounds} rounds of holding the worker's writer")
    await pipe_full(handle, at_least=1)  # its writer has put in what fits of that batch and waits for room
    os.kill(pid, signal.SIGSTOP)
    assert torn_batch_at_end(handle), "the worker finished a batch bigger than its pipe, unread"


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
            # Off the event loop: once the supervisor has read all it can, is its loop still turning? A loop
            # blocked on the torn batch never turns while the worker is frozen, so the waits can be generous.
            try:
                deadline = time.monotonic() + 60.0
                while unread_bytes(handle) and time.monotonic() < deadline:
                    time.sleep(0.05)
                loop.call_soon_threadsafe(responsive.set)
                in_time.append(responsive.wait(60.0))
            finally:
                os.kill(started.pid, signal.SIGCONT)  # never leave it frozen, whatever happened

        dog = threading.Thread(target=watchdog, daemon=True)
        dog.start()
        start_reading(handle)
        await asyncio.to_thread(dog.join, 150)
        sup.stop("frozen")  # thawed, it reports and stops as asked
        assert await finish(sup, timeout=180) == {"frozen": "stopped", "calm": "completed"}
    assert in_time == [True], "the supervisor's event loop stood still while one worker was frozen mid-write"
