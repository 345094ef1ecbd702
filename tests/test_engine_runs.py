"""End-to-end runs with real worker processes on a tiny CPU task."""
from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from torchherd.engine.protocol.messages import (CheckpointSaved, StepMetrics, EpochEnd, PipelineFinished, Resumed, RunFinished, TrainingStarted,
                             ValResult, WorkerError, WorkerExited, WorkerStarted)
from torchherd.engine.rundir.directory import read_events, read_records
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config, still_alive, wait_for

pytestmark = pytest.mark.slow


async def run_to_end(sup: Supervisor, timeout: float = 120.0):
    import asyncio

    await sup.start()
    try:
        return await asyncio.wait_for(sup.wait(), timeout)
    finally:
        await sup.shutdown(graceful=False)


async def test_run_completes_and_loss_goes_down(tmp_path):
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b", "params": {"lr": 0.02}}],
                         defaults={"max_epochs": 4})
    sup = Supervisor(config)
    statuses = await run_to_end(sup)
    assert statuses == {"a": "completed", "b": "completed"}
    events = read_events(sup.run_dir)
    epochs = [e for e in events if isinstance(e, EpochEnd) and e.pipeline == "a"]
    assert [e.epoch for e in epochs] == [0, 1, 2, 3]
    assert epochs[-1].train_loss < epochs[0].train_loss / 2
    vals = [e for e in events if isinstance(e, ValResult) and e.pipeline == "a"]
    assert len(vals) == 4 and "val_loss" in vals[0].metrics
    assert events[0].type == "run_started" and isinstance(events[-1], RunFinished) and events[-1].ok
    # The run directory can be read back without the supervisor.
    assert (sup.run_dir / "config.json").exists() and (sup.run_dir / "config.toml").exists() is False
    metrics = read_records(sup.run_dir / "a" / "metrics.jsonl")
    assert {r["type"] for r in metrics} == {"step", "epoch_end", "val_result"}
    assert (sup.run_dir / "a" / "checkpoints" / "last.pt").exists()
    assert (sup.run_dir / "a" / "checkpoints" / "best.pt").exists()
    log = (sup.run_dir / "a" / "log.txt").read_text()
    assert "torchherd worker pid" in log
    # Regression: `l` on a Task pipeline showed the two header lines and nothing else.
    assert "torchherd: epoch 4/4 done at step" in log and "torchherd: validated epoch 4: val_loss" in log
    for line in (sup.run_dir / "events.jsonl").read_text().splitlines():
        assert "type" in json.loads(line) and "time" in json.loads(line)


# Regression: `task = "regression"` with no params (SGD, lr 0.05, momentum 0.9, batch 32) diverged to NaN at step
# 90 of its first epoch, so a newcomer's first config failed.
async def test_the_builtin_regression_task_trains_with_its_defaults(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "task": "regression"}], defaults={"max_epochs": 3})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"a": "completed"}
    epochs = [e for e in read_events(sup.run_dir) if isinstance(e, EpochEnd)]
    assert epochs[-1].train_loss < epochs[0].train_loss


async def test_sigkilled_worker_restarts_and_resumes_from_checkpoint(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "params": {"delay": 0.004}}],
                         defaults={"max_epochs": 4}, restart={"min_uptime": 0.0})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        first = await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch")
        os.kill(first.pid, signal.SIGKILL)
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
        assert exited.signal == "SIGKILL" and exited.reason == "crashed"
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        assert resumed.epoch >= 1
        started = await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        assert started.epoch >= 1  # not from scratch
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "completed"
        assert sup.view("a").restarts == 1 and sup.view("a").attempt == 2
    finally:
        await sup.shutdown(graceful=False)


