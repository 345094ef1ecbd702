"""Scoring a script pipeline's hand-offs inline, in its worker.

With `[validation] mode = "inline"` the worker scores each hand-off itself with the validator's own
`PipelineScorer` (its model and data from the script's `validate` factory, `task.api.build_validation`)
while the script waits, so the numbers, `best.pt` and early stopping are the same either way.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...protocol.messages import EarlyStop, Event, ValResult
from ...protocol.names import ValidationMode

if TYPE_CHECKING:
    from ...protocol.channel import StatusSender
    from ..task.scorer import PipelineScorer


class InlineScorer:
    """Scores a script's hand-offs in the worker: results go out as inline ones, an early stop to `on_stop`."""

    def __init__(self, name: str, directory: Path, device: str, sender: StatusSender, on_stop: Callable[[str], None]):
        self.name, self.directory, self.device = name, directory, device
        self.sender, self.on_stop = sender, on_stop
        self.scorer: PipelineScorer | None = None  # built at the first hand-off (meta.json exists then)
        self.broken = False

    def send(self, event: Event) -> None:
        if isinstance(event, ValResult):
            event = dataclasses.replace(event, mode=ValidationMode.INLINE)
        elif isinstance(event, EarlyStop):
            self.on_stop(event.reason)
        self.sender.send(event)

    def score(self) -> None:
        """Score the newest hand-off (building the factory's model and data the first time)."""
        if self.scorer is None and not self.broken:
            from ..task.scorer import PipelineScorer

            try:
                self.scorer = PipelineScorer(self.name, self.directory, self.device)
            except Exception as exc:
                self.broken = True
                self.sender.send(ValResult(pipeline=self.name, epoch=-1, step=-1, metrics={},
                                           mode=ValidationMode.INLINE,
                                           error=f"building the validation failed: {type(exc).__name__}: {exc}"))
        if self.scorer is not None:
            self.scorer.score_newest(self)
