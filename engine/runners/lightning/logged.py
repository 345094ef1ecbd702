"""What a LightningModule `self.log`ged, read from Lightning's own results for torchherd's reports: the values
of the newest training step (step reports) and those aggregated over the epoch (epoch ends)."""
from __future__ import annotations

from typing import Any

import torch


def _found(results: Any, on_step: bool) -> dict[str, Any]:
    """Lightning's logger values, then the progress bar's own, of the step or of the epoch."""
    logged = results.metrics(on_step)
    found = dict(logged["log"])
    for name, value in logged["pbar"].items():
        found.setdefault(name, value)
    return found


def logged_on_step(trainer: Any, device: Any) -> tuple[list[str], list[Any]]:
    """What the module `self.log`ged on this training step, by the names Lightning's loggers use
    ('train_loss', or 'train_loss_step' when it is also logged per epoch), and values logged only
    for the progress bar: (names, values as 0-d float tensors on `device`, not synced)."""
    results = getattr(trainer, "_results", None)
    if results is None:
        return [], []
    found = _found(results, True)  # on_step values of the newest batch (Lightning's own per-batch pass)
    names, values = [], []
    for name, value in found.items():
        if torch.is_tensor(value) and value.numel() == 1:
            value = value.detach().to(device, torch.float32).reshape(())
        elif isinstance(value, (int, float)):
            value = torch.tensor(float(value), device=device)
        else:
            continue
        names.append(name)
        values.append(value)
    return names, values


def logged_on_epoch(trainer: Any) -> dict[str, float]:
    """What the module logged with on_epoch=True in training, aggregated over the epoch now ending, by the names
    Lightning's loggers use ('train_acc', or 'train_acc_epoch' when it is also logged per step); call from
    on_train_epoch_end. Validation values are not among them (they are val_results)."""
    results = getattr(trainer, "_results", None)
    if results is None:
        return {}
    out = {}
    for name, value in _found(results, False).items():
        if torch.is_tensor(value) and value.numel() == 1:
            out[name] = float(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out
