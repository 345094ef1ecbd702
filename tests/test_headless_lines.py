"""What headless prints: each distinct traceback once, one epoch numbering for people in every line, and step
lines for a pipeline that has not ended an epoch."""
from __future__ import annotations

import io

from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, Notice, StepMetrics, TrainingStarted,
                                                ValResult, WorkerError)
from torchherd.engine.protocol.names import NoticeTopic
from torchherd.tui.headless import LinePrinter

TB = 'Traceback (most recent call last):\n  File "task.py", line 3, in loss\nValueError: shapes differ\n'


def printed(*events) -> str:
    out = io.StringIO()
    printer = LinePrinter(out, start=0.0)
    for event in events:
        printer.handle(event)
    return out.getvalue()


def test_a_repeated_traceback_is_printed_once():
    # Regression: a crash loop printed 8 identical 11-line tracebacks.
    error = WorkerError(pipeline="a", error="ValueError: shapes differ", traceback=TB, where="train", step=0)
    text = printed(error, error, WorkerError(pipeline="b", error="ValueError: shapes differ", traceback=TB + "x",
                                             where="train"))
    assert text.count('File "task.py", line 3') == 2  # a's once, b's own (it differs)
    assert text.count("error during train") == 3 and "(the same traceback as above)" in text


def test_a_scripts_repeated_traceback_is_the_same_whatever_output_came_before_it():
    # Regression: "(the same traceback as above)" was said only for identical output; a script's report shows
    # the step lines before its traceback, which differ from crash to crash.
    text = printed(*(WorkerError(pipeline="s", error="ValueError: shapes differ", where="train",
                                 traceback=f"iter {i}: loss 0.5\n" + TB) for i in (4, 9)))
    assert text.count('File "task.py", line 3') == 1 and "(the same traceback as above)" in text


def test_validation_checkpoint_and_epoch_lines_agree_on_the_epoch():
    # Regression: "val_result epoch 1 step 2500", then "checkpoint at epoch 2 step 2500", then "epoch 2/8".
    text = printed(
        ValResult(pipeline="n", epoch=1, step=2500, metrics={"val_loss": 0.5}, mode="background", seq=1),
        EpochEnd(pipeline="n", epoch=1, step=2500, train_loss=0.4, duration=1.0, samples_per_s=10.0,
                 epochs_total=8, steps_per_epoch=1250),
        CheckpointSaved(pipeline="n", path="last.pt", epoch=2, step=2500, reason="stop"),
        CheckpointSaved(pipeline="n", path="last.pt", epoch=2, step=2600, reason="request"))
    assert "validated epoch 2 step 2500" in text and "epoch 2/8" in text
    assert "(after epoch 2, step 2,500)" in text and "(in epoch 3, step 2,600)" in text


def test_a_script_that_counts_iterations_gets_a_step_line_now_and_then_until_it_ends_an_epoch(monkeypatch):
    # Regression: headless printed nothing between a step-based script's start and "completed".
    import torchherd.tui.headless as headless
    monkeypatch.setattr(headless, "STEP_LINE_EVERY", 0.0)  # the first line is due as soon as it steps
    text = printed(
        TrainingStarted(pipeline="s", epoch=0, step=0, epochs_total=1, steps_per_epoch=5000, device="cpu",
                        parameters=0),
        StepMetrics(pipeline="s", epoch=0, step=10, loss=2.5, lr=0.0, samples_per_s=0.0),
        StepMetrics(pipeline="s", epoch=0, step=20, loss=2.25, lr=0.0, samples_per_s=0.0),
        ValResult(pipeline="s", epoch=0, step=20, metrics={"val_loss": 2.0}, mode="inline"))
    assert "s: step 10/5,000 train 2.5000 val -" in text and "s: step 20/5,000 train 2.2500 val -" in text
    text = printed(TrainingStarted(pipeline="t", epoch=0, step=0, epochs_total=2, steps_per_epoch=50, device="cpu",
                                   parameters=10), StepMetrics(pipeline="t", epoch=0, step=10, loss=1.0, lr=0.0,
                                                               samples_per_s=0.0))
    assert "t: step" in text
    text = printed(EpochEnd(pipeline="e", epoch=0, step=8, train_loss=0.4, duration=1.0, samples_per_s=10.0,
                            epochs_total=2, steps_per_epoch=8),
                   StepMetrics(pipeline="e", epoch=1, step=10, loss=0.3, lr=0.0, samples_per_s=0.0))
    assert "e: step" not in text  # its epoch lines say enough


