"""The engine's one fold of per-pipeline progress, and its one rule for "better than the best"."""
from __future__ import annotations

import math

import pytest

from torchherd.engine.protocol import messages as m
from torchherd.engine.protocol.progress import PipelineProgress, apply, better, metric_value
from torchherd.engine.protocol.states import WorkerState


def fold(progress: PipelineProgress, *events: m.Event) -> PipelineProgress:
    for event in events:
        progress = apply(progress, event)
    return progress


@pytest.mark.parametrize("value,best,mode,expected", [
    (0.5, None, "min", True), (0.5, 0.6, "min", True), (0.6, 0.5, "min", False), (0.5, 0.5, "min", False),
    (0.9, 0.8, "max", True), (0.7, 0.8, "max", False), (math.nan, None, "min", False),
    (math.inf, 1.0, "min", False), (0.1, math.nan, "max", True),
])
def test_better(value, best, mode, expected):
    assert better(value, best, mode) is expected


def test_metric_value_falls_back_to_val_loss_and_ignores_non_numbers():
    assert metric_value({"val_loss": 0.3, "accuracy": 0.9}, "accuracy") == 0.9
    assert metric_value({"val_loss": 0.3}, "accuracy") == 0.3
    assert metric_value({"accuracy": "n/a"}, "accuracy") is None


def test_a_lifecycle_folds_into_the_figures_the_supervisor_reports():
    p = PipelineProgress("a", metric="accuracy", metric_mode="max")
    p = fold(p,
             m.PipelineQueued(pipeline="a", priority=0, position=1),
             m.WorkerStarted(pipeline="a", pid=7, device="cpu0", attempt=1, time=100.0),
             m.WorkerStateChanged(pipeline="a", state="starting", previous="queued"),
             m.WorkerStateChanged(pipeline="a", state="running", previous="starting"),
             m.TrainingStarted(pipeline="a", epoch=0, step=0, epochs_total=3, steps_per_epoch=10, device="cpu",
                               parameters=5),
             m.StepMetrics(pipeline="a", epoch=0, step=5, loss=2.0, lr=0.1, samples_per_s=50.0, time=101.0),
             m.StepMetrics(pipeline="a", epoch=0, step=10, loss=1.5, lr=0.1, samples_per_s=60.0, time=102.0),
             m.ValResult(pipeline="a", epoch=0, step=10, metrics={"val_loss": 1.4, "accuracy": 0.6}),
             m.EpochEnd(pipeline="a", epoch=0, step=10, train_loss=1.7, duration=2.0, samples_per_s=55.0,
                        epochs_total=3, steps_per_epoch=10),
             m.ValResult(pipeline="a", epoch=1, step=20, metrics={"val_loss": 1.2, "accuracy": 0.5}))
    assert (p.state, p.pid, p.attempt, p.device) == (WorkerState.RUNNING, 7, 1, "cpu0")
    assert (p.epoch, p.epoch_number, p.step, p.train_loss) == (1, 2, 10, 1.7)  # epoch 0 done: the second runs
    assert (p.val_value, p.val_loss, p.best) == (0.5, 1.2, 0.6)  # accuracy is maximised
    assert p.step_rate == 5.0 and p.eta() == 4.0  # 20 steps left at 5 steps/s
    assert p.fraction == pytest.approx(1 / 3)
    queued = apply(p, m.PipelineQueued(pipeline="a", priority=0, position=1))  # restarted, waiting for a slot
    assert (queued.device, queued.pid, queued.eta()) == ("", None, None)
    # Regression: a 10 s pause moved an ETA from 3:37 to 8:52; the step rate counts training time only.
    p = fold(p, m.WorkerStateChanged(pipeline="a", state="paused", previous="running", time=102.0),
             m.WorkerStateChanged(pipeline="a", state="running", previous="paused", time=112.0),
             m.StepMetrics(pipeline="a", epoch=1, step=15, loss=1.0, lr=0.1, samples_per_s=60.0, time=113.0))
    assert p.step_rate == 5.0 and p.eta() == 3.0  # 15 steps in 3 s of training: 15 left


