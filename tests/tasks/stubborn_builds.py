"""Tasks that fail or stall in ways a restart cannot fix: a loss on mismatched shapes, a build that never ends."""
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchherd import Task


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))  # targets are (n, 1)


def mismatched(params):
    """The model answers 3 numbers per sample where the targets have 1: mse_loss raises at the first step."""
    model = nn.Linear(4, 3)
    return Task(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_data=_data(),
                val_data=_data(), loss_fn=lambda out, y: nn.functional.mse_loss(out, y.expand(-1, 2)))


def never_built(params):
    """Building waits for a file nobody writes: the worker stays STARTING until it is ended."""
    release = Path(params["release_file"])
    while not release.exists():
        time.sleep(0.05)  # workload knob: a task whose data never arrives
    model = nn.Linear(4, 1)
    return Task(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_data=_data(),
                loss_fn=nn.functional.mse_loss)
