"""A tiny regression task for the GPU tests: it trains where torchherd puts it and says which GPU that is.

Params (all optional):
  samples                 training samples (synthetic y = 3*sum(x) + 1)
  reserve_fraction        at build, hold a tensor of this share of its GPU's memory (the memory cap test)
  oom_at_call, once_file  at this forward call, allocate more than the GPU holds (a real CUDA OOM), once:
                          only while `once_file` does not exist, and it creates it, so the restart proceeds
"""
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from torchherd.engine import Task


class Probe(nn.Module):
    """A linear model that can run out of GPU memory on purpose, once."""

    def __init__(self, oom_at_call, once_file):
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.calls, self.oom_at_call, self.once_file = 0, oom_at_call, once_file

    def forward(self, x):
        self.calls += 1
        if self.oom_at_call is not None and self.calls == self.oom_at_call and not os.path.exists(self.once_file):
            open(self.once_file, "w").close()
            total = torch.cuda.get_device_properties(x.device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=x.device)  # twice the GPU: CUDA out of memory
        return self.lin(x)


def describe_gpu() -> str:
    """The GPU this process uses, as its log line tells the tests: index, how many it sees, its identity."""
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    identity = getattr(props, "uuid", "") or getattr(props, "pci_bus_id", "") or "unknown"
    return (f"gpu_task: current cuda:{index} of {torch.cuda.device_count()} visible "
            f"[{os.environ.get('CUDA_VISIBLE_DEVICES', '')}] local_rank {os.environ.get('LOCAL_RANK', '-')} "
            f"id {identity}")


def build(params):
    torch.manual_seed(0)
    print(describe_gpu(), flush=True)
    fraction = float(params.get("reserve_fraction", 0.0))
    if fraction:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        build.reserved = torch.empty(int(fraction * total), dtype=torch.uint8, device="cuda")  # kept alive
        print(f"gpu_task: reserved {fraction:.2f} of the GPU", flush=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(int(params.get("samples", 256)), 4, generator=g)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True) * 3 + 1)
    vx = torch.randn(64, 4, generator=g)
    val = TensorDataset(vx, vx.sum(dim=1, keepdim=True) * 3 + 1)
    model = Probe(params.get("oom_at_call"), params.get("once_file"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return Task(model=model, optimizer=opt, train_data=data, val_data=val, loss_fn=nn.functional.mse_loss)
