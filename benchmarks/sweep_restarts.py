"""What warm restarts buy a sweep whose trials all fit their slots (8 trials on an 8-GPU box): PBT and promoting
ASHA restart trials from checkpoints, and torchherd forks each restart after the first from a process that has
imported torch (`Backend.expect_restarts`); the baseline, in the same script, switches that hook off, so every
restart imports torch afresh. Each sweep prints its wall time, the CPU seconds of every process it started
(children and their forks included), its restarts and its best val_loss (PBT's exploits hang on timing, so
restarts and metric vary from round to round), then the ratios to the baseline over all rounds; rounds
alternate which goes first. Goal: fewer CPU seconds and no more wall time than the baseline.
Usage: python benchmarks/sweep_restarts.py [--trials 4] [--epochs 8] [--samples 4000] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config
from torchherd.engine.launch.process import ProcessLauncher
from torchherd.engine.protocol.messages import ValResult, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor

LRS = [0.03, 0.01, 0.003, 0.001, 0.05, 0.02, 0.005, 0.002]  # the first --trials of them
SWEEPS = {"pbt": {"scheduler": "pbt", "perturbation_interval": 1, "seed": 1},
          "promote": {"scheduler": "asha", "mode": "promote", "grace_period": 1, "reduction_factor": 2}}


@dataclass
class Result:
    wall: float
    cpu: float  # user + system seconds of this process and every process it started
    restarts: int
    best: float


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def sweep(tmp: Path, how: str, trials: int, epochs: int, samples: int) -> Result:
    config = parse_config({
        "runs_dir": str(tmp / "runs"), "tensorboard": False,
        "defaults": {"task": "regression", "max_epochs": epochs, "batch_size": 128,
                     "params": {"samples": samples, "hidden": 64}},
        "pipelines": [{"name": "reg"}], "devices": {"placement": "cpu", "cpu_slots": trials},
        "validation": {"mode": "inline"}, "telemetry": {"enabled": False},
        "sweep": {"space": {"params": {"lr": LRS[:trials]}}, **SWEEPS[how]}}, str(tmp / "sweep.toml"), tmp)
    sup = Supervisor(config)
    t, cpu = time.perf_counter(), cpu_seconds()
    await sup.start()
    try:
        await sup.wait()
    finally:
        await sup.shutdown(graceful=False)
    wall, cpu = time.perf_counter() - t, cpu_seconds() - cpu
    events = read_events(sup.run_dir)
    starts = sum(isinstance(e, WorkerStarted) for e in events)
    best = min(e.metrics["val_loss"] for e in events if isinstance(e, ValResult) and not e.error)
    return Result(wall, cpu, starts - trials, best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4, help="trials, each on a CPU slot of its own")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4000, help="regression samples per trial")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("TORCHHERD_LEDGER", tempfile.mkdtemp(prefix="sweep-restarts-ledger-"))
    hook = ProcessLauncher.expect_restarts
    print(f"{args.trials} trials on {args.trials} CPU slots, {args.epochs} epochs of {args.samples} samples; "
          f"load {os.getloadavg()[0]:.2f}")
    for how in SWEEPS:
        totals = {"warm": [0.0, 0.0], "cold": [0.0, 0.0]}
        for r in range(args.rounds):
            order = ["warm", "cold"] if r % 2 == 0 else ["cold", "warm"]
            for kind in order:
                ProcessLauncher.expect_restarts = hook if kind == "warm" else lambda self: None  # type: ignore[method-assign]
                with tempfile.TemporaryDirectory() as tmp:
                    got = asyncio.run(sweep(Path(tmp), how, args.trials, args.epochs, args.samples))
                totals[kind][0] += got.wall
                totals[kind][1] += got.cpu
                print(f"  {how:8s} restarts {kind}: {got.wall:6.1f}s wall, {got.cpu:6.1f}s CPU, "
                      f"{got.restarts} restarts, best val_loss {got.best:.4g}")
        ProcessLauncher.expect_restarts = hook
        (w_wall, w_cpu), (c_wall, c_cpu) = totals["warm"], totals["cold"]
        print(f"{how}: warm restarts / cold restarts over {args.rounds} round(s): {w_wall / c_wall:.2f}x the wall "
              f"time, {w_cpu / c_cpu:.2f}x the CPU seconds (goal: < 1.0x CPU, <= 1.0x wall)")


if __name__ == "__main__":
    main()
