"""What a LightningModule `self.log`ged, read from Lightning's own results for torchherd's reports: the values
of the newest training step (step reports) and those aggregated over the epoch (epoch ends)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection


def _found(results: _ResultCollection, on_step: bool) -> dict[str, Any]:
    """Lightning's logger values, then the progress bar's own, of the step or of the epoch."""
    logged = results.metrics(on_step)
    found: dict[str, Any] = dict(logged["log"])
    for name, value in logged["pbar"].items():
        found.setdefault(name, value)
    return found


def logged_on_step(trainer: pl.Trainer, device: torch.device) -> tuple[list[str], list[torch.Tensor]]:
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


def logged_on_epoch(trainer: pl.Trainer) -> dict[str, float]:
    """What the module logged with on_epoch=True in training, aggregated over the epoch now ending, by the names
    Lightning's loggers use ('train_acc', or 'train_acc_epoch' when it is also logged per step); call from
    on_train_epoch_end. Validation values are not among them (they are val_results)."""
    results = getattr(trainer, "_results", None)
    if results is None:
        return {}
    out = {}
    for name, value in _found(results, False).items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (torch.is_tensor(value) and value.numel() == 1) or number:
            out[name] = float(value)
    return out
