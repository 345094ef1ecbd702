"""A DDP script in the shape of PyTorch's own examples for `torchrun --nproc-per-node N`, on GPUs.

It picks its GPU by LOCAL_RANK (`cuda:{LOCAL_RANK}`, `set_device`, `DDP(device_ids=[LOCAL_RANK])`), so
every rank must see the whole gang's GPUs, and talks NCCL. It knows nothing of torchherd. Rank 0
prints `Epoch N, Loss: L`; every rank prints the GPU it used and its final weights' checksum.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=512)
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device(f"cuda:{local_rank}")
torch.cuda.set_device(device)
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
props = torch.cuda.get_device_properties(device)
identity = getattr(props, "uuid", "") or getattr(props, "pci_bus_id", "") or "unknown"
print(f"ddp_cuda: rank {rank} local_rank {local_rank} of {torch.cuda.device_count()} visible "
      f"[{os.environ.get('CUDA_VISIBLE_DEVICES', '')}] id {identity}", flush=True)
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(args.samples, 8, generator=g)
data = TensorDataset(x, x.sum(dim=1, keepdim=True) * 2 - 1)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=32, sampler=sampler)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
ddp = DistributedDataParallel(model, device_ids=[local_rank])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    total, batches = torch.zeros((), device=device), 0
    for xb, yb in loader:
        loss = nn.functional.mse_loss(ddp(xb.to(device)), yb.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.detach()
        batches += 1
    dist.all_reduce(total)  # over NCCL, between the ranks' GPUs
    if rank == 0:
        print(f"Epoch {epoch + 1}, Loss: {total.item() / world / batches:.5f}", flush=True)
with torch.no_grad():
    checksum = sum(float(p.double().sum()) for p in model.parameters())
print(f"ddp_cuda: rank {rank} of {world} weights checksum {checksum:.10g}", flush=True)
dist.destroy_process_group()
