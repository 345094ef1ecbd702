"""A training loop for tests that uses torchherd.client: reports steps, stops when asked, resumes, hands off.

A linear model on synthetic data; its checkpoint holds the weights and where it got to.
"""
import argparse

import torch
from torch import nn

import torchherd.client as herd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=20)  # steps per epoch
parser.add_argument("--delay", type=float, default=0.0)  # seconds per step: a workload knob
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(256, 4)
y = x.sum(dim=1, keepdim=True) * 3 + 1
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
start_epoch, step = 0, 0
assert herd.supervised(), "client_loop runs under torchherd in these tests"
resume = herd.resume_from()
if resume is not None:
    state = torch.load(resume)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    start_epoch, step = state["epoch"], state["step"]
    print(f"client_loop: resumed from {resume.name} at epoch {start_epoch} step {step}", flush=True)


def save(next_epoch):
    herd.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": next_epoch, "step": step})


for epoch in range(start_epoch, args.epochs):
    for i in range(args.steps):
        batch = torch.randint(0, 256, (32,))
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        herd.report(step=step, loss=loss.detach(), lr=0.05, samples=32)
        if herd.checkpoint_requested():
            save(epoch)
        if herd.should_stop():
            save(epoch)
            raise SystemExit(0)
        if args.delay:
            import time
            time.sleep(args.delay)  # workload knob
    herd.epoch_end(epoch)
    herd.hand_off(model)
    save(epoch + 1)
print("client_loop: done", flush=True)
