"""A small multi-layer regression task for sharded (fsdp) gangs: several layers, so FSDP2 has units to shard."""
import torch
from torch import nn

from torchherd.engine import Task
from tiny import Slow  # its folder is importable: torchherd puts it on sys.path


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def build(params):
    net = model()
    data = Slow(int(params.get("samples", 256)), float(params.get("delay", 0.0)), 1)
    lr = float(params.get("lr", 0.01))
    # Adam has state to shard and reshard; `factory_optimizer` gives it as a function of the parameters instead
    opt = (lambda ps: torch.optim.Adam(ps, lr=lr)) if params.get("factory_optimizer") else \
        torch.optim.Adam(net.parameters(), lr=lr)
    return Task(model=net, optimizer=opt, train_data=data, val_data=Slow(64, 0.0, 2),
                loss_fn=nn.functional.mse_loss)
