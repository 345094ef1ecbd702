"""A sharded (`fsdp`) gang's checkpoints written off the training thread by DCP's async save, on a slow disk (each
rank's write of its shards waits on a gate file): real gloo ranks on the CPU.

Training steps on while the write is in flight, and a rank SIGKILLed meanwhile brings the gang back from the
checkpoint before, with the weights it had.
"""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch

from tests.conftest import make_config, wait_for
from tests.faults.support import finish, of, run_events, supervised
from tests.test_sharded import fsdp, inventory, resumed_at
from torchherd.engine.protocol.messages import CheckpointSaved, Resumed, StepMetrics, WorkerStarted
from torchherd.engine.runners.task import sharded_checkpoint as sharded
from torchherd.engine.supervise.supervisor import Supervisor

pytestmark = pytest.mark.slow
STEPS_PER_EPOCH = 4  # 256 samples, 2 ranks of 32


def weights_sum(checkpoint: Path, scratch: Path) -> float:
    """The sum over every weight the sharded checkpoint holds, as a resumed gang's checksum adds them."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(checkpoint), str(scratch))
    state = torch.load(scratch, weights_only=True)["model"]
    return float(sum(t.double().sum() for t in state.values()))


async def until_writing(directory: Path) -> Path:
    """The temporary folder of a sharded checkpoint being written, once there is one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while not (found := list(directory.glob(".last.dcp.*.tmp"))):
        assert loop.time() < deadline, "no sharded checkpoint write seen in 120 s"
        await asyncio.sleep(0.01)
    return found[0]


async def test_an_fsdp_gang_steps_on_while_its_shards_are_written_and_a_kill_resumes_the_checkpoint_before(tmp_path):
    gate = tmp_path / "gate"
    params = {"samples": 256, "delay": 0.002, "save_gate_file": str(gate), "save_gate_after": 1}
    cfg = make_config(tmp_path, [fsdp(max_epochs=4, params=params)], defaults={"log_every_n_steps": 1},
                      validation={"mode": "off"}, restart={"max_restarts": 2, "min_uptime": 0.0})
    sup = Supervisor(cfg, inventory=inventory())
    async with supervised(sup) as stream:
        checkpoints = sup.run_dir / "f" / "checkpoints"
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), 120)
        first = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved), 120)
        assert (first.reason, first.step) == ("epoch", STEPS_PER_EPOCH)
        before = weights_sum(checkpoints / "last.dcp", tmp_path / "before.pt")
        held = await until_writing(checkpoints)  # epoch 2's shards, held at the gate on both ranks
        assert held.name == f".last.dcp.{2 * STEPS_PER_EPOCH}.tmp"
        # Synchronous, the gang would wait at step 8 for the disk; async, it trains on into epoch 3.
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 2 * STEPS_PER_EPOCH + 2, 60)
        assert held.is_dir() and not (held / ".metadata").exists()  # still in flight, never published
        os.kill(started.pids[1], signal.SIGKILL)
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed), 120)
        assert resumed.path.endswith("last.dcp") and resumed.step == first.step and resumed.note == ""
        gate.touch()
        assert await finish(sup, 240) == {"f": "completed"}
    # The resumed gang's weights are the checkpoint's before the kill, not the steps trained after it.
    assert resumed_at(sup.run_dir, "f")[0] == (first.step, pytest.approx(before, rel=1e-9))
    saved = of(run_events(sup), CheckpointSaved, "f")
    assert [e.step for e in saved] == [4, 8, 12, 16, 16]  # epoch 2's again after the resume, then the final one
    assert all(e.write_s > 0 and e.blocked_s >= 0 for e in saved)
    last = checkpoints / "last.dcp"
    assert sharded.complete(last) and torch.load(last / sharded.TRAINER_FILE, weights_only=True)["step"] == 16
    assert not list(checkpoints.glob(".*.tmp"))


async def test_async_checkpoints_false_writes_a_sharded_gangs_shards_on_the_training_thread(tmp_path):
    cfg = make_config(tmp_path, [fsdp(max_epochs=2, async_checkpoints=False, params={"samples": 128})],
                      validation={"mode": "off"})
    sup = Supervisor(cfg, inventory=inventory())
    async with supervised(sup):
        assert await finish(sup, 240) == {"f": "completed"}
    saved = of(run_events(sup), CheckpointSaved, "f")
    assert [e.step for e in saved] == [2, 4, 4]  # 128 samples, 2 ranks of 32: 2 steps an epoch; then the final
    assert all(e.blocked_s == e.write_s > 0 for e in saved)  # training waited for the whole write
