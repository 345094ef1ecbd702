"""The training curves in the TensorBoard files are thinned on the supervisor's side: TensorBoard's own reader
finds a pipeline's first point, the newest before each epoch end and the run's end, a rare metric's every point,
and a bounded count, while epoch figures and validation results are all there."""
from __future__ import annotations

import pytest

from torchherd.engine.config.load import parse_config
from torchherd.engine.protocol.messages import EpochEnd, RunFinished, StepMetrics, ValResult, WorkerStarted
from torchherd.engine.rundir.tensorboard import STEP_EVERY, StepThinning, TensorBoardTap

pytest.importorskip("tensorboard")

T0 = 1_700_000_000.0


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def step(i: int, at: float, **metrics) -> StepMetrics:
    return StepMetrics(pipeline="p", epoch=i // 5000, step=i, loss=1.0 / i, lr=0.01, samples_per_s=100.0,
                       metrics=metrics, time=at)


def test_a_fast_reporting_run_keeps_its_first_its_last_and_a_bounded_count(tmp_path):
    config = parse_config({"defaults": {"task": "regression"}, "pipelines": [{"name": "p"}]},
                          str(tmp_path / "x.toml"), tmp_path)
    tap = TensorBoardTap(tmp_path / "tb", config)  # no event loop here: each event is handed over at once
    tap.on_event(WorkerStarted(pipeline="p", pid=1, device="cpu", attempt=1, time=T0))
    n = 10_000  # one report a millisecond: 10 s of the worker's clock
    for i in range(1, n + 1):
        tap.on_event(step(i, T0 + i / 1000, **({"acc": 0.5} if i % 1000 == 500 else {})))
        if i == 5003:
            tap.on_event(EpochEnd(pipeline="p", epoch=0, step=i, train_loss=0.3, duration=5.0, samples_per_s=100.0,
                                  epochs_total=2, steps_per_epoch=5003, time=T0 + i / 1000))
            tap.on_event(ValResult(pipeline="p", epoch=0, step=i, metrics={"val_loss": 0.4}, time=T0 + i / 1000))
    tap.on_event(RunFinished(ok=True, statuses={"p": "completed"}, time=T0 + 11))  # waits for the files
    got = scalars(tmp_path / "tb" / "p")
    loss = got["train/loss"]
    assert 1 in loss and n in loss and 5003 in loss  # the first, the run's last, the last before the epoch end
    assert loss[n] == pytest.approx(1.0 / n, rel=1e-6)
    assert len(loss) <= 10 / STEP_EVERY + 20  # 10,000 reports in 10 s: about 200 points
    assert len(loss) >= 10 / STEP_EVERY  # and about evenly spread: no stretch of the run left out
    assert sorted(got["train/acc"]) == list(range(500, n, 1000))  # a rare metric keeps every point
    assert got["epoch/train_loss"] == {5003: pytest.approx(0.3)} and got["val/val_loss"] == {5003: pytest.approx(0.4)}


def test_the_thinning_keeps_a_new_attempts_first_report_and_a_clock_that_went_back():
    thin = StepThinning(every=1.0)
    assert thin.keep(step(1, 10.0)) and not thin.keep(step(2, 10.5))
    assert thin.release(ValResult(pipeline="p", epoch=0, step=2, metrics={}, time=10.6)) == []  # not an end
    assert [e.step for e in thin.release(WorkerStarted(pipeline="p", pid=2, device="cpu", attempt=2))] == [2]
    assert thin.keep(step(1, 10.7))  # the new attempt's first, though within a second of the last written
    assert thin.keep(step(2, 9.0))  # the worker's clock went back: kept, and the interval starts over
    assert not thin.keep(step(3, 9.5)) and thin.keep(step(4, 10.0))
    assert thin.release(WorkerStarted(pipeline="p", pid=3, device="cpu", attempt=3)) == []  # nothing held back
    assert thin.keep(step(1, 10.1))  # yet the next attempt's first report is kept all the same
