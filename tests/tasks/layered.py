"""A small multi-layer regression task for sharded (fsdp) gangs: several layers, so FSDP2 has units to shard.

Params (all optional): samples, delay, lr, factory_optimizer; save_gate_file and save_gate_after: after
`save_gate_after` (default 0) 'last' checkpoints, each rank's write of its shards waits until `save_gate_file`
exists (a slow disk).
"""
import os
import time

import torch
from torch import nn

from torchherd.engine import Task
from tiny import Slow  # its folder is importable: torchherd puts it on sys.path


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def _gate_shard_writes(gate: str, after: int) -> None:
    """Make this rank's DCP write of every 'last' checkpoint's shards after the first `after` wait for `gate`."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    real = FileSystemWriter.write_data
    passed = [0]

    def write_data(self, plan, planner):
        if ".last.dcp." in str(self.path):
            passed[0] += 1
            deadline = time.monotonic() + 300.0  # bounded: a test that never opens it fails, it does not hang
            while passed[0] > after and not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return real(self, plan, planner)

    FileSystemWriter.write_data = write_data


def build(params):
    if params.get("save_gate_file"):
        _gate_shard_writes(params["save_gate_file"], int(params.get("save_gate_after", 0)))
    net = model()
    data = Slow(int(params.get("samples", 256)), float(params.get("delay", 0.0)), 1)
    lr = float(params.get("lr", 0.01))
    # Adam has state to shard and reshard; `factory_optimizer` gives it as a function of the parameters instead
    opt = (lambda ps: torch.optim.Adam(ps, lr=lr)) if params.get("factory_optimizer") else \
        torch.optim.Adam(net.parameters(), lr=lr)
    return Task(model=net, optimizer=opt, train_data=data, val_data=Slow(64, 0.0, 2),
                loss_fn=nn.functional.mse_loss)
