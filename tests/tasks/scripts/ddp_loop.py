"""A plain DistributedDataParallel script, as people write it for `torchrun --standalone --nproc-per-node N`.

It knows nothing of torchherd: init_process_group from torchrun's variables, a
DistributedSampler, DDP, rank 0 printing `Epoch N, Loss: L` and saving a checkpoint
it resumes from. Each rank prints its final weights' checksum, so tests can see that
the ranks ended identical.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=512)
parser.add_argument("--delay", type=float, default=0.0)  # seconds per step: a workload knob
parser.add_argument("--checkpoint", default="")  # rank 0 saves here each epoch and resumes from it
parser.add_argument("--width", type=int, default=16)  # hidden units: a workload knob
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print("torchrun env " + " ".join(f"{k}={os.environ.get(k)}" for k in (
    "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR")), flush=True)
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
x = torch.randn(args.samples, 8, generator=g)
y = x.sum(dim=1, keepdim=True) * 2 - 1
data = TensorDataset(x, y)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=32, sampler=sampler)
model = nn.Sequential(nn.Linear(8, args.width), nn.ReLU(), nn.Linear(args.width, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if args.checkpoint and os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["epoch"] + 1
ddp = DistributedDataParallel(model)
step = 0
began, samples = time.perf_counter(), 0
for epoch in range(start, args.epochs):
    sampler.set_epoch(epoch)
    total = torch.zeros(())
    batches = 0
    for xb, yb in loader:
        loss = nn.functional.mse_loss(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.detach()
        batches += 1
        samples += len(xb)
        step += 1
        if args.delay:
            time.sleep(args.delay)
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
    dist.all_reduce(total)
    mean = total.item() / world / batches
    if rank == 0:
        print(f"Epoch {epoch + 1}, Loss: {mean:.5f}", flush=True)
        if args.checkpoint:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, tmp)
            os.replace(tmp, args.checkpoint)
if rank == 0:  # the whole gang's speed, as this script measures it: benchmarks compare launchers by it
    print(f"ddp_loop: trained {samples * world} samples in {time.perf_counter() - began:.4f}s", flush=True)
with torch.no_grad():
    checksum = sum(float(p.double().sum()) for p in model.parameters())
print(f"ddp_loop: rank {rank} of {world} weights checksum {checksum:.10g}", flush=True)
dist.destroy_process_group()
