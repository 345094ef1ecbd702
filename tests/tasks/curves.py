"""A task whose validation loss is scripted: after epoch e a trial scores CURVES[shape][e - 1], whatever it
learned, so a sweep's rungs see the same values on any machine. The model counts the steps it trained in a
buffer, so a trial resumed from a checkpoint scores where it had got to."""
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from torchherd.engine import Task

# 'fast' leads at epoch 1 and ends worst of the two that learn; 'slow' is behind it at epoch 1 and ends best.
CURVES = {"fast": [1.0, 0.9, 0.8, 0.7], "slow": [1.1, 0.6, 0.3, 0.1], "bad1": [2.0] * 4, "bad2": [3.0] * 4}


class Zeros(Dataset):
    """`n` items of zeros; each can take `delay` seconds, so an epoch takes a known while."""

    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)  # workload knob: the scheduler's verdict reaches a trial mid-epoch
        return torch.zeros(1), torch.zeros(1)


class Scripted(nn.Module):
    def __init__(self, curve, steps_per_epoch):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.curve, self.steps_per_epoch = curve, steps_per_epoch
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.steps += 1
            return self.lin(x)
        epoch = min(max(round(int(self.steps) / self.steps_per_epoch), 1), len(self.curve))
        return torch.full_like(x, self.curve[epoch - 1] ** 0.5)  # mse against zeros: the curve's value


def build(params):
    torch.manual_seed(0)
    samples, batch = int(params.get("samples", 64)), int(params.get("batch_size", 32))
    model = Scripted(CURVES[params["shape"]], samples // batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return Task(model=model, optimizer=opt, train_data=Zeros(samples, float(params.get("delay", 0.0))),
                val_data=Zeros(8, 0.0), loss_fn=nn.functional.mse_loss)
