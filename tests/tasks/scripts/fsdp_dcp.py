"""An FSDP2 training script that checkpoints with torch.distributed.checkpoint itself, as people write it for
`torchrun --standalone --nproc-per-node N`: it knows nothing of torchherd.

Every epoch each rank writes its shards into CHECKPOINT/epoch-E, renamed from a temporary folder
once all are in; `--resume` loads the newest into whatever world size it runs with now.
`--fail-once FILE` exits with an error after the first epoch unless FILE exists (and makes it).
"""
import argparse
import os
import shutil
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--fail-once", default="")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
for layer in (net[0], net[2]):
    fully_shard(layer)
fully_shard(net)
opt = torch.optim.Adam(net.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
x = torch.randn(256, 4, generator=g)
y = x.sum(dim=1, keepdim=True) * 3 + 1

start = 0
saved = sorted((int(p.name.split("-")[1]), p) for p in os.scandir(args.checkpoint) if p.name.startswith("epoch-")) \
    if args.resume and os.path.isdir(args.checkpoint) else []
if saved:
    epoch, path = saved[-1]
    model_state, optim_state = get_state_dict(net, opt)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path.path)
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    start = epoch + 1
    if rank == 0:
        print(f"fsdp_dcp: resumed after epoch {epoch} on {world} ranks", flush=True)

for epoch in range(start, args.epochs):
    mine = torch.randperm(256, generator=torch.Generator().manual_seed(epoch))[rank::world]
    total = torch.zeros(())
    for i in range(0, len(mine), 16):
        idx = mine[i:i + 16]
        loss = nn.functional.mse_loss(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += loss.detach()
    dist.all_reduce(total)
    tmp = os.path.join(args.checkpoint, f".epoch-{epoch}.tmp")
    model_state, optim_state = get_state_dict(net, opt)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    if rank == 0:
        final = os.path.join(args.checkpoint, f"epoch-{epoch}")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        print(f"Epoch {epoch}, Loss: {float(total) / world / -(-len(mine) // 16):.6f}", flush=True)
    dist.barrier()
    if args.fail_once and not os.path.exists(args.fail_once):
        dist.barrier()
        if rank == 0:
            open(args.fail_once, "w").close()
        sys.exit(3)
