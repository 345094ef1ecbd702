"""A script that saves each epoch and then validates it, as many do: `step S loss L` lines, `saved epoch N`
after its checkpoint, then `val epoch N val_loss V` (V = quality / N, so a lower --quality is better at every
epoch). With --resume it carries on from its checkpoint, its step count too. Pure Python: starts in milliseconds.
"""
import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps", type=int, default=3)  # per epoch
parser.add_argument("--delay", type=float, default=0.2)  # seconds per step: a workload knob
parser.add_argument("--quality", type=float, default=1.0)
parser.add_argument("--out", required=True)  # its checkpoint folder
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()
path = os.path.join(args.out, "last.json")
start, step = 0, 0
if args.resume and os.path.exists(path):
    with open(path) as fh:
        state = json.load(fh)
    start, step = state["epoch"], state["step"]
    print(f"resumed at epoch {start} step {step}", flush=True)
try:
    for epoch in range(start + 1, args.epochs + 1):
        for _ in range(args.steps):
            time.sleep(args.delay)
            step += 1
            print(f"step {step} loss {args.quality / step:.4f}", flush=True)
        with open(path + ".tmp", "w") as fh:
            json.dump({"epoch": epoch, "step": step}, fh)
        os.replace(path + ".tmp", path)
        print(f"saved epoch {epoch}", flush=True)
        print(f"val epoch {epoch} val_loss {args.quality / epoch:.4f}", flush=True)
except KeyboardInterrupt:
    print("rung_loop: interrupted", flush=True)
    sys.exit(0)
