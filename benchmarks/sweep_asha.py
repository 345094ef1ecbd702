"""What pruning buys a sweep: wall time and best metric of one grid under ASHA, stopping (`mode = "stop"`) and
promoting (`mode = "promote"`), against the same grid without pruning (torchherd every time), and against Ray
Tune's ASHA on the same trials and slots where Ray is installed (benchmarks/ray_sweeps.py). `--pbt` adds
population-based training (`scheduler = "pbt"`) on the same grid, its best val_loss against the grid's, and
against Ray Tune's PBT.

Goals: ASHA <= 0.5x the unpruned sweep's time for the same best trial; <= 1.0x Ray Tune's time.
`--trials 8` is 4 learning rates x 2 batch sizes; `--trials 16` is 8 x 2.
Each trial is a process of its own that builds its task before its first step; pruning saves only the
training after a rung, so `--samples` sets epochs long enough for training to be most of a trial. Rounds
alternate which sweep goes first, so a change in the machine's load falls on both; each sweep also says how
long its trials took to start (worker started -> training started) and how long a freed slot stood idle.
16 epochs by default (rungs at 1, 2, 4 and 8): with 8, the one trial that trains to the end holds a slot for
8 of the pruned sweep's epochs while the other slot idles, and the run's one import of torch is a quarter of
its time, so the ratio measures those more than pruning (0.45-0.56x there on a quiet box).
Usage: python benchmarks/sweep_asha.py [--trials 8] [--slots 2] [--epochs 16] [--samples 40000] [--rounds 2]
       [--grace 1] [--pbt [--interval 2]] [--no-ray]
       python benchmarks/sweep_asha.py --quick [--no-ray]   (every sweep, PBT and Ray Tune's too, once at the least
       size: 2 lrs x 2 batch sizes, 2 epochs; for CI, figures meaningless)
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.protocol.messages import (EpochEnd, PipelineFinished, RunStarted,  # noqa: E402
                                                TrainingStarted, TrialDecision, ValResult, WorkerStarted)
from torchherd.engine.rundir.directory import read_events  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

LRS = [0.03, 0.01, 0.003, 0.001]
LRS_16 = [0.1, 0.05, 0.03, 0.02, 0.01, 0.005, 0.003, 0.001]  # --trials 16
MODES = {"none": "no pruning:", "stop": "ASHA stop:", "promote": "ASHA promote:"}  # the sweeps of a round
# --pbt adds it to MODES, --interval sets its interval; batch sizes resampled from the grid's, as Ray's PBT is told
PBT = {"scheduler": "pbt", "perturbation_interval": 2, "explore": {"batch_size": "resample"}}
BATCHES = [32, 128]
PARAMS = {"samples": 40000, "hidden": 128}  # --samples overrides


@dataclass
class Sweep:
    """One torchherd sweep of the grid: its wall time, best trial and what its events say of start-ups."""

    wall: float
    best: str
    value: float
    first: float  # seconds from the run's start to its first training step
    startup: list[float]  # seconds from each worker's start to its first training step
    idle: list[float]  # seconds from a trial's end to the start of the next on the slot it freed
    epochs: int  # epochs trained, all trials together
    pruned: int  # trials pruned
    exploits: int = 0  # PBT: checkpoints taken over


def timings(events: list, slots: int) -> tuple[float, list[float], list[float]]:
    """(first step, start-ups, slot idle gaps) of a sweep, from its events.jsonl; a promoted trial starts
    again, so each training start is paired with its own worker's start."""
    started: dict[str, float] = {}
    startup = []
    for e in events:
        if isinstance(e, WorkerStarted):
            started[e.pipeline] = e.time
        elif isinstance(e, TrainingStarted):
            startup.append(e.time - started[e.pipeline])
    trained = [e for e in events if isinstance(e, TrainingStarted)]
    first = min(e.time for e in trained) - min(e.time for e in events if isinstance(e, RunStarted))
    starts = sorted(e.time for e in events if isinstance(e, WorkerStarted))
    ends = sorted(e.time for e in events if isinstance(e, PipelineFinished))
    # The k-th attempt to end frees the slot that the (slots + k)-th to start takes.
    return first, startup, [starts[slots + k] - ends[k] for k in range(len(starts) - slots)]


