"""Lightning modules under torchherd: real worker and validator processes training tiny modules on the CPU.

Each module-scoped fixture runs one real session; several tests read its events, so
Lightning's import (seconds a process) is paid a few times, not once per assertion.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, Notice, PipelineFinished, Resumed,
                                       SnapshotTaken, StepMetrics, ValResult, WorkerExited,
                                       WorkerStarted, WorkerStateChanged)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, wait_for

# Looked up, not imported: collecting the fast tier (every xdist worker) would pay Lightning's import for nothing.
NO_LIGHTNING = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                  reason='Lightning is not installed: pip install "torchherd[lightning]"')
# One xdist worker for the whole file: its tests share two module-scoped runs (--dist loadgroup).
pytestmark = [pytest.mark.slow, NO_LIGHTNING, pytest.mark.xdist_group("test_lightning")]
TINY = f"lightning:{TASKS / 'lit_tiny.py'}"


def session(config, timeout: float = 120.0) -> tuple[dict[str, str], Path]:
    """Run a whole session to its end in a fresh event loop; (statuses, run directory)."""
    async def go():
        sup = Supervisor(config)
        await sup.start()
        try:
            return await asyncio.wait_for(sup.wait(), timeout), sup.run_dir
        finally:
            await sup.shutdown(graceful=False)
    return asyncio.run(go())


BORING = "lightning:lightning.pytorch.demos.boring_classes:BoringModel"
FACTORY = f"{TASKS / 'lit_tiny.py'}:build"  # no `lightning:` prefix: its factory returns a LightningTask


def lit_config(tmp_path: Path, pipelines: list[dict], mode: str, restart: dict | None = None, **defaults):
    return make_config(tmp_path, pipelines, defaults={"max_epochs": 2, **defaults},
                       validation={"mode": mode, "device": "cpu"} if mode == "background" else {"mode": mode},
                       telemetry={"enabled": False}, devices={"cpu_slots": len(pipelines)}, restart=restart or {})


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("background")
    val_file = tmp / "validation_pids"
    config = lit_config(tmp, [{"name": "tiny", "task": f"{TINY}:LitTiny", "params": {"val_file": str(val_file)}},
                              {"name": "novalstep", "task": f"{TINY}:NoValidation"},
                              {"name": "boring", "task": BORING},
                              {"name": "factory", "task": FACTORY, "params": {"val_file": str(val_file)}},
                              {"name": "logs", "task": f"{TINY}:LogsToItsLogger"}],
                        "background")
    statuses, run_dir = session(config)
    return statuses, run_dir, read_events(run_dir), val_file


@pytest.mark.parametrize("name", ["tiny", "factory"])
def test_background_run_reports_steps_epochs_and_validator_results(background, name):
    statuses, _, events, _ = background
    assert set(statuses.values()) == {"completed"} and len(statuses) == 5
    mine = [e for e in events if getattr(e, "pipeline", "") == name]
    assert [e.epoch for e in mine if isinstance(e, EpochEnd)] == [0, 1]
    assert any(isinstance(e, StepMetrics) and e.loss > 0 for e in mine)
    vals = [e for e in mine if isinstance(e, ValResult)]
    assert vals and all(e.mode == "background" and "val_loss" in e.metrics and not e.error for e in vals)
    assert vals[-1].step == 32  # the final snapshot (2 epochs of 16 batches) is always scored


def test_validation_step_never_runs_in_the_worker_in_background(background):
    _, _, events, val_file = background
    workers = {e.pid for e in events if isinstance(e, WorkerStarted)}
    ran = {int(line) for line in val_file.read_text().split()}
    assert ran and not ran & workers


def test_background_result_equals_trainer_validate_on_the_same_weights(background):
    from tests.tasks.lit_tiny import LitTiny

    _, run_dir, events, _ = background
    final = [e for e in events if isinstance(e, ValResult) and e.pipeline == "tiny"][-1]
    # The last checkpoint holds the weights of the final snapshot (both at step 32).
    model = LitTiny.load_from_checkpoint(run_dir / "tiny" / "checkpoints" / "last.ckpt", val_file="")
    import lightning.pytorch as pl

    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    [expected] = trainer.validate(model, verbose=False)
    assert final.metrics == {k: float(v) for k, v in expected.items()}
    best = LitTiny.load_from_checkpoint(run_dir / "tiny" / "checkpoints" / "best.ckpt")
    assert isinstance(best, LitTiny) and best.hparams.lr == 0.05


def test_module_without_validation_step_gets_a_notice_not_a_crash(background):
    _, _, events, _ = background
    notices = [e.text for e in events if isinstance(e, Notice) and e.pipeline == "novalstep"]
    assert any("has no validation_step" in text for text in notices)
    assert not [e for e in events if isinstance(e, ValResult) and e.pipeline == "novalstep" and e.error]


# Regression: a validation_step using self.logger failed every background score ('NoneType' object has no
# attribute 'experiment'), and the run still ended completed, with no results.
def test_a_validation_step_that_writes_to_its_logger_is_scored_and_its_writes_kept(background):
    _, run_dir, events, _ = background
    vals = [e for e in events if isinstance(e, ValResult) and e.pipeline == "logs"]
    assert vals and all("val_loss" in e.metrics and not e.error for e in vals), vals
    assert list((run_dir / "logs" / "validator").rglob("events.out.tfevents.*"))


def lr_trace(every: int):
    """A callback that keeps plain Lightning's learning rate at each reported step, and its validation results
    per epoch."""
    import lightning.pytorch as pl

    class LrTrace(pl.Callback):
        def __init__(self):
            self.lrs, self.losses, self.vals, self._step = {}, {}, [], 0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = trainer.global_step
            if step != self._step and step % every == 0:
                self.lrs[step] = float(trainer.optimizers[0].param_groups[0]["lr"])
                self.losses[step] = float(trainer.callback_metrics["train_loss"])  # as self.log()ged this step
            self._step = step

        def on_validation_end(self, trainer, module):
            self.vals.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")})

    return LrTrace()


def plain_lightning(cls_name: str, **params):
    """The same module trained by plain Lightning in this process, as the worker does (one thread)."""
    import lightning.pytorch as pl

    from tests.tasks import lit_tiny

    threads, env = torch.get_num_threads(), dict(os.environ)
    torch.set_num_threads(1)
    try:
        pl.seed_everything(0, verbose=False)  # (it sets PL_GLOBAL_SEED and PL_SEED_WORKERS here: undone below)
        model = getattr(lit_tiny, cls_name)(**params)
        trace = lr_trace(every=2)
        trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                             log_every_n_steps=2, callbacks=[trace])
        trainer.fit(model)
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(env)
    return trace


@pytest.fixture(scope="module")
def inline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inline")
    config = lit_config(tmp, [{"name": "onecycle", "task": f"{TINY}:LitTiny", "params": {"scheduler": "onecycle"}},
                              {"name": "twoopt", "task": f"{TINY}:LitTwoOptimizers"},
                              {"name": "boring", "task": BORING},
                              {"name": "factory", "task": FACTORY, "params": {"scheduler": "onecycle"}}], "inline")
    statuses, run_dir = session(config)
    return statuses, run_dir, read_events(run_dir)


def test_lightnings_own_boring_model_runs_unchanged_inline_and_background(inline, background):
    for statuses, events in ((inline[0], inline[2]), (background[0], background[2])):
        assert statuses["boring"] == "completed"
        assert [e.epoch for e in events if isinstance(e, EpochEnd) and e.pipeline == "boring"] == [0, 1]
        assert any(isinstance(e, StepMetrics) and e.pipeline == "boring" for e in events)
    # Its validation_step returns a value but logs nothing: a clear notice in the background.
    assert any(isinstance(e, Notice) and e.pipeline == "boring" and "logs nothing" in e.text for e in background[2])


@pytest.mark.parametrize("name,cls_name,params", [("onecycle", "LitTiny", {"scheduler": "onecycle"}),
                                                  ("twoopt", "LitTwoOptimizers", {}),
                                                  ("factory", "LitTiny", {"scheduler": "onecycle"})])
def test_inline_results_and_lr_trace_equal_plain_lightning(inline, name, cls_name, params):
    statuses, _, events = inline
    assert statuses[name] == "completed"
    plain = plain_lightning(cls_name, **params)
    vals = [e.metrics for e in events if isinstance(e, ValResult) and e.pipeline == name]
    assert vals == plain.vals and len(vals) == 2
    lrs = {e.step: e.lr for e in events if isinstance(e, StepMetrics) and e.pipeline == name}
    assert lrs == plain.lrs and len(set(lrs.values())) > 2  # the schedule moved and matched
    logged = {e.step: e.metrics["train_loss"] for e in events if isinstance(e, StepMetrics) and e.pipeline == name}
    assert logged == plain.losses


def test_every_value_logged_in_training_step_reaches_step_reports_and_metrics_jsonl(inline):
    _, run_dir, _ = inline
    records = [json.loads(line) for line in (run_dir / "onecycle" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == 16  # 32 steps, a report every 2
    for r in steps:
        # train_mae is also logged per epoch, so loggers (and torchherd) name its step value train_mae_step;
        # `batch` is logged for the progress bar only, which torchherd's reports stand in for.
        assert set(r["metrics"]) == {"train_loss", "train_mae_step", "batch"} and r["metrics"]["batch"] == 16.0
    assert len({r["metrics"]["train_mae_step"] for r in steps}) == 16  # this step's value, not a stale one


def test_values_logged_on_epoch_reach_the_epoch_ends(inline):
    # Regression: `self.log(..., on_epoch=True)` gave train_mae_epoch in Lightning's own logs but nowhere in
    # torchherd's: epoch_end had "metrics": {} and TensorBoard no tag for it.
    _, run_dir, _ = inline
    records = [json.loads(line) for line in (run_dir / "onecycle" / "metrics.jsonl").read_text().splitlines()]
    ends = [r for r in records if r["type"] == "epoch_end"]
    assert len(ends) == 2 and all(set(r["metrics"]) == {"train_mae_epoch"} for r in ends), ends
    steps = [r["metrics"]["train_mae_step"] for r in records if r["type"] == "step" and r["epoch"] == 0]
    assert min(steps) <= ends[0]["metrics"]["train_mae_epoch"] <= max(steps)  # the epoch's mean of its steps


def test_inline_best_checkpoint_loads(inline):
    from tests.tasks.lit_tiny import LitTiny

    _, run_dir, events = inline
    assert any(isinstance(e, CheckpointSaved) and e.reason == "best" and e.pipeline == "onecycle" for e in events)
    model = LitTiny.load_from_checkpoint(run_dir / "onecycle" / "checkpoints" / "best.ckpt")
    assert model.hparams.scheduler == "onecycle"


def trained_per_epoch(seen: Path, lost: tuple[int, int] | None = None) -> dict[str, list[int]]:
    """The sample ids trained in each epoch, from LitTiny's seen_file.

    `lost` is (pid, step): what that process trained from optimizer step `step` on died with it
    (it was killed after its last checkpoint), so the weights the run went on with never saw it.
    """
    by_epoch: dict[str, list[int]] = {}
    for line in seen.read_text().splitlines():
        *ids, epoch, step, pid = line.split()
        if lost is not None and int(pid[1:]) == lost[0] and int(step[1:]) >= lost[1]:
            continue
        by_epoch.setdefault(epoch, []).extend(int(i) for i in ids)
    return by_epoch


async def test_stop_mid_epoch_then_resume_trains_every_sample_once_per_epoch(tmp_path):
    seen, ended = tmp_path / "seen", tmp_path / "epoch_ends"
    config = lit_config(tmp_path, [{"name": "a", "task": f"{TINY}:LitTiny",
                                    "params": {"delay": 0.01, "seen_file": str(seen), "epoch_end_file": str(ended)}}],
                        "background", max_epochs=3)
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 22)  # epoch 1 of 16-step epochs
        sup.stop("a")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "stopped"
        await asyncio.wait_for(sup.wait(), 60)
    finally:
        await sup.shutdown(graceful=False)
    stop = [e for e in read_events(sup.run_dir) if isinstance(e, CheckpointSaved) and e.reason == "stop"]
    assert stop and stop[-1].step % 16  # saved mid-epoch
    # Regression (issue 52): a stop mid-epoch called the module's and callbacks' on_train_epoch_end for an epoch
    # that had not ended.
    assert ended.read_text().split() == [str(e) for e in range(stop[-1].step // 16)]
    resumed = Supervisor.resume_run(sup.run_dir)
    await resumed.start()
    try:
        assert await asyncio.wait_for(resumed.wait(), 120) == {"a": "completed"}
    finally:
        await resumed.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    assert [e.step for e in events if isinstance(e, Resumed)] == [stop[-1].step]
    assert [e.step for e in events if isinstance(e, PipelineFinished)][-1] == 48
    by_epoch = trained_per_epoch(seen)
    assert sorted(by_epoch) == ["e0", "e1", "e2"]
    assert ended.read_text().split() == ["0", "1", "2"]  # each epoch's end once, over the stop and the resume
    for ids in by_epoch.values():
        assert sorted(ids) == list(range(256))  # every sample once: none repeated, none skipped
    seqs = [e.seq for e in events if isinstance(e, SnapshotTaken)]
    assert seqs == sorted(set(seqs))  # snapshot numbers keep rising across the restart


async def test_sigkill_mid_epoch_restarts_from_the_last_checkpoint_and_trains_every_sample_once(tmp_path):
    seen = tmp_path / "seen"
    # 32 batches an epoch of at least 0.03 s each: about a second inside epoch 1 (steps 32..63) to act in.
    config = lit_config(tmp_path, [{"name": "a", "task": f"{TINY}:LitTiny",
                                    "params": {"batch_size": 8, "delay": 0.03, "seen_file": str(seen)}}],
                        "background", max_epochs=3)
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 36)
        sup.checkpoint("a")
        saved = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= saved.step + 2)
        os.kill(started.pid, signal.SIGKILL)  # what it trained since `saved` is lost with it
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
    finally:
        await sup.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    crash = [e for e in events if isinstance(e, WorkerExited)][0]
    assert crash.signal == "SIGKILL" and crash.reason == "crashed"
    assert 32 < saved.step < 64 and resumed.step == saved.step  # restarted from mid-epoch 1, by itself
    assert finished.status == "completed" and finished.step == 96  # 3 epochs of 32 steps, none extra
    by_epoch = trained_per_epoch(seen, lost=(started.pid, saved.step))
    assert by_epoch != trained_per_epoch(seen)  # the killed worker had trained past its checkpoint
    assert sorted(by_epoch) == ["e0", "e1", "e2"]
    for ids in by_epoch.values():
        assert sorted(ids) == list(range(256))  # every sample once: none repeated, none skipped
    seqs = [e.seq for e in events if isinstance(e, SnapshotTaken)]
    assert seqs == sorted(set(seqs))  # snapshot numbers keep rising across the restart


async def test_pause_sends_no_step_reports_and_raises_no_hang_alarm(tmp_path):
    # seconds; starting up (Lightning's import) may take three times as long. Not less: with 2.5 s a
    # worker starved of CPU by a loaded CI machine went a heartbeat gap over it and was taken as hung.
    hang = 5.0
    config = lit_config(tmp_path, [{"name": "a", "task": f"{TINY}:LitTiny", "params": {"delay": 0.02}}], "off",
                        restart={"hang_timeout": hang}, max_epochs=3)
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics))
        sup.pause("a")
        sup.checkpoint("a")  # saved inside the worker's pause loop: once it lands, the worker is held
        held = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        alarm = (lambda e: isinstance(e, StepMetrics) or isinstance(e, WorkerStateChanged) and e.state == "hung"
                 or isinstance(e, Notice) and "hung" in e.text)
        with pytest.raises(asyncio.TimeoutError):
            await wait_for(stream, alarm, timeout=1.5 * hang)
        sup.checkpoint("a")
        again = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        assert again.step == held.step  # still held: no optimizer step in all that time
        sup.unpause("a")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
    finally:
        await sup.shutdown(graceful=False)
    assert finished.status == "completed" and finished.step == 48
    states = [e.state for e in read_events(sup.run_dir) if isinstance(e, WorkerStateChanged)]
    assert "paused" in states and "hung" not in states
