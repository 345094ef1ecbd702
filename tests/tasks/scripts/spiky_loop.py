"""A training loop for the loss-spike alert: prints `epoch E step N loss X` each step and knows nothing of torchherd.

Its loss falls as a real one does (a power law to a floor, with noise). With --outlier-at the same hard batch
costs --outlier-x times the rest at that step of every epoch (healthy); with --diverge-at the loss jumps there and
stays up, climbing (a run that diverged); with --running-mean it prints the epoch's mean loss so far instead, as
progress bars do. Pure Python and seeded: the same numbers every run, in milliseconds.
"""
import argparse
import random
import time

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=150)  # steps per epoch
parser.add_argument("--outlier-at", type=int, default=0)  # step of each epoch (1-based) with the hard batch; 0: none
parser.add_argument("--outlier-x", type=float, default=20.0)  # its loss, times the step's usual loss
parser.add_argument("--diverge-at", type=int, default=0)  # global step (1-based) where the loss jumps up; 0: never
parser.add_argument("--diverge-x", type=float, default=5.0)  # the jump, times the loss before it
parser.add_argument("--noise", type=float, default=0.05)  # relative noise of each step's loss
parser.add_argument("--delay", type=float, default=0.001)  # seconds per step: a workload knob
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--running-mean", action="store_true")  # print the epoch's mean loss so far
args = parser.parse_args()

rng = random.Random(args.seed)
step = 0
jumped = 0.0  # the loss the run diverged to (0: it has not)
for epoch in range(args.epochs):
    total = 0.0
    for i in range(1, args.steps + 1):
        step += 1
        loss = 0.05 + 2.0 * (1 + step / 20) ** -0.7
        if args.diverge_at and step >= args.diverge_at:
            jumped = jumped or loss * args.diverge_x
            loss = jumped * (1 + 0.002 * (step - args.diverge_at))
        if i == args.outlier_at:
            loss *= args.outlier_x
        loss *= max(0.0, 1 + args.noise * rng.gauss(0, 1))
        total += loss
        if args.running_mean:
            loss = total / i
        print(f"epoch {epoch + 1} step {step} loss {loss:.5f}", flush=True)
        if args.delay:
            time.sleep(args.delay)
