"""The workload of benchmarks/fsdp_gang.py: one model and data set, trained as a torchherd `fsdp` Task gang
(`build`) and by a plain FSDP2 loop under torchrun (run this file: `torchrun ... _fsdp_workload.py`)."""
from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

QUICK = "TORCHHERD_BENCH_QUICK"  # "1": the least size (fsdp_gang.py --quick sets it for both ways)
WIDTH, LAYERS, SAMPLES, BATCH, EPOCHS = (32, 2, 128, 32, 1) if os.environ.get(QUICK) == "1" else (512, 6, 4096, 32, 3)


def model() -> nn.Module:
    torch.manual_seed(0)
    layers = [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, WIDTH, generator=g)
    return TensorDataset(x, x[:, :8].sum(dim=1, keepdim=True))


def build(params):
    from torchherd import Task

    net = model()
    return Task(model=net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-4), train_data=data(),
                loss_fn=nn.functional.mse_loss)


def plain_fsdp2() -> None:
    """What a user writes without torchherd: FSDP2 per layer, Adam, each rank its share of every epoch."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model()
    for child in net.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    x, y = data().tensors
    start, seen = None, 0
    for epoch in range(EPOCHS):
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))[rank::world]
        for i in range(0, len(order) - BATCH + 1, BATCH):
            start = start or time.monotonic()
            idx = order[i:i + BATCH]
            nn.functional.mse_loss(net(x[idx]), y[idx]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            seen += BATCH * world
    if rank == 0:
        print(f"fsdp_loop: trained {seen} samples in {time.monotonic() - start:.3f}s", flush=True)
    dist.barrier()


if __name__ == "__main__":
    sys.exit(plain_fsdp2())
