"""A task that imports the user's own `engine` module, beside it."""
import torch

import engine  # the user's engine.py, not torchherd's
from torchherd import Task


def build(params):
    assert engine.MARKER == "the user's engine"
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(dim=1, keepdim=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, engine.width()), torch.nn.ReLU(), torch.nn.Linear(engine.width(), 1))
    data = torch.utils.data.TensorDataset(x, y)
    return Task(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05), train_data=data,
                val_data=data, loss_fn=torch.nn.functional.mse_loss)
