"""Why a pipeline stopped, in the table, the summary and headless: an early stop, a stop on request and a
pipeline that never ran read differently; inline validation's `patience` stops a Task pipeline early."""
from __future__ import annotations

import asyncio
import importlib.util

import pytest

from torchherd.engine.protocol.messages import EarlyStop, PipelineFinished, RunFinished, TrainingStarted
from torchherd.engine.protocol.states import ended_label
from torchherd.engine.rundir.directory import read_events, summarize
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.tui.bridge import run_end
from torchherd.engine.supervise.resuming import kept_on_resume
from torchherd.tui.headless import EXIT_OK, EXIT_STOPPED, exit_status
from tests.conftest import make_config, wait_for
from tests.test_resume_stopped import cli
from tests.test_headless_lines import printed


@pytest.mark.parametrize("status, reason, label", [
    ("early_stopped", "early stopping: val_loss did not improve on 0.5 in 2 validations", "early stop"),
    ("stopped", "early stopping: val_loss did not improve on 0.5 in 2 validations", "early stop"),  # older runs
    ("pruned", "val_loss 0.31 at epoch 4, rung cut 0.27", "pruned"),
    ("stopped", "stopped before it started", "never ran"),
    ("killed", "session ended before it started", "never ran"),
    ("stopped", "requested", "stopped"),
    ("killed", "killed on request", "killed"),
    ("completed", "trained to its limits", "completed"),
    ("", "", "unknown"),  # a damaged line's state: read as it is, never a crash (regression: ValueError)
    ("a_newer_state", "", "a_newer_state"),
    ("failed", "restart budget of 3 used up", "failed"),
])
def test_each_way_of_ending_reads_as_itself(status, reason, label):
    from torchherd.engine.protocol.records import from_record

    ev = from_record({"type": "pipeline_finished", "pipeline": "a", "status": status, "reason": reason})
    assert ended_label(ev.status, ev.rung, ev.never_ran) == label


# Regression: early-stopped, user-stopped and never-started pipelines all read `stopped`.
def test_headless_says_why_each_stopped():
    text = printed(
        PipelineFinished(pipeline="a", status="early_stopped", reason="early stopping: val_loss did not improve"),
        PipelineFinished(pipeline="b", status="stopped", reason="requested"),
        PipelineFinished(pipeline="c", status="stopped", reason="stopped before it started", never_ran=True),
        RunFinished(ok=False, statuses={"a": "early_stopped", "b": "stopped", "c": "stopped"}))
    assert "run finished: a early stop, b stopped, c never ran" in text


@pytest.mark.slow
async def test_inline_patience_stops_a_task_pipeline_early(tmp_path):
    # Regression: `patience` was only heard from the background validator; inline, a Task pipeline whose
    # validation never improved trained all its epochs.
    config = make_config(tmp_path, [{"name": "a", "task": "regression", "params": {"lr": 0.0}}],
                         defaults={"max_epochs": 30}, validation={"mode": "inline", "patience": 2})
    sup = Supervisor(config)
    await sup.start()
    try:
        await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    assert [e for e in events if isinstance(e, EarlyStop)]
    finished = [e for e in events if isinstance(e, PipelineFinished)][-1]
    assert finished.status == "early_stopped" and finished.reason.startswith("early stopping: val_loss did not improve")
    assert finished.epoch < 30
    assert summarize(sup.run_dir).labels == {"a": "early stop"}
    # Regression: an early stop read `stopped`, so `torchherd resume` trained the pipeline on, undoing it.
    assert summarize(sup.run_dir).to_resume == ()
    again = cli("resume", str(sup.run_dir), "--headless")
    assert again.returncode == 0 and "nothing to resume" in again.stderr, again.stdout + again.stderr


def test_early_stopped_and_pruned_end_well():
    assert exit_status({"a": "completed", "b": "early_stopped", "c": "pruned"}) == EXIT_OK
    assert exit_status({"a": "pruned", "b": "stopped"}) == EXIT_STOPPED
    done = {"a": "early_stopped", "b": "pruned", "c": "stopped", "d": "completed"}
    assert kept_on_resume(done, list(done), None) == {"a": "early_stopped", "b": "pruned", "d": "completed"}
    # Named with --only, a pruned trial carries on (a person promotes it); a completed one never does.
    assert kept_on_resume(done, list(done), {"b", "d"}) == {"a": "early_stopped", "c": "stopped", "d": "completed"}


@pytest.mark.slow
async def test_a_queued_pipeline_stopped_with_the_run_never_ran(tmp_path):
    # Regression: the quit summary said `b stopped` for a pipeline that was only queued.
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], defaults={"max_epochs": 50},
                         devices={"cpu_slots": 1})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        sup.stop()
        await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    assert summarize(sup.run_dir).labels == {"a": "stopped", "b": "never ran"}
    assert "  a stopped, b never ran" in run_end(sup.run_dir).lines


# Regression: stopping a pipeline flagged for making no step printed "st: stepping again" (it never stepped).
@pytest.mark.slow
async def test_a_stalled_pipeline_that_is_stopped_is_not_said_to_step_again(tmp_path):
    from tests.test_scripts import EPOCH_LOSS, PLAIN
    from torchherd.engine.protocol.messages import Stalled

    config = make_config(tmp_path, [{"name": "st", "script": PLAIN, "args": ["--epochs", "1", "--delay", "600"],
                                     "metrics": EPOCH_LOSS}],
                         restart={"stall_warning": 0.2}, validation={"mode": "off"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, Stalled) and e.quiet > 0 and e.first_step, timeout=120)
        sup.stop("st")
        assert await asyncio.wait_for(sup.wait(), 120) == {"st": "stopped"}
    finally:
        await sup.shutdown(graceful=False)
    stalls = [e for e in read_events(sup.run_dir) if isinstance(e, Stalled)]
    assert [e.quiet > 0 for e in stalls] == [True], stalls


# Regression: Lightning's own EarlyStopping (inline) stopping at 25 of 30 epochs read "completed (trained to its
# limits)".
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning is not installed")
async def test_lightnings_own_early_stopping_reads_as_an_early_stop(tmp_path):
    from tests.conftest import TASKS

    config = make_config(tmp_path, [{"name": "lit", "task": f"{TASKS / 'lit_tiny.py'}:with_impatient_early_stopping"}],
                         defaults={"max_epochs": 6}, validation={"mode": "inline"}, telemetry={"enabled": False})
    sup = Supervisor(config)
    await sup.start()
    try:
        assert await asyncio.wait_for(sup.wait(), 180) == {"lit": "early_stopped"}
    finally:
        await sup.shutdown(graceful=False)
    [end] = [e for e in read_events(sup.run_dir) if isinstance(e, PipelineFinished)]
    assert end.reason.startswith("Lightning's EarlyStopping: val_loss did not improve in 1 checks (stopped after "
                                 "epoch 2 of 6)"), end.reason
