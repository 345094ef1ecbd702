"""Does background validation stop training? One workload trained three ways, timed in one script.

Train only, inline validation and background validation, each with one worker
thread (and, in the background case, one validator thread: on a 2-core machine
one core each). Prints each way's training wall time over train-only, the
worker's stall per hand-off against a plain copy of the same bytes, and the
saturated case (two workers on two cores) that decides what validation.mode
'auto' picks. Run: python benchmarks/validation_overlap.py [--quick] (EPOCHS, ROUNDS, HIDDEN, TRAIN, VAL to change
the size; --quick: every part once at the least size, workers forked from one warm process: CI, figures meaningless)
"""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, SnapshotTaken, TrainingStarted, ValResult  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

TASK = f"{Path(__file__).resolve().parent / '_overlap_task.py'}:build"
QUICK = "--quick" in sys.argv[1:]
EPOCHS = int(os.environ.get("EPOCHS", "2" if QUICK else "6"))
ROUNDS = int(os.environ.get("ROUNDS", "1" if QUICK else "2"))
# The workload: hidden width and sample counts (validation about half an epoch's cost).
PARAMS = {"hidden": int(os.environ.get("HIDDEN", "32" if QUICK else "1536")),
          "train": int(os.environ.get("TRAIN", "256" if QUICK else "4096")),
          "val": int(os.environ.get("VAL", "256" if QUICK else "6144"))}


async def one_run(tmp: Path, mode: str, pipelines: int = 1) -> dict:
    data = {"runs_dir": str(tmp), "defaults": {"task": TASK, "max_epochs": EPOCHS, "batch_size": 128,
                                                "log_every_n_steps": 50, "params": PARAMS},
            "pipelines": [{"name": f"p{i}"} for i in range(pipelines)],
            "devices": {"placement": "cpu", "cpu_slots": pipelines, "threads_per_worker": 1},
            "validation": {"mode": mode, "device": "cpu", "threads": 1, "policy": "all", "slots": 4},
            "telemetry": {"enabled": False}}
    config = parse_config(data, str(tmp / f"{mode}.toml"), tmp)
    sup = Supervisor(config, inventory=Inventory(cpu_count=os.cpu_count() or 1))
    stream = sup.subscribe()
    await sup.start()
    await sup.wait()
    await sup.shutdown()
    start: dict[str, float] = {}
    last_epoch: dict[str, float] = {}
    last_val: dict[str, float] = {}
    stalls, nbytes, val_s = [], 0, []
    async for ev in stream:
        if isinstance(ev, TrainingStarted):
            start[ev.pipeline] = ev.time
        elif isinstance(ev, EpochEnd):
            last_epoch[ev.pipeline] = ev.time
        elif isinstance(ev, ValResult):
            last_val[ev.pipeline] = ev.time
            if ev.mode == "inline":
                val_s.append(ev.latency)
        elif isinstance(ev, SnapshotTaken):
            stalls.append(ev.stall_ms)
            nbytes = ev.nbytes
    train = statistics.mean(last_epoch[p] - start[p] for p in start)
    until_result = statistics.mean(max(last_epoch[p], last_val.get(p, 0.0)) - start[p] for p in start)
    return {"train": train, "until_result": until_result, "stalls": stalls, "nbytes": nbytes, "val_s": val_s}


def memcpy_ms(nbytes: int, repeats: int = 50) -> float:
    import torch

    torch.set_num_threads(1)
    src, dst = torch.empty(nbytes, dtype=torch.uint8).fill_(1), torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    from _quick import warm

    with warm(QUICK):
        measure()


def measure() -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        print(f"machine: {os.cpu_count()} cores; worker 1 thread, validator 1 thread; {EPOCHS} epochs, "
              f"best of {ROUNDS} rounds; "
              f"MLP hidden {PARAMS['hidden']}, {PARAMS['train']} train / {PARAMS['val']} val samples")
        runs: dict[str, list[dict]] = {"off": [], "inline": [], "background": []}
        for i in range(ROUNDS):  # alternate the three, keep each one's best: noise on a shared box only slows
            for mode in runs:
                runs[mode].append(asyncio.run(one_run(tmp / f"{mode}-{i}", mode)))
        base, inline, back = (min(runs[m], key=lambda r: r["train"]) for m in ("off", "inline", "background"))
        epoch = base["train"] / EPOCHS
        val = statistics.mean(inline["val_s"]) if inline["val_s"] else 0.0
        print(f"train only: {base['train']:.2f}s of training ({epoch:.2f}s an epoch); "
              f"one validation pass takes {val:.2f}s = {val / epoch:.2f} of an epoch")
        print(f"inline/train-only:     {inline['train'] / base['train']:.3f}")
        print(f"background/train-only: {back['train'] / base['train']:.3f}  (goal <= 1.05; last result "
              f"{back['until_result'] - back['train']:.2f}s after training ended)")
        stall = statistics.median(back["stalls"])
        copy = memcpy_ms(back["nbytes"])
        print(f"hand-off: {back['nbytes'] / 2**20:.1f} MiB of weights, worker stall {stall:.2f} ms median "
              f"(max {max(back['stalls']):.2f}); plain copy of the same bytes {copy:.2f} ms; "
              f"stall - copy = {stall - copy:.2f} ms (goal <= 1 ms)")
        print(f"hand-off bandwidth {back['nbytes'] / stall / 1e6:.2f} GB/s vs memcpy "
              f"{back['nbytes'] / copy / 1e6:.2f} GB/s: ratio {copy / stall:.2f} (goal >= 0.5)")
        cores = os.cpu_count() or 1
        sat_inline = asyncio.run(one_run(tmp / "sat-inline", "inline", pipelines=cores))
        sat_back = asyncio.run(one_run(tmp / "sat-bg", "background", pipelines=cores))
        print(f"saturated ({cores} workers on {cores} cores): background/inline training time "
              f"{sat_back['train'] / sat_inline['train']:.3f}, until the last result "
              f"{sat_back['until_result'] / sat_inline['until_result']:.3f} (auto picks inline here)")


if __name__ == "__main__":
    main()