async def torchherd_sweep(tmp: Path, how: str, slots: int, epochs: int, grace: int) -> Sweep:
    """The grid under `how`: "none" (no pruning), ASHA's mode ("stop", "promote"), or "pbt"."""
    asha = {"scheduler": "asha", "mode": how, "grace_period": grace, "reduction_factor": 2} \
        if how in ("stop", "promote") else PBT if how == "pbt" else {"scheduler": "none"}
    config = parse_config({
        "runs_dir": str(tmp / "runs"), "tensorboard": False,
        "defaults": {"task": "regression", "max_epochs": epochs, "params": PARAMS},
        "pipelines": [{"name": "reg"}], "devices": {"placement": "cpu", "cpu_slots": slots},
        "validation": {"mode": "inline"}, "telemetry": {"enabled": False},
        "sweep": {"space": {"params": {"lr": LRS}, "batch_size": BATCHES}, **asha}}, str(tmp / "sweep.toml"), tmp)
    sup = Supervisor(config)
    t = time.perf_counter()
    await sup.start()
    try:
        await sup.wait()
    finally:
        await sup.shutdown(graceful=False)
    wall = time.perf_counter() - t
    events = read_events(sup.run_dir)
    best = min((e for e in events if isinstance(e, ValResult) and not e.error), key=lambda e: e.metrics["val_loss"])
    if how == "none":  # could any rule that ranks at the rungs keep the grid's best?
        kept, said = halving(events, best.pipeline, [r for r in (grace * 2 ** k for k in range(8)) if r < epochs], 2)
        print(f"  the grid's best {best.pipeline} ranked {', '.join(said)}; successive halving with full rungs "
              f"keeps {kept}" + ("" if kept == best.pipeline else ", NOT the grid's best"))
    return Sweep(wall, best.pipeline, best.metrics["val_loss"], *timings(events, slots),
                 epochs=sum(isinstance(e, EpochEnd) for e in events),
                 pruned=len({e.pipeline for e in events if isinstance(e, PipelineFinished) and e.status == "pruned"
                             and not e.reason.startswith(("paused at rung", "takes over"))}),
                 exploits=sum(isinstance(e, TrialDecision) and e.action == "exploit" for e in events))


