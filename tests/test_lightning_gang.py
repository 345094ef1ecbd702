"""Lightning's own DDP strategy training a torchherd gang: real rank processes on gloo, a real validator.

A LightningModule and DataModule written the usual way (tests/tasks/lit_gang.py) run as a 2-rank gang; the
same file run as a script is plain `Trainer(devices=2, strategy="ddp", accelerator="cpu").fit`, the baseline.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchherd.engine.config.problems import ConfigError
from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, PipelineFinished, Resumed,
                                                StepMetrics, ValResult, WorkerExited, WorkerStarted)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, still_alive, wait_for
from tests.test_gangs import checksums
from tests.test_lightning import NO_LIGHTNING, session

# One xdist worker for the whole file: its tests share one module-scoped run (--dist loadgroup).
pytestmark = [pytest.mark.slow, NO_LIGHTNING, pytest.mark.xdist_group("test_lightning_gang")]
MODULE = f"lightning:{TASKS / 'lit_gang.py'}:LitRegression"
DATA = f"{TASKS / 'lit_gang.py'}:RegressionData"


def gang_config(tmp_path: Path, mode: str = "background", strategy: str = "ddp", **defaults):
    pipeline = {"name": "g", "task": MODULE, "datamodule": DATA, "ranks": 2, "strategy": strategy}
    return make_config(tmp_path, [pipeline], defaults={"max_epochs": 2, **defaults},
                       validation={"mode": mode, "device": "cpu"} if mode == "background" else {"mode": mode},
                       telemetry={"enabled": False}, devices={"cpu_slots": 2, "threads_per_worker": 1})


@pytest.fixture(scope="module")
def gang_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lgang")
    statuses, run_dir = session(gang_config(tmp), timeout=180)
    return statuses, run_dir, read_events(run_dir)


def test_a_lightning_gang_trains_on_both_ranks_and_its_loss_falls(gang_run):
    statuses, run_dir, events = gang_run
    assert statuses == {"g": "completed"}
    started = [e for e in events if isinstance(e, WorkerStarted)]
    assert len(started) == 1 and len(started[0].pids) == 2
    # 256 samples over 2 ranks in batches of 16: 8 steps an epoch, each rank its half
    assert [(e.epoch, e.step) for e in events if isinstance(e, EpochEnd)] == [(0, 8), (1, 16)]
    steps = [e for e in events if isinstance(e, StepMetrics)]
    assert steps and all("train_loss" in e.metrics for e in steps)  # self.log()ged values reach the reports
    assert steps[-1].loss < steps[0].loss / 2
    sums = checksums(run_dir, "g")
    assert sorted(sums) == [0, 1] and sums[0] == sums[1]  # every rank ends with the same weights


def test_a_lightning_gangs_background_validation_equals_trainer_validate(gang_run):
    from tests.tasks.lit_gang import LitRegression, RegressionData

    _, run_dir, events = gang_run
    vals = [e for e in events if isinstance(e, ValResult)]
    assert vals and all(e.mode == "background" and not e.error for e in vals)
    final = vals[-1]
    assert final.step == 16
    model = LitRegression.load_from_checkpoint(run_dir / "g" / "checkpoints" / "last.ckpt")
    import lightning.pytorch as pl

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    [expected] = trainer.validate(model, datamodule=RegressionData(), verbose=False)
    assert final.metrics == {k: float(v) for k, v in expected.items()}
    best = LitRegression.load_from_checkpoint(run_dir / "g" / "checkpoints" / "best.ckpt")
    assert isinstance(best, LitRegression) and best.hparams.lr == 0.05


def test_a_lightning_gang_ends_with_plain_lightning_ddps_weights(gang_run, tmp_path):
    _, run_dir, _ = gang_run
    out = tmp_path / "plain.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_", "WORLD", "MASTER_"))}
    subprocess.run([sys.executable, str(TASKS / "lit_gang.py"), str(out), "2"], check=True, env=env,
                   capture_output=True, timeout=300)
    plain = torch.load(out)["state_dict"]
    ours = torch.load(run_dir / "g" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert plain.keys() == ours.keys()
    for key in plain:
        assert torch.equal(plain[key], ours[key]), (key, plain[key], ours[key])


async def test_a_sigkilled_rank_restarts_the_gang_from_its_checkpoint_and_each_sample_trains_once(tmp_path):
    seen = tmp_path / "seen"
    config = gang_config(tmp_path, max_epochs=3, params={"delay": 0.05, "seen_file": str(seen)},
                         log_every_n_steps=1)
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), timeout=120)
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 10, timeout=120)
        sup.checkpoint("g")
        saved = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= saved.step + 2)
        os.kill(started.pids[1], signal.SIGKILL)  # what the gang trained since `saved` is lost with it
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
        assert not still_alive(list(started.pids), timeout=10.0)  # rank 0 was not left in a collective
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed), timeout=120)
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), timeout=180)
    finally:
        await sup.shutdown(graceful=False)
    assert (exited.rank, exited.signal, exited.reason) == (1, "SIGKILL", "crashed")
    assert 8 < saved.step < 16 and resumed.step == saved.step  # mid-epoch 1
    assert finished.status == "completed" and finished.step == 24  # 3 epochs of 8 steps, none extra
    by_epoch: dict[str, list[int]] = {}
    for line in seen.read_text().splitlines():
        *ids, epoch, step, pid = line.split()
        if int(pid[1:]) in started.pids and int(step[1:]) >= saved.step:
            continue  # trained by the first attempt after its checkpoint: those weights died with it
        by_epoch.setdefault(epoch, []).extend(int(i) for i in ids)
    assert sorted(by_epoch) == ["e0", "e1", "e2"]
    for ids in by_epoch.values():
        assert sorted(ids) == list(range(256))  # every sample once an epoch over both ranks
    sums = checksums(sup.run_dir, "g")
    assert sums[0] == sums[1]


async def test_stop_and_checkpoint_now_act_at_the_same_step_on_every_rank(tmp_path):
    config = gang_config(tmp_path, mode="off", max_epochs=5, params={"delay": 0.02}, log_every_n_steps=1)
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 3, timeout=120)
        sup.stop("g")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), timeout=120)
    finally:
        await sup.shutdown(graceful=False)
    assert finished.status == "stopped"
    stop = [e for e in read_events(sup.run_dir) if isinstance(e, CheckpointSaved) and e.reason == "stop"]
    assert len(stop) == 1 and stop[0].step % 8  # mid-epoch
    state = torch.load(stop[0].path, weights_only=False)
    assert state["global_step"] == stop[0].step
    sums = checksums(sup.run_dir, "g")  # each rank's step and weights when it stopped
    assert sums[0] == sums[1] and int(sums[0][0]) == stop[0].step


def test_fsdp_on_cpu_is_refused_naming_the_key(tmp_path):
    config = gang_config(tmp_path, strategy="fsdp")
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.strategy.*fsdp.*needs GPUs"):
        Supervisor(config)
