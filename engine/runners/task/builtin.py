"""Built-in tasks that train on a laptop CPU in seconds with no download.

`regression`: a small MLP fitting a noisy synthetic linear target. `digits`: an
MLP classifying scikit-learn's bundled 8x8 handwritten digits (1,797 images).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import Task

if TYPE_CHECKING:
    import torch


def _optimizer(params: dict[str, Any], model: torch.nn.Module, lr: float = 0.05) -> torch.optim.Optimizer:
    import torch

    lr = float(params.get("lr", lr))
    name = str(params.get("optimizer", "sgd")).lower()
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=float(params.get("weight_decay", 0.0)))
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=float(params.get("momentum", 0.9)),
                               weight_decay=float(params.get("weight_decay", 0.0)))
    raise ValueError(f"params.optimizer must be 'sgd' or 'adam', not {name!r}")


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    return {"accuracy": (outputs.argmax(dim=1) == targets).float().mean()}


def regression(params: dict[str, Any]) -> Task:
    """y = x·w + noise with x in R^features; params: samples, features, hidden, noise, lr, optimizer."""
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    samples = int(params.get("samples", 4096))
    features = int(params.get("features", 16))
    hidden = int(params.get("hidden", 64))
    noise = float(params.get("noise", 0.1))
    gen = torch.Generator().manual_seed(int(params.get("data_seed", 1234)))  # same data in every process
    x = torch.randn(samples, features, generator=gen)
    w = torch.randn(features, 1, generator=gen)
    y = x @ w + noise * torch.randn(samples, 1, generator=gen)
    split = int(samples * 0.8)
    torch.manual_seed(int(params.get("init_seed", 0)))
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    # lr 0.01 by default: SGD with momentum at 0.05 diverged to NaN within an epoch at the default batch size
    return Task(model=model, optimizer=_optimizer(params, model, lr=0.01),
                train_data=TensorDataset(x[:split], y[:split]), val_data=TensorDataset(x[split:], y[split:]),
                loss_fn=nn.functional.mse_loss)


def digits(params: dict[str, Any]) -> Task:
    """scikit-learn's handwritten digits; params: hidden, dropout, lr, optimizer, weight_decay."""
    import torch
    from sklearn.datasets import load_digits
    from torch import nn
    from torch.utils.data import TensorDataset

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # fixed split everywhere
    x, y = x[order], y[order]
    split = int(len(x) * 0.8)
    hidden = int(params.get("hidden", 128))
    torch.manual_seed(int(params.get("init_seed", 0)))
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(float(params.get("dropout", 0.1))),
                          nn.Linear(hidden, 10))
    # lr 0.01 by default: SGD with momentum at 0.05 diverged to NaN within an epoch at the default batch size
    return Task(model=model, optimizer=_optimizer(params, model, lr=0.01),
                train_data=TensorDataset(x[:split], y[:split]), val_data=TensorDataset(x[split:], y[split:]),
                loss_fn=nn.functional.cross_entropy, metrics_fn=_accuracy)