def test_crashes_count_restarts_and_learn_the_budget_and_the_end_is_final():
    p = fold(PipelineProgress("a"),
             m.WorkerError(pipeline="a", error="IndexError: x", traceback="tb", where="train"),
             m.WorkerExited(pipeline="a", pid=7, attempt=1, exit_code=1, reason="crashed"),
             m.WorkerRestarting(pipeline="a", attempt=2, delay=1.0, restarts_left=2),
             m.WorkerStarted(pipeline="a", pid=8, device="cpu0", attempt=2),
             m.PipelineFinished(pipeline="a", status="failed", reason="IndexError: x (restart budget of 3 used up)",
                                time=50.0))
    assert (p.restarts, p.restart_budget, p.attempt) == (1, 3, 2)
    assert p.state is WorkerState.FAILED and p.state.final and p.pid is None
    assert (p.last_error, p.traceback, p.finished_at) == ("IndexError: x", "tb", 50.0)
    assert p.eta() is None


def test_events_of_other_pipelines_and_failed_validation_change_nothing():
    p = PipelineProgress("a")
    assert apply(p, m.StepMetrics(pipeline="b", epoch=0, step=1, loss=1.0, lr=0.1, samples_per_s=1.0)) is p
    assert apply(p, m.ValResult(pipeline="a", epoch=0, step=1, metrics={}, error="boom")) is p
    assert apply(p, m.Heartbeat(pipeline="a", step=3)) is p


def test_judge_keeps_the_best_and_asks_for_an_early_stop_once_patience_runs_out():
    from types import SimpleNamespace

    from torchherd.engine.protocol.progress import judge

    v = SimpleNamespace(metric="val_loss", metric_mode="min", patience=2)
    assert judge(0.5, None, 0, v) == (True, 0.5, 0, "")
    assert judge(0.6, 0.5, 0, v) == (False, 0.5, 1, "")
    improved, best, since, stop = judge(0.7, 0.5, 1, v)
    assert (improved, best, since) == (False, 0.5, 0) and stop.startswith("early stopping: val_loss did not improve")
    assert judge(float("nan"), 0.5, 0, SimpleNamespace(metric="val_loss", metric_mode="min", patience=None)) == \
        (False, 0.5, 1, "")


def test_a_completed_pipeline_reads_all_done_whatever_its_step_counts_say():
    # Regression: a script run that completed 12/12 epochs read 93% (its steps per epoch, a guess, had grown).
    from torchherd.tui.widgets.pipeline_table import fmt_progress

    p = fold(PipelineProgress("a"),
             m.EpochEnd(pipeline="a", epoch=10, step=110, train_loss=0.1, duration=1.0, samples_per_s=1.0,
                        epochs_total=12, steps_per_epoch=10),
             m.EpochEnd(pipeline="a", epoch=11, step=112, train_loss=0.1, duration=1.0, samples_per_s=1.0,
                        epochs_total=12, steps_per_epoch=10))
    assert p.fraction < 1.0
    done = fold(p, m.WorkerStateChanged(pipeline="a", state="completed", previous="running"))
    assert done.fraction == 1.0 and fmt_progress(done, 12).endswith(" 100%")


def test_an_elastic_gangs_size_folds_from_its_starts_and_resizes_and_a_fixed_ones_stays_plain():
    resized = [m.GangResized(pipeline="g", from_ranks=2 - i % 2, to_ranks=1 + i % 2, why=f"r{i}") for i in range(6)]
    p = fold(PipelineProgress("g"), m.WorkerStarted(pipeline="g", pid=7, device="cpu0,cpu1", attempt=1, pids=(7, 8),
                                                   min_ranks=1, max_ranks=2))
    assert (p.ranks, p.min_ranks, p.max_ranks, p.elastic, p.resizes) == (2, 1, 2, True, ())
    p = fold(p, resized[0], m.WorkerStarted(pipeline="g", pid=9, device="cpu1", attempt=2, min_ranks=1, max_ranks=2))
    assert (p.ranks, p.resizes) == (1, (resized[0],))  # one rank: no pids, one process
    assert fold(p, m.PipelineQueued(pipeline="g", priority=0, position=1)).ranks == 0  # it holds no device
    p = fold(p, *resized[1:])
    assert p.ranks == 2 and p.resizes == tuple(resized[1:])  # the newest five, oldest first
    fixed = fold(PipelineProgress("f"), m.WorkerStarted(pipeline="f", pid=7, device="cpu0,cpu1", attempt=1,
                                                        pids=(7, 8)))
    assert (fixed.ranks, fixed.max_ranks, fixed.elastic) == (2, 0, False)
