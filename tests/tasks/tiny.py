"""A tiny regression task for tests, with knobs to make it slow, crash or misbehave on purpose."""
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from torchherd.engine import Task


class Slow(Dataset):
    """Synthetic y = 3x + 1; each item can take `delay` seconds, so tests can act mid-epoch."""

    def __init__(self, n, delay, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True) * 3 + 1
        self.delay = delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)  # workload knob: makes an epoch take a known while
        return self.x[i], self.y[i]


class Crashy(nn.Module):
    def __init__(self, crash_at_step, how, once_file):
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.calls = 0
        self.crash_at_step = crash_at_step
        self.how = how
        self.once_file = once_file

    def forward(self, x):
        self.calls += 1
        if self.crash_at_step is not None and self.calls >= self.crash_at_step:
            marker = self.once_file
            if marker is None or not os.path.exists(marker):
                if marker:
                    open(marker, "w").close()
                if self.how == "raise":
                    raise RuntimeError("tiny task exploded on purpose")
                if self.how == "nan":
                    return x.sum(dim=1, keepdim=True) * float("nan")
                if self.how == "segv":
                    import ctypes
                    ctypes.string_at(0)
        return self.lin(x)


def build(params):
    torch.manual_seed(0)
    crash_at = params.get("crash_at_step")
    for key, env in (("crash_rank", "RANK"), ("crash_world_size", "WORLD_SIZE")):  # only that rank / gang size
        if params.get(key) is not None and int(os.environ.get(env, 0)) != int(params[key]):
            crash_at = None
    model = Crashy(crash_at, params.get("how", "raise"), params.get("crash_once_file"))
    delay = float(params.get("delay", 0.0))
    if params.get("slow_rank") is not None and int(os.environ.get("RANK", 0)) == int(params["slow_rank"]):
        delay = float(params.get("slow_delay", 0.01))  # one rank of a gang slow in its data path: a straggler
    data = Slow(int(params.get("samples", 256)), delay, 1)
    val = Slow(64, 0.0, 2)
    opt = torch.optim.SGD(model.parameters(), lr=float(params.get("lr", 0.05)))
    return Task(model=model, optimizer=opt, train_data=data, val_data=val, loss_fn=nn.functional.mse_loss)


class SlowVal(Dataset):
    """Validation data whose every item takes `delay` seconds: a validator slow on purpose."""

    def __init__(self, delay):
        self.inner = Slow(64, 0.0, 2)
        self.delay = delay

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        time.sleep(self.delay)  # workload knob, not a wait
        return self.inner[i]


def build_slow_val(params):
    task = build(params)
    task.val_data = SlowVal(float(params.get("val_delay", 0.0)))
    if params.get("val_raises"):
        def broken(outputs, targets):
            raise ValueError("validation metric exploded on purpose")
        task.metrics_fn = broken
    return task
