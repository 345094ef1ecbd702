"""A task where a falling learning rate beats any fixed one, scored by a script rather than by learning: each
epoch e multiplies the model's `loss` buffer by 1 - gain(lr, e), gain peaking at 0.5 where lr is the ideal
0.1 * 0.8**e and vanishing an order of magnitude away. The lr is read from the optimizer's param groups at
every step, so a PBT trial scores by the rate it really trains at; the buffers resume with a checkpoint."""
import math
import time

import torch
from torch import nn
from torch.utils.data import Dataset


def ideal(epoch: int) -> float:
    return 0.1 * 0.8 ** epoch


def gain(lr: float, epoch: int) -> float:
    d = math.log(lr) - math.log(ideal(epoch))
    return 0.5 * math.exp(-d * d / 0.1)


def final_loss(lrs: list[float]) -> float:
    """The val_loss a trial that trains epoch e at lrs[e] ends with."""
    out = 1.0
    for e, lr in enumerate(lrs):
        out *= 1.0 - gain(lr, e)
    return out


class Zeros(Dataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)  # an epoch takes a known while, so trials keep pace with each other
        return torch.zeros(1), torch.zeros(1)


class Scheduled(nn.Module):
    def __init__(self, steps_per_epoch):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.steps_per_epoch = steps_per_epoch
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("loss", torch.ones((), dtype=torch.float64))
        self.opt = None  # the optimizer whose lr it trains at (not part of its state)

    def forward(self, x):
        if self.training:
            lr = float(self.opt.param_groups[0]["lr"])
            epoch = int(self.steps) // self.steps_per_epoch
            self.loss.mul_((1.0 - gain(lr, epoch)) ** (1.0 / self.steps_per_epoch))
            self.steps += 1
            return self.lin(x)
        return torch.full_like(x, float(self.loss) ** 0.5)  # mse against zeros: the loss buffer


def build(params):
    from torchherd.engine import Task

    torch.manual_seed(0)
    samples, batch = int(params.get("samples", 16)), int(params.get("batch_size", 8))
    model = Scheduled(samples // batch)
    model.opt = torch.optim.SGD(model.parameters(), lr=float(params["lr"]))
    return Task(model=model, optimizer=model.opt, train_data=Zeros(samples, float(params.get("delay", 0.0))),
                val_data=Zeros(8, 0.0), loss_fn=nn.functional.mse_loss)
