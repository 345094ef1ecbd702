"""What a training script reports, as the step and epoch events every runner sends.

A script reports through lines its `metrics` regex matches (named groups `step`,
`epoch`, `loss`, `lr`) or through torchherd.client frames; `ScriptEvents` keeps the
step and epoch it has reached and turns each report into a `StepMetrics` or an
`EpochEnd`. Epochs the script prints are numbered as it numbers them: from 1 unless
it ever prints a 0 first. Standard library only; both of the runner's reader
threads call it, so it locks.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping

from ...protocol.messages import EpochEnd, StepMetrics, ValResult
from ...protocol.names import ValidationMode


def parse_number(text: object) -> float | None:
    """A captured group as a number ("1e-3", "nan", "1,234" -> 1234.0), or None."""
    if text is None:
        return None
    try:
        return float(str(text).replace(",", "").replace("_", ""))
    except ValueError:
        return None


class ScriptEvents:
    """A script's progress (step, epoch in progress, this epoch's losses) and the events it reports."""

    def __init__(self, name: str, epochs_total: int, epoch_base: int | None = None,
                 samples_per_step: int | None = None):
        self.name = name
        self.samples_per_step = samples_per_step  # from the config: samples/s follows from printed steps
        self._rate_mark: tuple[float, int] | None = None  # (monotonic time, step) of the last printed step
        self.epochs_total = epochs_total
        self.epoch_base = epoch_base  # how the script's printed epochs count: from 0 or 1; None until seen
        self.epoch = 0  # the epoch in progress, 0-based
        self.step = 0
        self.ended: dict[int, int] = {}  # epoch (0-based) -> the step it ended at, in this attempt
        self._lock = threading.Lock()
        self._epoch_start: float | None = None  # monotonic time the epoch in progress began
        self._epoch_first_step = 0
        self._loss_sum, self._losses = 0.0, 0  # step losses reported in this epoch
        self._samples = 0.0  # trained in this epoch, as the client reported them
        self._timed = (0.0, 0.0)  # (samples, seconds) of this epoch's reports that said how long they took

    def printed_epoch(self, number: float) -> int:
        """The 0-based epoch a printed epoch number means."""
        if self.epoch_base is None:
            self.epoch_base = 0 if number == 0 else 1
        return max(int(number) - self.epoch_base, 0)

    def resume(self, epoch: int, step: int) -> None:
        """The script carried on from a checkpoint taken at `epoch` (in progress), `step`."""
        with self._lock:
            self.epoch, self.step = epoch, step
            self._epoch_first_step = step

    def from_match(self, groups: Mapping[str, str | None]) -> list[StepMetrics | EpochEnd]:
        """A `metrics` regex match: an epoch end if it has `epoch` but no `step`, else a step report."""
        values = {k: v for k, v in ((k, parse_number(v)) for k, v in groups.items()) if v is not None}
        if not values:
            return []
        if "epoch" in values and "step" not in values:
            ended = self.printed_epoch(values["epoch"])
            events: list[StepMetrics | EpochEnd] = []
            if "loss" in values and self.step == self._epoch_first_step:
                # Nothing was reported during the epoch: its loss is also the chart's point for it.
                report = self.step_report(None, ended, values["loss"])
                events += [report] if report is not None else []
            return [*events, self.epoch_end(ended, values.get("loss"), _others(values))]
        epoch = self.printed_epoch(values["epoch"]) if "epoch" in values else None
        step = int(values["step"]) if "step" in values else None
        samples, seconds = self._samples_since(step)
        event = self.step_report(step, epoch, values.get("loss"), values.get("lr"), samples, seconds,
                                 metrics=_others(values))
        return [event] if event is not None else []

    def _samples_since(self, step: int | None) -> tuple[float, float]:
        """(samples trained, seconds) since the last printed step, from samples_per_step; (0, 0) unknown."""
        if not self.samples_per_step or step is None:
            return 0.0, 0.0
        now, mark = time.monotonic(), self._rate_mark
        self._rate_mark = (now, step)
        if mark is None or step <= mark[1]:
            return 0.0, 0.0  # the first, or a restart that went back
        return float((step - mark[1]) * self.samples_per_step), now - mark[0]

    def step_report(self, step: int | None, epoch: int | None, loss: float | None, lr: float | None = None,
                    samples: float = 0.0, seconds: float = 0.0, weight: int = 1,
                    metrics: dict[str, float] | None = None) -> StepMetrics | None:
        """A step (or the next one, if `step` is None); an event only when it carries a loss.

        `samples` were trained in the last `seconds`, and `loss` is the mean of `weight` steps'
        losses (the client coalesces the reports between two of its flushes).
        """
        with self._lock:
            if self._epoch_start is None:
                self._epoch_start = time.monotonic()  # the first epoch starts with its first report
            if epoch is not None and int(epoch) != self.epoch:
                self.epoch = int(epoch)
                self._epoch_first_step = self.step
            self.step = int(step) if step is not None else self.step + 1
            self._samples += samples
            if samples and seconds > 0:
                self._timed = (self._timed[0] + samples, self._timed[1] + seconds)
            if loss is None:
                return None
            if math.isfinite(loss):
                self._loss_sum += loss * weight
                self._losses += weight
            return StepMetrics(pipeline=self.name, epoch=self.epoch, step=self.step, loss=float(loss),
                               lr=float(lr) if lr is not None else None,
                               samples_per_s=samples / seconds if samples and seconds > 0 else None,
                               metrics=metrics or {})

    def epoch_end(self, epoch: int, loss: float | None, metrics: dict[str, float] | None = None) -> EpochEnd:
        """Epoch `epoch` (0-based) finished; its loss, or the mean of its step losses when the script gave none."""
        with self._lock:
            now = time.monotonic()
            if loss is None:
                loss = self._loss_sum / self._losses if self._losses else math.nan
            duration = now - (self._epoch_start or now)
            # The reports' own timings where they gave them: the first epoch "starts" at its first report,
            # which for a client flushing once an epoch is a moment before its end (29,954,974 samples/s).
            timed, seconds = self._timed
            rate = timed / seconds if seconds > 0 else self._samples / duration if duration > 0 and self._samples \
                else None
            event = EpochEnd(pipeline=self.name, epoch=epoch, step=self.step, train_loss=float(loss),
                             duration=duration, samples_per_s=rate,
                             # unknown stays unknown (0); a script that runs past max_epochs says so
                             epochs_total=max(self.epochs_total, epoch + 1) if self.epochs_total else 0,
                             steps_per_epoch=max(self.step - self._epoch_first_step, 0), metrics=metrics or {})
            self.ended[epoch] = self.step
            self.epoch = epoch + 1
            self._epoch_start, self._epoch_first_step = now, self.step
            self._loss_sum = self._samples = 0.0
            self._losses, self._timed = 0, (0.0, 0.0)
            return event


    def val_from_match(self, groups: Mapping[str, str | None]) -> ValResult | None:
        """A `val_metrics` match: the script's own validation of its weights at `step`, as a val_result; None when
        it captured no number. Without `step`, of the epoch it names (at the step that epoch ended, where seen),
        else of the weights it has now: those of the epoch that just ended when no step came since."""
        values = {k: v for k, v in ((k, parse_number(v)) for k, v in groups.items()) if v is not None}
        with self._lock:
            given = int(values.pop("step")) if "step" in values else None
            if "epoch" in values:
                epoch = self.printed_epoch(values.pop("epoch"))
            elif given is None and self.ended.get(self.epoch - 1) == self.step:  # printed after its epoch's end
                epoch = self.epoch - 1
            else:
                epoch = self.epoch
            step = given if given is not None else self.ended.get(epoch, self.step)
        metrics = {"val_loss" if k == "loss" else k if k.startswith("val_") else f"val_{k}": v
                   for k, v in values.items() if k != "lr"}
        if not metrics:
            return None
        return ValResult(pipeline=self.name, epoch=epoch, step=step, metrics=metrics, mode=ValidationMode.INLINE)


def _others(values: dict[str, float]) -> dict[str, float]:
    """The values beyond step, epoch, loss and lr: a script's own metrics."""
    return {k: v for k, v in values.items() if k not in ("step", "epoch", "loss", "lr")}
