"""Scoring a model on validation data: mean loss and any task metrics, weighted by batch size.

Used inline by the worker today and by the background validator; one function so
both report the same numbers.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def evaluate(model: torch.nn.Module, batches: Iterable, loss_fn: Callable, metrics_fn: Callable | None,
             device: torch.device, autocast: Callable[[], AbstractContextManager[object]], non_blocking: bool = False,
             alive: Callable[[], object] | None = None) -> dict[str, float]:
    """{'val_loss': ..., **metrics} over every batch of `batches`; `alive()` after each batch (a worker's
    heartbeat: a long inline validation is neither a stall nor a hang)."""
    import torch

    was_training = model.training
    model.eval()
    totals: dict[str, Any] = {}
    count = 0
    with torch.inference_mode():
        for inputs, targets in batches:
            inputs = inputs.to(device, non_blocking=non_blocking)
            targets = targets.to(device, non_blocking=non_blocking)
            n = len(targets)
            with autocast():
                outputs = model(inputs)
                loss = loss_fn(outputs, targets)
            # Sums stay on the device; one sync at the end, not one per batch.
            totals["val_loss"] = totals.get("val_loss", 0.0) + loss.detach().float() * n
            if metrics_fn is not None:
                for key, value in metrics_fn(outputs, targets).items():
                    value = value.detach().float() if torch.is_tensor(value) else float(value)
                    totals[key] = totals.get(key, 0.0) + value * n
            count += n
            if alive is not None:
                alive()
    model.train(was_training)
    if count == 0:
        return {}
    return {k: float(v) / count for k, v in totals.items()}
