"""Validation of a script pipeline's hand-offs: its `validate` factory, and scoring inline in the worker.

The background validator builds a script pipeline's model and data with
`build_validation`; with `[validation] mode = "inline"` the worker scores each
hand-off itself with the validator's own `PipelineScorer` while the script waits,
so the numbers, `best.pt` and early stopping are the same either way.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from ...protocol.messages import EarlyStop, Event, ValResult
from ...protocol.names import ValidationMode


def build_validation(ref: str, params: dict[str, Any]) -> Any:
    """Call a script pipeline's `validate` factory and check what it returns (a Validation, or a Task)."""
    import torch

    from ..task.api import TaskError, load_callable

    fn = load_callable(ref)
    try:
        built = fn(dict(params))
    except Exception as exc:
        raise TaskError(f"validate factory {ref} raised {type(exc).__name__}: {exc}") from exc
    problems = []
    if not isinstance(getattr(built, "model", None), torch.nn.Module):
        problems.append("no model (a torch.nn.Module)")
    if getattr(built, "val_data", None) is None:
        problems.append("no val_data")
    if not callable(getattr(built, "loss_fn", None)):
        problems.append("no callable loss_fn")
    if problems:
        raise TaskError(f"validate factory {ref} returned a {type(built).__name__} with " + ", ".join(problems) +
                        "; return torchherd.client.Validation(model=..., val_data=..., loss_fn=...)")
    return built


class InlineScorer:
    """Scores a script's hand-offs in the worker: results go out as inline ones, an early stop to `on_stop`."""

    def __init__(self, name: str, directory: Path, device: str, sender: Any, on_stop: Callable[[str], None]):
        self.name, self.directory, self.device = name, directory, device
        self.sender, self.on_stop = sender, on_stop
        self.scorer: Any = None  # task.scorer.PipelineScorer, built at the first hand-off (meta.json exists then)
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
                self.sender.send(ValResult(pipeline=self.name, epoch=-1, step=-1, metrics={}, mode=ValidationMode.INLINE,
                                           error=f"building the validation failed: {type(exc).__name__}: {exc}"))
        if self.scorer is not None:
            self.scorer.score_newest(self)