def halving(events: list, best: str, rungs: list[int], factor: int) -> tuple[str, list[str]]:
    """What successive halving with every rung full (promoting ASHA's end state, order aside) keeps of an
    unpruned sweep: (the trial it trains to the end and ranks best, one line per rung saying where `best`, the
    grid's best trial, stood)."""
    at = {(e.pipeline, e.epoch + 1): e.metrics["val_loss"] for e in events if isinstance(e, ValResult) and not e.error}
    trials = sorted({name for name, _ in at})
    kept, said = trials, []
    for rung in rungs:
        ranked = sorted(kept, key=lambda n: at[(n, rung)])
        said.append(f"{ranked.index(best) + 1} of {len(ranked)} at epoch {rung}" if best in ranked else
                    f"cut before epoch {rung}")
        kept = ranked[:max(1, len(ranked) // factor)]
    return min(kept, key=lambda n: min(v for (name, _), v in at.items() if name == n)), said


def line(label: str, sweep: Sweep) -> str:
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return (f"{label:17s} {sweep.wall:6.1f}s, best {sweep.best} val_loss {sweep.value:.4g}; {sweep.epochs} "
            f"epochs trained, {sweep.pruned} trials pruned" + (f", {sweep.exploits} exploits" if sweep.exploits else "")
            + "\n"
            f"{'':19s} first step {sweep.first:.1f}s after the start; each trial's start-up mean "
            f"{mean(sweep.startup):.2f}s max {max(sweep.startup, default=0):.2f}s; a freed slot idle mean "
            f"{mean(sweep.idle):.3f}s max {max(sweep.idle, default=0):.3f}s")


def main() -> None:
    global LRS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, choices=(8, 16), default=8, help="8: 4 lrs x 2 batch sizes; 16: 8 x 2")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=16)
    ap.add_argument("--samples", type=int, default=PARAMS["samples"], help="regression samples per trial")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every sweep, turning which goes first")
    ap.add_argument("--grace", type=int, default=1, help="ASHA's grace_period (its first rung), in epochs")
    ap.add_argument("--pbt", action="store_true", help="also population-based training on the same grid")
    ap.add_argument("--interval", type=int, default=2, help="PBT's perturbation_interval, in epochs")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray Tune even where it is installed")
    ap.add_argument("--quick", action="store_true", help="every sweep once at the least size (CI: it still runs)")
    args = ap.parse_args()
    if args.quick:
        args.pbt, args.interval, args.epochs, args.samples, args.rounds = True, 1, 2, 256, 1
    if args.pbt:
        MODES["pbt"] = "PBT:"
        PBT["perturbation_interval"] = args.interval
    # A ledger of its own: on a shared machine another run's pipelines book the same CPU slots, and a sweep
    # that waits behind them measures their length, not its scheduling.
    os.environ.setdefault("TORCHHERD_LEDGER", tempfile.mkdtemp(prefix="sweep-asha-ledger-"))
    PARAMS["samples"] = args.samples
    LRS = LRS_16 if args.trials == 16 else LRS[:2] if args.quick else LRS
    trials = len(LRS) * len(BATCHES)
    print(f"{trials} trials (lr x batch_size) of {args.epochs} epochs of {args.samples} samples on {args.slots} "
          f"CPU slots; ASHA grace_period {args.grace}, reduction_factor 2; load {os.getloadavg()[0]:.2f}")
    totals = {how: 0.0 for how in MODES}
    found = {how: 0 for how in MODES if how in ("stop", "promote")}  # rounds that ended with the grid's best trial
    for r in range(args.rounds):
        k = r % len(MODES)
        order = list(MODES)[k:] + list(MODES)[:k]  # each sweep goes first in turn: load falls on all
        with tempfile.TemporaryDirectory() as tmp:
            results = {how: asyncio.run(torchherd_sweep(Path(tmp) / how, how, args.slots, args.epochs, args.grace))
                       for how in order}
        print(f"round {r + 1} (load {os.getloadavg()[0]:.2f}):")
        full, last = results["none"], results
        for how, label in MODES.items():
            totals[how] += results[how].wall
            print("  " + line(label, results[how]))
        for how in found:
            same = results[how].best == full.best
            found[how] += same
            which = "the grid's best trial" if same else "NOT the grid's best trial"
            print(f"  {MODES[how][:-1]} / no pruning: {results[how].wall / full.wall:.2f}x the time, {which}")
        if "pbt" in results:  # its trials change values: judged by the best metric, not by the trial's name
            pbt = results["pbt"]
            print(f"  PBT / no pruning: {pbt.wall / full.wall:.2f}x the time, best val_loss {pbt.value:.4g} against "
                  f"the grid's {full.value:.4g} ({'better' if pbt.value < full.value else 'NOT better'}), "
                  f"{pbt.epochs} epochs against {full.epochs}")
    for how in found:
        print(f"{MODES[how][:-1]} / no pruning over {args.rounds} round(s): {totals[how] / totals['none']:.2f}x "
              f"the time, the grid's best trial in {found[how]} of {args.rounds} (goal <= 0.5x, every round)")
    if args.no_ray or importlib.util.find_spec("ray") is None:
        print("Ray Tune: skipped (not installed, or --no-ray)")
        return
    from ray_sweeps import RaySweep, ray_sweep

    ran: dict[str, RaySweep] = {}  # Ray Tune's sweep by scheduler, run once
    # Ray's ASHA (AsyncHyperBandScheduler) stops trials: torchherd's stop mode is its like; promote (the
    # default) is shown against it too
    for how, ours in (("asha", "stop"), ("asha", "promote"), ("pbt", "pbt")):
        if ours not in MODES:
            continue
        if how not in ran:
            try:
                ran[how] = ray_sweep(how, LRS, BATCHES, PARAMS, args.slots, args.epochs, args.grace, args.interval)
            except ImportError as exc:  # ray without its tune extra
                print(f"Ray Tune: skipped ({exc})")
                return
            theirs = ran[how]
            print(f"Ray Tune {how.upper():5s} {theirs.wall:6.1f}s, best {theirs.best} val_loss {theirs.value:.4g}; "
                  f"{theirs.epochs} epochs trained (load {os.getloadavg()[0]:.2f})")
        theirs, mine = ran[how], last[ours]
        print(f"torchherd {MODES[ours][:-1]} (mean of rounds) / Ray Tune {how.upper()}: "
              f"{totals[ours] / args.rounds / theirs.wall:.2f}x the time; best val_loss {mine.value:.4g} against "
              f"{theirs.value:.4g}; epochs {mine.epochs} against {theirs.epochs} (goal <= 1.0x, as good)")


if __name__ == "__main__":
    main()
