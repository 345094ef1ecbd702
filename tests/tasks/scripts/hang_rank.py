"""A 2-rank gloo script whose `--odd` rank misbehaves: it sleeps before one all_reduce, or on every step.

Each step is one all_reduce of a 4-element tensor; rank 0 prints `step N loss L`.
`--hang-at S --hang-for T`: the odd rank sleeps T seconds before step S's all_reduce
(its peers wait there). `--slow D`: the odd rank sleeps D seconds more each step
(a straggler). `--spin`: peers wait in a busy loop. `--client`: every rank reports each step through torchherd.client.
"""
import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--odd", type=int, default=1)
parser.add_argument("--hang-at", type=int, default=0)
parser.add_argument("--hang-for", type=float, default=0.0)
parser.add_argument("--slow", type=float, default=0.0)
parser.add_argument("--delay", type=float, default=0.01)  # seconds of "work" per step on every rank
parser.add_argument("--client", action="store_true")
# wait for the all_reduce in a busy loop, as a CUDA sync spins: a rank left waiting burns a core
parser.add_argument("--spin", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
herd = None
if args.client:
    import torchherd.client as herd
value = torch.ones(4)
for step in range(1, args.steps + 1):
    time.sleep(args.delay + (args.slow if rank == args.odd else 0.0))
    if rank == args.odd and step == args.hang_at:
        time.sleep(args.hang_for)
    if args.spin:
        work = dist.all_reduce(value, async_op=True)
        while not work.is_completed():
            pass
    else:
        dist.all_reduce(value)
    value /= dist.get_world_size()
    loss = 1.0 / step
    if herd is not None:
        herd.report(step=step, loss=loss)
        if herd.should_stop():
            break
    elif rank == 0:
        print(f"step {step} loss {loss:.5f}", flush=True)
dist.destroy_process_group()
