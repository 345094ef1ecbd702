"""Checkpoints written off the training thread, on a slow disk (a write that waits on a gate file), and the
`keep_last` checkpoints a run keeps.

Training steps on while a write is in flight; a second save waits for it, saying so; a SIGKILL mid-write
resumes from the checkpoint before, weights and all; retention leaves `keep_last` checkpoints and the best.
"""
from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from tests.conftest import wait_for
from tests.faults.support import faulty_config, finish, of, run_events, supervised
from torchherd.engine.protocol.messages import (
    CheckpointSaved,
    Notice,
    Resumed,
    StepMetrics,
    TrainingStarted,
    WorkerExited,
    WorkerStarted,
)
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.engine.worker import checkpoint as ckpt
from torchherd.tui.verbs import list_command

pytestmark = pytest.mark.slow
STEPS_PER_EPOCH = 8  # 256 samples, batches of 32


def checksum(value: object) -> str:
    """A digest of a state dict: every tensor's bytes and every plain value, in order."""
    digest = hashlib.sha256()

    def feed(v: object) -> None:
        if isinstance(v, torch.Tensor):
            digest.update(str((v.dtype, tuple(v.shape))).encode())
            digest.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        elif isinstance(v, dict):
            for k in v:
                digest.update(repr(k).encode())
                feed(v[k])
        elif isinstance(v, (list, tuple)):
            for x in v:
                feed(x)
        else:
            digest.update(repr(v).encode())

    state = torch.load(io.BytesIO(Path(str(value)).read_bytes()), weights_only=False)
    feed({k: state[k] for k in ("model", "optimizer", "epoch", "step")})
    return digest.hexdigest()


async def until_writing(directory: Path) -> None:
    """Until a checkpoint's write is in flight: its temporary file is there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not list(directory.glob(".*.tmp")):
        assert loop.time() < deadline, "no checkpoint write seen in 60 s"
        await asyncio.sleep(0.005)


def gated(tmp_path: Path, gate: Path, after: int, **top) -> object:
    params = {"samples": 256, "delay": 0.001, "save_gate_file": str(gate), "save_gate_after": after}
    top.setdefault("defaults", {})
    top["defaults"] = {"max_epochs": 3, "log_every_n_steps": 1, **top["defaults"]}
    return faulty_config(tmp_path, [{"name": "a", "params": params}], validation={"mode": "off"}, **top)


async def test_training_steps_on_while_its_checkpoint_is_written(tmp_path):
    gate = tmp_path / "gate"
    sup = Supervisor(gated(tmp_path, gate, after=0))
    async with supervised(sup) as stream:
        await until_writing(sup.run_dir / "a" / "checkpoints")  # epoch 1's checkpoint, held at the gate
        # The whole of epoch 2 trains while it is written; then epoch 2's checkpoint waits for it.
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 2 * STEPS_PER_EPOCH)
        await wait_for(stream, lambda e: isinstance(e, Notice) and "waits for the previous one's write" in e.text)
        gate.touch()
        assert await finish(sup) == {"a": "completed"}
    events = run_events(sup)
    saved = of(events, CheckpointSaved, "a")
    assert [e.step for e in saved] == [8, 16, 24, 24]  # the epochs', then the final one
    first = events.index(saved[0])
    stepped = [e.step for e in of(events[:first], StepMetrics, "a")]
    assert max(stepped) >= 2 * STEPS_PER_EPOCH  # steps after the write began, before it landed
    assert all(e.write_s > 0 and e.blocked_s >= 0 for e in saved)
    waits = [e for e in of(events, Notice, "a") if "waits for the previous" in e.text]
    assert len(waits) == 1  # said once


async def test_a_sigkill_mid_write_resumes_from_the_checkpoint_before_it(tmp_path):
    gate = tmp_path / "gate"
    config = gated(tmp_path, gate, after=1, defaults={"max_epochs": 4},
                   restart={"min_uptime": 0.0, "max_restarts": 3})
    sup = Supervisor(config)
    async with supervised(sup) as stream:
        directory = sup.run_dir / "a" / "checkpoints"
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        first = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved))
        assert (first.reason, first.step) == ("epoch", STEPS_PER_EPOCH)
        before = checksum(directory / ckpt.LAST)
        await until_writing(directory)  # epoch 2's, held at the gate, while training goes on into epoch 3
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step > 2 * STEPS_PER_EPOCH)
        os.kill(started.pid, signal.SIGKILL)
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
        assert exited.signal == "SIGKILL"
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        assert Path(resumed.path).name == ckpt.LAST and resumed.step == first.step and resumed.note == ""
        assert checksum(resumed.path) == before  # the weights, optimizer and place it had when it said so
        again = await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        assert again.step == first.step
        gate.touch()
        assert await finish(sup) == {"a": "completed"}
    assert torch.load(directory / ckpt.LAST, weights_only=True)["epoch"] == 4
    assert not list(directory.glob(".*.tmp"))


@pytest.mark.parametrize("keep", [1, 2, 3])
async def test_keep_last_leaves_that_many_checkpoints_and_the_best(tmp_path, keep):
    config = faulty_config(tmp_path, [{"name": "k", "params": {"samples": 64}}],
                           defaults={"max_epochs": 4, "keep_last": keep})
    sup = Supervisor(config)
    async with supervised(sup):
        assert await finish(sup) == {"k": "completed"}
    directory = sup.run_dir / "k" / "checkpoints"
    olds = [ckpt.older_name(i) for i in range(1, keep)]
    assert sorted(p.name for p in directory.iterdir()) == sorted([ckpt.LAST, ckpt.BEST, *olds])
    steps = [torch.load(directory / n, weights_only=True)["step"] for n in (ckpt.LAST, *olds)]
    assert steps == sorted(steps, reverse=True)  # newest first, as load_latest falls back
    out = io.StringIO()
    assert list_command(sup.run_dir.parent, as_json=True, out=out) == 0
    [listed] = [r for r in json.loads(out.getvalue()) if r["run_id"] == sup.run_id]
    assert listed["checkpoint_bytes"] == sum(p.stat().st_size for p in directory.iterdir())
