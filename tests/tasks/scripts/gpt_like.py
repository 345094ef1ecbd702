"""A training script in the shape of popular GPT trainers, and knowing nothing of torchherd.

It reads RANK to decide whether it is distributed (DDP over gloo on CPU), resumes only when told
`--init_from=resume`, writes its own checkpoint `ckpt.pt` into `--out_dir` every `--eval_interval`
iterations (after printing `step N: train loss X, val loss Y`), prints `iter N: loss X` as it trains,
and does not catch Ctrl-C (or, with --ignore_sigint, ignores it).
"""
import argparse
import os
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", default="out")
parser.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
parser.add_argument("--max_iters", type=int, default=200)
parser.add_argument("--eval_interval", type=int, default=20)
parser.add_argument("--delay", type=float, default=0.02)  # seconds per iteration: a workload knob
parser.add_argument("--ignore_sigint", action="store_true")  # Ctrl-C does nothing (SIGTERM still ends it)
args = parser.parse_args()
if args.ignore_sigint:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)

ddp = int(os.environ.get("RANK", -1)) != -1  # is this a ddp run?
if ddp:
    torch.distributed.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    master_process = int(os.environ["RANK"]) == 0
else:
    master_process = True
print(f"gpt_like: ddp={ddp} world_size={os.environ.get('WORLD_SIZE')} cwd={os.getcwd()}", flush=True)

torch.manual_seed(1337)
x = torch.randn(256, 8)
y = x.sum(dim=1, keepdim=True)
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
iter_num = 0
ckpt_path = os.path.join(args.out_dir, "ckpt.pt")
if args.init_from == "resume":
    checkpoint = torch.load(ckpt_path, map_location="cpu")
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    iter_num = checkpoint["iter_num"]
    print(f"gpt_like: resuming from iter {iter_num}", flush=True)
if ddp:
    model = nn.parallel.DistributedDataParallel(model)
raw_model = model.module if ddp else model

while True:
    if iter_num % args.eval_interval == 0 and master_process:
        with torch.no_grad():
            train_loss = nn.functional.mse_loss(raw_model(x[:128]), y[:128]).item()
            val_loss = nn.functional.mse_loss(raw_model(x[128:]), y[128:]).item()
        print(f"step {iter_num}: train loss {train_loss:.4f}, val loss {val_loss:.4f}", flush=True)
        if iter_num > 0:
            os.makedirs(args.out_dir, exist_ok=True)
            torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num},
                       ckpt_path)
            print(f"saving checkpoint to {args.out_dir}", flush=True)
    if iter_num >= args.max_iters:
        break
    batch = torch.randint(0, 128, (32,))
    loss = nn.functional.mse_loss(model(x[batch]), y[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(args.delay)
    iter_num += 1
    if master_process:
        print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)

if ddp:
    torch.distributed.destroy_process_group()