def test_a_scripts_unknown_epoch_total_and_rate_read_as_unknown():
    # Regression: a script run with no max_epochs printed "epoch 11/11", "12/12", ... (a total invented from the
    # epochs seen); and an epoch end whose rate is not known (None) must print no rate.
    text = printed(EpochEnd(pipeline="s", epoch=10, step=4, train_loss=0.5, duration=1.0, samples_per_s=None,
                            epochs_total=0, steps_per_epoch=4))
    assert "s: epoch 11 train 0.5000 val -" in text and "/" not in text.split("epoch 11")[1].split("\n")[0]


def test_huge_losses_and_empty_results_read_as_the_table_writes_them():
    # Regression: a loss of 10075952236906147840.0000 printed in full; a module whose validation_step logs
    # nothing printed "validated epoch 6 step 138:  (...)".
    text = printed(EpochEnd(pipeline="d", epoch=0, step=8, train_loss=1.0075952236906147e19, duration=1.0,
                            samples_per_s=None, epochs_total=2, steps_per_epoch=8),
                   ValResult(pipeline="d", epoch=5, step=138, metrics={}, mode="background", seq=3))
    assert "train 1.008e19 " in text and "10075952236906147840" not in text
    assert "validated epoch 6 step 138: no metrics (nothing logged) (" in text
    assert "train 0.5000" in printed(EpochEnd(pipeline="d", epoch=0, step=8, train_loss=0.5, duration=1.0,
                                              samples_per_s=None, epochs_total=2, steps_per_epoch=8))


def test_an_epoch_with_no_samples_counted_prints_no_rate():
    # Regression: a plain script's epochs read "epoch 1/20 train 2.1148 val - 0 samples/s" (it reports none).
    text = printed(EpochEnd(pipeline="p", epoch=0, step=8, train_loss=2.1148, duration=1.0, samples_per_s=0.0,
                            epochs_total=20, steps_per_epoch=8),
                   EpochEnd(pipeline="q", epoch=0, step=8, train_loss=1.0, duration=1.0, samples_per_s=1234.0,
                            epochs_total=2, steps_per_epoch=8))
    assert "p: epoch 1/20 train 2.1148 val -\n" in text and "q: epoch 1/2 train 1.0000 val - 1,234 samples/s" in text


def test_resume_headless_prints_only_the_new_session():
    # Regression: `resume --headless` of a run cut short (no run_finished) reprinted its old history at [0.0s].
    from torchherd.engine.protocol.messages import RunFinished, RunStarted
    from torchherd.tui.attach import session_start

    first = RunStarted(run_id="r", run_dir="/r", config_path="c.toml", pipelines=("a",))
    old = [first, EpochEnd(pipeline="a", epoch=0, step=8, train_loss=0.4, duration=1.0, samples_per_s=None,
                           epochs_total=2, steps_per_epoch=8)]
    assert session_start(old + [first]) == 2  # cut short: the new session starts at its own run_started
    assert session_start(old + [RunFinished(ok=False, statuses={}), first]) == 3
    assert session_start([first]) == 0
    plan = Notice(level="info", text="resuming run r: a with --init_from=resume (ckpt.pt, 3 s ago)",
                  topic=NoticeTopic.RESUMING)
    assert session_start(old + [plan, first]) == 2  # the resume plan is the new session's first word
