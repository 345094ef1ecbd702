"""Saying once per pipeline that its validation reports no `[validation] metric`.

A misspelled metric (`val_accuracy` where the module logs `val_acc`) otherwise goes unseen: no best
checkpoint, and `patience` can never fire. The same warning for every mode and runner, since
inline results and the background validator's reach the bus alike.
"""
from __future__ import annotations

from typing import Any

from ...protocol.messages import Event, Notice, StepMetrics, ValResult
from ..decisions import Outbox, Record, SessionView


def missing_metric_text(metric: str, metrics: dict[str, Any]) -> str:
    """What a result without `metric` means, and the names it does have."""
    return (f"validation reports {', '.join(sorted(metrics))} but not {metric!r}: no best checkpoint is kept and "
            f"patience never counts; set [validation] metric to one of them")


class MetricWatch:
    """A bus tap that warns once per pipeline whose validation results lack the configured metric."""

    def __init__(self, session: SessionView, out: Outbox):
        self._out = out
        self.metric = session.config.validation.metric
        self.warned: set[str] = set()

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        if not isinstance(event, ValResult) or event.error or not event.metrics or event.pipeline in self.warned:
            return
        if self.metric in event.metrics:
            self.warned.add(event.pipeline)  # it reports the metric: nothing to say, ever
            return
        self.warned.add(event.pipeline)
        notice = Notice(pipeline=event.pipeline, level="warning", text=missing_metric_text(self.metric, event.metrics))
        self._out.send(Record(notice))

    def on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        """A run of step reports, taken at once: none is a validation result (a call per report costs a flood)."""
