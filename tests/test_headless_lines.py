"""What headless prints: each distinct traceback once, and one epoch numbering for people in every line."""
from __future__ import annotations

import io

from torchherd.engine.protocol.messages import CheckpointSaved, EpochEnd, ValResult, WorkerError
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
