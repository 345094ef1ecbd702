"""The benchmark workload for validation overlap: an MLP whose validation costs about half an epoch."""
import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchherd.engine import Task


def build(params):
    features, hidden = 64, int(params.get("hidden", 1536))  # ~2.5M weights: 9.5 MiB to hand off
    train_n, val_n = int(params.get("train", 4096)), int(params.get("val", 6144))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(train_n + val_n, features, generator=g)
    y = x[:, :1] * 2 + 0.1 * torch.randn(train_n + val_n, 1, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 1))
    return Task(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                train_data=TensorDataset(x[:train_n], y[:train_n]),
                val_data=TensorDataset(x[train_n:], y[train_n:]), loss_fn=nn.functional.mse_loss)
