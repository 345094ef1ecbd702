"""Time to the first optimizer step: a bare script, the same under torchrun, as a torchherd script pipeline,
and the built-in `regression` Task, all through the command a user types.

Each way trains the same tiny regression (16 features, a 64-unit MLP, batches of 32, 5 steps) on one CPU
thread. "First step" is the wall time from starting the command until the first step shows: the line a
bare script prints after its first optimizer step, or the first `step` record in the torchherd run's
events.jsonl. Rounds alternate the four ways (ROUNDS, default 5); prints each median and its ratio to the
bare script's, measured in the same run (absolute times on a shared machine are noise). With
BEFORE_PYTHON set to the interpreter of another torchherd install (an older commit, say), its run of the
same Task alternates with the rest as a fifth way, so a change is measured against its baseline in one run.
Run: python benchmarks/first_step.py
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 5
TIMEOUT = 180.0  # seconds one way may take to its first step before the round is given up
POLL = 0.01  # seconds between looks at a run directory's events

TRAIN = '''\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(1234)
x = torch.randn(4096, 16, generator=gen)
w = torch.randn(16, 1, generator=gen)
y = x @ w + 0.1 * torch.randn(4096, 1, generator=gen)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loader = DataLoader(TensorDataset(x[:3276], y[:3276]), batch_size=32, shuffle=True)
for step, (xb, yb) in enumerate(loader, 1):
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    if step >= %d:
        break
''' % STEPS

COMMON = '''
[devices]
placement = "cpu"
cpu_slots = 1

[validation]
mode = "off"

[telemetry]
enabled = false
'''

SCRIPT_CONFIG = '''name = "bench-script"
[[pipelines]]
name = "script"
script = "train.py"
metrics = 'step (?P<step>\\d+) loss (?P<loss>[-+.\\deE]+)'
max_epochs = 1
''' + COMMON

TASK_CONFIG = f'''name = "bench-task"
[[pipelines]]
name = "task"
task = "regression"
max_epochs = 1
max_steps = {STEPS}
log_every_n_steps = 1
''' + COMMON


def until_line(cmd: list[str], cwd: Path) -> float:
    """Seconds from starting `cmd` until it prints its first step line (the process is then left to end)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("step "):
                return time.monotonic() - start
        raise RuntimeError(f"{' '.join(cmd)} ended without a step line (exit {proc.wait()})")
    finally:
        proc.stdout.close()
        proc.wait(timeout=TIMEOUT)


def first_step_record(runs: Path) -> bool:
    for events in runs.glob("*/events.jsonl"):
        with open(events, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith('{"type":"step"'):  # records are written with their type first
                    return True
    return False


def until_event(config: Path, cwd: Path, python: str = sys.executable) -> float:
    """Seconds from `torchherd run CONFIG --headless` until its run directory holds a `step` event."""
    runs = cwd / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    start = time.monotonic()
    proc = subprocess.Popen([python, "-m", "torchherd", "run", str(config), "--headless",
                             "--runs-dir", str(runs)], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - start < TIMEOUT:
            if first_step_record(runs):
                return time.monotonic() - start
            if proc.poll() is not None and not first_step_record(runs):
                raise RuntimeError(f"torchherd run {config.name} ended (exit {proc.returncode}) before a step")
            time.sleep(POLL)
        raise RuntimeError(f"torchherd run {config.name}: no step in {TIMEOUT:g}s")
    finally:
        proc.wait(timeout=TIMEOUT)  # the run is a few steps long: let it end before the next round


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "5"))
    # torchrun beside this interpreter, else on PATH, else the module it runs (a venv that borrows its torch)
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    torchrun = [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]
    with tempfile.TemporaryDirectory(prefix="torchherd-bench-") as tmp:
        here = Path(tmp)
        (here / "train.py").write_text(TRAIN)
        (here / "script.toml").write_text(SCRIPT_CONFIG)
        (here / "task.toml").write_text(TASK_CONFIG)
        ways = {
            "bare python": lambda: until_line([sys.executable, "train.py"], here),
            "torchrun": lambda: until_line([*torchrun, "--standalone", "--nproc_per_node", "1", "train.py"], here),
            "script pipeline": lambda: until_event(here / "script.toml", here),
            "regression Task": lambda: until_event(here / "task.toml", here),
        }
        before = os.environ.get("BEFORE_PYTHON")
        if before:
            ways["Task, BEFORE_PYTHON"] = lambda: until_event(here / "task.toml", here, before)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))  # alternate: no way always goes first
            for name in order:
                times[name].append(ways[name]())
            print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in ways), flush=True)
    bare = statistics.median(times["bare python"])
    print(f"\ntime to first step, median of {rounds} rounds (ratio to bare python):")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:19s} {median:6.2f}s  {median / bare:5.2f}x")


if __name__ == "__main__":
    main()
