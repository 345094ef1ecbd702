"""Saying once per pipeline that its validation reports no `[validation] metric`.

A misspelled metric (`val_accuracy` where the module logs `val_acc`) otherwise goes unseen: no best
checkpoint, and `patience` can never fire. The same warning for every mode and runner, since
inline results and the background validator's reach the bus alike.
"""
from __future__ import annotations

import asyncio
from typing import Any

from ..protocol.messages import Event, Notice, StepMetrics, ValResult
from .observed import ObservedSession


def missing_metric_text(metric: str, metrics: dict[str, Any]) -> str:
    """What a result without `metric` means, and the names it does have."""
    return (f"validation reports {', '.join(sorted(metrics))} but not {metric!r}: no best checkpoint is kept and "
            f"patience never counts; set [validation] metric to one of them")


class MetricWatch:
    """A bus tap that warns once per pipeline whose validation results lack the configured metric."""

    def __init__(self, supervisor: ObservedSession):
        self._sup = supervisor
        self.metric = supervisor.config.validation.metric
        self.warned: set[str] = set()
        self._loop = asyncio.get_running_loop()

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        if not isinstance(event, ValResult) or event.error or not event.metrics or event.pipeline in self.warned:
            return
        if self.metric in event.metrics:
            self.warned.add(event.pipeline)  # it reports the metric: nothing to say, ever
            return
        self.warned.add(event.pipeline)
        notice = Notice(pipeline=event.pipeline, level="warning", text=missing_metric_text(self.metric, event.metrics))
        self._loop.call_soon(self._sup.record, notice)  # not from inside the bus's own publish

    def on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        """A run of step reports, taken at once: none is a validation result (a call per report costs a flood)."""
