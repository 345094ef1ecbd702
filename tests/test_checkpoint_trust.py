"""Checkpoints are data: a last.pt whose pickle would import code is refused, naming the file and what it would
import, unless the pipeline's `trust_checkpoints` says the files are the user's own; torchherd's own state loads
with torch.load(weights_only=True)."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from torchherd.engine.protocol.messages import PipelineFinished, WorkerError
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.engine.worker import checkpoint as ckpt
from tests.conftest import make_config, wait_for
from tests.faults.support import supervised


class RunsCode:
    """A pickle that runs a shell command as it loads (what a hostile last.pt does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class UsersOwn:
    """An object of the user's own, in a checkpoint the user wrote."""

    def __init__(self, value: int):
        self.value = value


def hostile(directory: Path, marker: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ckpt.LAST
    torch.save({"model": {}, "epoch": 1, "step": 1, "payload": RunsCode(marker)}, path)
    return path


def test_a_checkpoint_that_would_run_code_is_refused_naming_the_file_and_the_import(tmp_path):
    # Regression: checkpoints loaded with weights_only=False, so a hostile last.pt ran os.system during a resume.
    marker = tmp_path / "ran"
    path = hostile(tmp_path / "ckpts", marker)
    with pytest.raises(ckpt.CheckpointRefused) as refused:
        ckpt.load_latest(tmp_path / "ckpts")
    assert str(path) in str(refused.value) and "posix.system" in str(refused.value)
    assert "trust_checkpoints" in str(refused.value)
    assert not marker.exists()


def test_a_refused_checkpoint_is_not_skipped_for_an_older_one(tmp_path):
    # Falling back to prev.pt would quietly train on from older weights and overwrite the newer ones.
    directory = tmp_path / "ckpts"
    hostile(directory, tmp_path / "ran")
    torch.save({"model": {}, "epoch": 0, "step": 0}, directory / ckpt.PREV)
    with pytest.raises(ckpt.CheckpointRefused):
        ckpt.load_latest(directory)


def test_a_trusted_checkpoint_of_the_users_own_objects_loads(tmp_path):
    (tmp_path / "c").mkdir()
    torch.save({"model": {}, "extra": UsersOwn(7)}, tmp_path / "c" / ckpt.LAST)
    with pytest.raises(ckpt.CheckpointRefused, match="UsersOwn"):
        ckpt.load_latest(tmp_path / "c")
    state, path, _ = ckpt.load_latest(tmp_path / "c", trusted=True)
    assert state["extra"].value == 7 and path.name == ckpt.LAST


def test_the_trainers_own_state_loads_without_trust(tmp_path):
    # What Trainer._state saves: model, Adam, StepLR, a GradScaler, the generators' states, plain counters.
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "scaler": scaler.state_dict(), "epoch": 2, "step": 9, "best": 0.5, "epoch_loss": 1.5,
             "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "cuda": None}, "pipeline": "a"}
    ckpt.save_checkpoint(tmp_path, state)
    loaded, _, note = ckpt.load_latest(tmp_path)
    assert note == "" and loaded["step"] == 9 and loaded["rng"]["python"] == random.getstate()
    torch.optim.Adam(model.parameters()).load_state_dict(loaded["optimizer"])


@pytest.mark.slow
async def test_a_pipeline_resuming_from_a_hostile_checkpoint_fails_saying_why(tmp_path):
    marker = tmp_path / "ran"
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False})
    sup = Supervisor(config, run_id="planted")
    path = hostile(sup.run_dir / "a" / "checkpoints", marker)
    async with supervised(sup) as stream:
        error = await wait_for(stream, lambda e: isinstance(e, WorkerError), timeout=120)
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), timeout=120)
    assert str(path) in error.error and "posix.system" in error.error and error.where == "checkpoint"
    assert finished.status == "failed"
    assert not marker.exists()
