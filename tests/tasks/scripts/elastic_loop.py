"""A DDP script that resumes itself, as an elastic script gang runs it: gloo from torchrun's variables, rank 0
saving {model, optimizer, step} with torch.save every --save_every steps into --out, and loading the file that
resume_args pass as --resume, at whatever WORLD_SIZE it is started with. It keeps its own global batch."""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)  # the folder rank 0 saves ckpt.pt into
parser.add_argument("--resume", default="")  # a ckpt.pt to start from
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--save_every", type=int, default=5)
parser.add_argument("--global_batch", type=int, default=64)  # samples a step, split between the ranks
parser.add_argument("--delay", type=float, default=0.0)  # seconds a step: a workload knob
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"elastic_loop: rank {rank} runs at WORLD_SIZE {world}", flush=True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if args.resume:
    state = torch.load(args.resume)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
    print(f"elastic_loop: rank {rank} resumed from step {start} at WORLD_SIZE {world}", flush=True)
ddp = DistributedDataParallel(model)
per_rank = args.global_batch // world
for step in range(start + 1, args.steps + 1):
    g = torch.Generator().manual_seed(step * 1000 + rank)  # each step's data, whatever the size
    x = torch.randn(per_rank, 8, generator=g)
    loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.delay:
        time.sleep(args.delay)
    if rank == 0:
        print(f"step {step} loss {loss.item():.5f}", flush=True)
        if step % args.save_every == 0:
            tmp = os.path.join(args.out, ".ckpt.pt.tmp")  # a dot name: no checkpoint until it is whole
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, os.path.join(args.out, "ckpt.pt"))
print(f"elastic_loop: rank {rank} done at step {args.steps} at WORLD_SIZE {world}", flush=True)
dist.destroy_process_group()
