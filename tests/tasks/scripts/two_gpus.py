"""A script that holds two GPUs in one process (gpus_per_rank = 2): a few steps of nn.DataParallel over them,
then of a model split by hand, its first half on one GPU and its second on the other. Prints what it used."""
import os

import torch
from torch import nn

own = [int(i) for i in os.environ["TORCHHERD_GPUS"].split(",")]
assert len(own) == 2 and torch.cuda.device_count() >= 2, (own, torch.cuda.device_count())
first, second = (torch.device(f"cuda:{i}") for i in own)
torch.manual_seed(0)

model = nn.DataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).to(first), device_ids=own)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    x = torch.randn(128, 64, device=first)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"two_gpus: data_parallel ok on {own} loss {loss.item():.4f}", flush=True)

front, back = nn.Linear(64, 256).to(first), nn.Linear(256, 1).to(second)
opt = torch.optim.SGD([*front.parameters(), *back.parameters()], lr=0.01)
for _ in range(5):
    x = torch.randn(128, 64, device=first)
    loss = back(torch.relu(front(x)).to(second)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"two_gpus: split ok on {first} and {second} loss {loss.item():.4f}", flush=True)