async def test_task_that_raises_is_reported_and_others_finish(tmp_path):
    config = make_config(tmp_path, [{"name": "boom", "params": {"crash_at_step": 5}}, {"name": "fine"}],
                         restart={"max_restarts": 1})
    sup = Supervisor(config)
    statuses = await run_to_end(sup)
    assert statuses == {"boom": "failed", "fine": "completed"}
    events = read_events(sup.run_dir)
    errors = [e for e in events if isinstance(e, WorkerError) and e.pipeline == "boom"]
    assert errors and "tiny task exploded on purpose" in errors[0].error
    assert "Traceback" in errors[0].traceback and "tiny.py" in errors[0].traceback
    exits = [e for e in events if isinstance(e, WorkerExited) and e.pipeline == "boom"]
    assert len(exits) == 2 and all(e.exit_code == 1 and "exploded" in e.error for e in exits)
    final = [e for e in events if isinstance(e, PipelineFinished) and e.pipeline == "boom"][0]
    assert "exploded" in final.reason and "twice in a row" in final.reason  # the same step both times
    assert final.reason.startswith("the same error in epoch 1/3 after step 4 twice in a row"), final.reason


async def test_more_pipelines_than_slots_queue_by_priority(tmp_path):
    config = make_config(tmp_path, [{"name": "low"}, {"name": "high", "priority": 5}, {"name": "mid", "priority": 1}],
                         devices={"cpu_slots": 1}, defaults={"max_epochs": 2})
    sup = Supervisor(config)
    statuses = await run_to_end(sup)
    assert set(statuses.values()) == {"completed"}
    events = read_events(sup.run_dir)
    order = [e.pipeline for e in events if isinstance(e, WorkerStarted)]
    assert order == ["high", "mid", "low"]
    alive = 0
    for e in events:  # never two workers at once on one slot
        if isinstance(e, WorkerStarted):
            alive += 1
            assert alive == 1
        elif isinstance(e, WorkerExited):
            alive -= 1


async def test_stop_checkpoints_and_ends_stopped(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "params": {"delay": 0.004}}], defaults={"max_epochs": 50})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, EpochEnd))
        sup.stop("a")
        saved = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "stop")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "stopped"
        assert os.path.exists(saved.path)
        exited = [e for e in read_events(sup.run_dir) if isinstance(e, WorkerExited)][0]
        assert exited.exit_code == 10 and exited.reason == "stopped"
    finally:
        await sup.shutdown(graceful=False)


async def test_pause_holds_training_and_resume_finishes(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "params": {"delay": 0.002}}], defaults={"max_epochs": 3})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        sup.pause("a")
        sup.checkpoint("a")
        first = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        sup.checkpoint("a")
        second = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        assert second.step == first.step  # no optimizer step between two checkpoints while paused
        sup.unpause("a")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "completed" and finished.step > second.step
    finally:
        await sup.shutdown(graceful=False)


async def test_kill_takes_the_process_group_with_it(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "num_workers": 1, "params": {"delay": 0.01}}],
                         defaults={"max_epochs": 50})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        await wait_for(stream, lambda e: isinstance(e, StepMetrics))
        group = [started.pid] + [c.pid for c in psutil.Process(started.pid).children(recursive=True)]
        assert len(group) >= 2  # the worker and its DataLoader worker
        sup.kill("a")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "killed"
        assert still_alive(group) == []
    finally:
        await sup.shutdown(graceful=False)


async def test_a_shutdown_that_kills_starts_no_queued_pipeline_in_the_slot_it_frees(tmp_path):
    config = make_config(tmp_path, [{"name": n, "params": {"delay": 0.01}} for n in ("a", "b")],
                         defaults={"max_epochs": 50}, devices={"placement": "cpu", "cpu_slots": 1})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        await wait_for(stream, lambda e: isinstance(e, StepMetrics))
    finally:
        await sup.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    assert [e.pipeline for e in events if isinstance(e, WorkerStarted)] == [started.pipeline]
    ends = {e.pipeline: (e.status, e.reason) for e in events if isinstance(e, PipelineFinished)}
    queued = ({"a", "b"} - {started.pipeline}).pop()
    assert ends[queued] == ("killed", "session ended before it started") and ends[started.pipeline][0] == "killed"
    assert still_alive([started.pid]) == []


async def test_user_restart_resumes_without_spending_budget(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "params": {"delay": 0.004}}], defaults={"max_epochs": 3},
                         restart={"max_restarts": 0})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch")
        sup.restart("a")
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        assert resumed.epoch >= 1
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "completed"
        assert sup.view("a").attempt == 2 and sup.view("a").restarts == 0
    finally:
        await sup.shutdown(graceful=False)
