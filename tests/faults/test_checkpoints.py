"""Faults around checkpoints: a corrupt last.pt, a write cut short by SIGKILL, a full disk.

Nothing already saved is lost: resume falls back to prev.pt (and says so), an
interrupted write never replaces the checkpoint before it, and a failed write is
an error notice while training goes on.
"""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch

from torchherd.engine.worker import checkpoint as ckpt
from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, Notice, PipelineFinished, Resumed, TrainingStarted,
                             WorkerExited, WorkerStarted)
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.faults.support import faulty_config, finish, of, run_events, supervised

pytestmark = pytest.mark.slow


def load(path: Path) -> dict:
    state = torch.load(path, weights_only=False)
    assert isinstance(state, dict) and "model" in state, path
    return state


def ckpt_dir(sup: Supervisor, name: str) -> Path:
    return sup.run_dir / name / "checkpoints"


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob(".*.tmp"))


async def test_corrupt_last_checkpoint_falls_back_to_prev(tmp_path):
    config = faulty_config(tmp_path, [{"name": "a", "params": {"samples": 256, "delay": 0.004}}],
                           defaults={"max_epochs": 6})
    directory = None

    async def stop_after_two_epoch_checkpoints(sup, stream):
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch" and e.epoch >= 2)
        sup.stop("a")
        assert (await wait_for(stream, lambda e: isinstance(e, PipelineFinished))).status == "stopped"

    # 1. A run that stops with last.pt (the stop) and prev.pt (an epoch end); then last.pt is truncated
    #    and the same supervisor restarts the pipeline.
    sup = Supervisor(config)
    async with supervised(sup) as stream:
        await stop_after_two_epoch_checkpoints(sup, stream)
        directory = ckpt_dir(sup, "a")
        prev = load(directory / ckpt.PREV)
        data = (directory / ckpt.LAST).read_bytes()
        (directory / ckpt.LAST).write_bytes(data[: len(data) // 2])
        sup.restart("a")
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        assert Path(resumed.path).name == ckpt.PREV and (resumed.epoch, resumed.step) == (prev["epoch"], prev["step"])
        assert "last.pt unreadable" in resumed.note and "resumed from prev.pt" in resumed.note
        await stop_after_two_epoch_checkpoints(sup, stream)
    notices = [e for e in of(run_events(sup), Notice, "a") if "unreadable" in e.text]
    assert len(notices) == 1 and notices[0].level == "warning" and "last.pt" in notices[0].text

    # 2. last.pt overwritten with garbage; a second supervisor on the same run directory resumes it.
    prev = load(directory / ckpt.PREV)
    (directory / ckpt.LAST).write_bytes(os.urandom(4096))
    again = Supervisor(config, run_id=sup.run_id)
    assert again.run_dir == sup.run_dir
    async with supervised(again) as stream:
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        assert Path(resumed.path).name == ckpt.PREV and resumed.step == prev["step"]
        assert "last.pt unreadable" in resumed.note
        started = await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        assert (started.epoch, started.step) == (prev["epoch"], prev["step"])
        assert await finish(again) == {"a": "completed"}
    assert load(directory / ckpt.LAST)["epoch"] == 6


async def test_sigkill_mid_write_never_replaces_the_previous_checkpoint(tmp_path):
    # 32 MiB checkpoints (best.pt and last.pt every epoch) and 2 steps an epoch: the worker mostly writes.
    config = faulty_config(tmp_path, [{"name": "big", "params": {"samples": 64, "ballast_mb": 32}}],
                           defaults={"max_epochs": 12}, restart={"min_uptime": 0.0, "max_restarts": 10})
    sup = Supervisor(config)
    seen = sup.subscribe()  # every event, read in full after each kill
    saved: list[CheckpointSaved] = []
    caught_mid_write = 0
    kills = 3
    async with supervised(sup) as stream:
        directory = ckpt_dir(sup, "big")
        loop = asyncio.get_running_loop()
        for attempt in range(1, kills + 1):
            started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.attempt == attempt)
            # Let each attempt save one whole 'last' first, so every kill has something to lose.
            await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch")
            while (e := seen.get_nowait()) is not None:
                if isinstance(e, CheckpointSaved) and e.reason == "epoch":
                    saved.append(e)
            # Kill the moment the next write is in flight (its temporary file exists).
            deadline = loop.time() + 30
            while not temp_files(directory):
                assert loop.time() < deadline, "no checkpoint write seen in 30 s"
                await asyncio.sleep(0.002)
            os.kill(started.pid, signal.SIGKILL)
            exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
            assert exited.signal == "SIGKILL" and exited.reason == "crashed"
            if temp_files(directory):
                caught_mid_write += 1  # the write was cut short: its temporary file is left behind
            for name in (ckpt.LAST, ".last.new.pt", ckpt.PREV, ckpt.BEST):
                if (directory / name).exists():
                    load(directory / name)
            # What the supervisor was told is saved is still there: the newest readable is at least that.
            state, path, note = ckpt.load_latest(directory)
            assert state is not None and note == "", (path, note)
            assert state["step"] >= saved[-1].step
        assert await finish(sup) == {"big": "completed"}
    assert caught_mid_write >= 1, "never killed it mid-write; the test proved nothing"
    assert load(directory / ckpt.LAST)["epoch"] == 12
    events = run_events(sup)
    assert [e.epoch for e in of(events, EpochEnd, "big")][-1] == 11
    resumed = of(events, Resumed, "big")
    assert len(resumed) == kills and all(r.note == "" for r in resumed)  # never needed a fallback
    # Regression: a write killed mid-way used to leave its '.NAME.PID.tmp' (32 MiB here) forever.
    assert temp_files(directory) == []


async def test_full_disk_fails_the_checkpoint_keeps_the_old_one_and_trains_on(tmp_path):
    marker = tmp_path / "disk-full"
    config = faulty_config(tmp_path, [{"name": "full", "params": {"samples": 256, "delay": 0.004,
                                                                  "disk_full_file": str(marker)}}],
                           defaults={"max_epochs": 4})
    sup = Supervisor(config)
    async with supervised(sup) as stream:
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch")
        sup.pause("full")
        sup.checkpoint("full")  # answered from the pause loop: proves the worker holds still now
        good = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        directory = ckpt_dir(sup, "full")
        before = {n: (directory / n).read_bytes() for n in (ckpt.LAST, ckpt.PREV, ckpt.BEST)}
        marker.touch()  # the disk is full from now on
        sup.checkpoint("full")
        failed = await wait_for(stream, lambda e: isinstance(e, Notice) and e.level == "error")
        assert failed.pipeline == "full" and "checkpoint failed" in failed.text
        assert "No space left on device" in failed.text
        assert {n: (directory / n).read_bytes() for n in before} == before  # untouched, byte for byte
        assert load(directory / ckpt.LAST)["step"] == good.step
        assert temp_files(directory) == [] and not (directory / ".last.new.pt").exists()
        sup.unpause("full")
        assert await finish(sup) == {"full": "completed"}
    events = run_events(sup)
    assert [e.epoch for e in of(events, EpochEnd, "full")] == [0, 1, 2, 3]
    failures = [e for e in of(events, Notice, "full") if "checkpoint failed" in e.text]
    assert len(failures) >= 2  # the requested one and the epoch ends after it
    assert not [e for e in of(events, CheckpointSaved, "full") if e.time > failed.time]
    assert {n: (directory / n).read_bytes() for n in before} == before
    assert temp_files(directory) == []
