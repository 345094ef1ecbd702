"""What the machine-wide ledger costs: several runs started together on two CPU slots against one run of the
same pipelines, and against today's oversubscription (each run on a ledger of its own, as before the ledger).

Prints, for 4 runs x 2 pipelines on 2 CPU slots: total wall time of the 4 runs through one ledger / one run
of the 8 pipelines (goal <= 1.05: queueing costs nothing), samples/s per training process of each / one run
(goal >= 0.95; oversubscription shown beside it), the most workers alive at once, and the admission latency
from a slot freeing in one run to the next worker of another run starting (median, goal <= 0.5 s).
Run: python benchmarks/shared_box.py [--rounds N] [--samples N] [--quick]   (--quick: the least size, the workers
of this process's runs forked from one warm process: CI, figures meaningless)
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
import os
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, PipelineFinished, WorkerStarted  # noqa: E402
from torchherd.engine.protocol.states import WorkerState  # noqa: E402
from torchherd.engine.rundir.directory import read_events  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

SLOTS = 2
RUNNING = WorkerState.RUNNING


def config(tmp: Path, name: str, pipelines: list[str], samples: int):
    data = {"name": name, "runs_dir": str(tmp / "runs"),
            "defaults": {"task": "regression", "max_epochs": 2, "batch_size": 64,
                         "params": {"samples": samples, "features": 32, "hidden": 128}},
            "pipelines": [{"name": p} for p in pipelines],
            "devices": {"placement": "cpu", "cpu_slots": SLOTS}, "validation": {"mode": "off"},
            "telemetry": {"enabled": False}, "tensorboard": False}
    return parse_config(data, str(tmp / f"{name}.toml"), tmp)


async def run_all(tmp: Path, runs: list[list[str]], shared: bool, samples: int) -> tuple[float, list, int]:
    """Start every run at once; wall seconds until all finished, every event, and the most workers alive.
    `shared`: one ledger for all; else a ledger each, as every run believed the machine was its own before."""
    sups = []
    for i, pipelines in enumerate(runs):
        folder = tmp / ("ledger" if shared else f"ledger-{i}")
        os.environ["TORCHHERD_LEDGER"] = str(folder)  # read when the supervisor makes its ledger
        sups.append(Supervisor(config(tmp, f"r{i}-{time.time_ns()}", pipelines, samples),
                               inventory=Inventory(cpu_count=SLOTS)))
    start, cpu = time.perf_counter(), cpu_seconds()
    for s in sups:
        await s.start()
    most = 0

    async def watch() -> None:
        nonlocal most
        while not all(s.finished for s in sups):
            most = max(most, sum(1 for s in sups for v in s.views() if v.pid is not None and v.state == RUNNING))
            await asyncio.sleep(0.02)
    await asyncio.gather(*(s.wait() for s in sups), watch())
    wall = time.perf_counter() - start
    for s in sups:
        await s.shutdown()
    used = [after - before for after, before in zip(cpu_seconds(), cpu)]
    return wall, [(i, e) for i, s in enumerate(sups) for e in read_events(s.run_dir)], most, used


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of this process (every supervisor here) and of its reaped children (workers, starters)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def per_process_rate(events: list) -> float:
    """Mean samples/s of a training process over its epochs."""
    rates = [e.samples_per_s for _, e in events if isinstance(e, EpochEnd) and e.samples_per_s]
    return statistics.mean(rates) if rates else float("nan")


def admission(events: list) -> list[float]:
    """Seconds from a pipeline finishing in one run to the next worker of another run starting."""
    finished = sorted((e.time, i) for i, e in events if isinstance(e, PipelineFinished))
    out = []
    for i, e in events:
        if not isinstance(e, WorkerStarted):
            continue
        before = [(t, j) for t, j in finished if t <= e.time]
        if before and before[-1][1] != i:
            out.append(e.time - before[-1][0])
    return out


async def after_sigkill(tmp: Path, samples: int) -> float:
    """Seconds from SIGKILL of a run's supervisor (a detached service holding both slots) to the first worker
    of a run that waited for them."""
    import signal
    import subprocess

    holder = tmp / "holder.toml"
    holder.write_text('name = "holder"\n[defaults]\ntask = "regression"\nmax_epochs = 100000\n'
                      '[[pipelines]]\nname = "h1"\n[[pipelines]]\nname = "h2"\n[devices]\nplacement = "cpu"\n'
                      f'cpu_slots = {SLOTS}\n[validation]\nmode = "off"\n[telemetry]\nenabled = false\n')
    out = subprocess.run([sys.executable, "-m", "torchherd", "run", str(holder), "--detach", "--runs-dir",
                          str(tmp / "held")], capture_output=True, text=True, check=True)
    run_dir = Path(next(ln for ln in out.stdout.splitlines() if "run directory:" in ln).split(":", 1)[1].strip())
    pid = int((run_dir / "supervisor.pid").read_text().split()[0])
    waiter = Supervisor(config(tmp, f"waiter-{time.time_ns()}", ["w"], samples), inventory=Inventory(cpu_count=SLOTS))
    stream = waiter.subscribe()
    await waiter.start()
    # it waits, and its warm starter has imported torch (as after any wait of more than a few seconds)
    while not waiter._scheduler.waits or waiter._backend.hold_launches(1, 0):
        await asyncio.sleep(0.05)
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    async for event in stream:
        if isinstance(event, WorkerStarted):
            break
    latency = event.time - killed
    await waiter.shutdown(graceful=False)
    return latency


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--only", choices=["runs", "kill"], default=None)
    parser.add_argument("--quick", action="store_true", help="the least size (CI: it still runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.samples = 1, 256
    from _quick import warm

    with warm(args.quick):
        measure(args)


def measure(args: argparse.Namespace) -> None:
    if args.only != "runs":
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as d:
                os.environ["TORCHHERD_LEDGER"] = str(Path(d) / "ledger")
                print(f"round {r + 1}: SIGKILL of a run holding both slots -> a waiting run's worker started "
                      f"{asyncio.run(after_sigkill(Path(d), args.samples)):.3f} s later (goal <= 1 s + its start-up)")
        if args.only == "kill":
            return
    four = [[f"r{i}a", f"r{i}b"] for i in range(4)]
    one = [[p for run in four for p in run]]
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            base_wall, base_events, base_most, base_cpu = asyncio.run(run_all(tmp, one, True, args.samples))
            wall, events, most, cpu = asyncio.run(run_all(tmp, four, True, args.samples))
            over_wall, over_events, over_most, _ = asyncio.run(run_all(tmp, four, False, args.samples))
        base_rate = per_process_rate(base_events)
        lat = admission(events)
        print(f"round {r + 1}: one run of 8 on {SLOTS} slots {base_wall:.1f} s (most alive {base_most})")
        print(f"  CPU seconds, supervisors / their processes: one run {base_cpu[0]:.1f} / {base_cpu[1]:.1f}, "
              f"4 runs {cpu[0]:.1f} / {cpu[1]:.1f}")
        print(f"  4 runs x 2, one ledger:    wall {wall / base_wall:.3f}x one run (goal <= 1.05), "
              f"samples/s per process {per_process_rate(events) / base_rate:.3f}x (goal >= 0.95), most alive {most}")
        print(f"  4 runs x 2, no ledger:     wall {over_wall / base_wall:.3f}x one run, "
              f"samples/s per process {per_process_rate(over_events) / base_rate:.3f}x, most alive {over_most}")
        if lat:
            print(f"  admission across runs: median {statistics.median(lat):.3f} s, max {max(lat):.3f} s "
                  f"over {len(lat)} starts (goal: median <= 0.5 s)")


if __name__ == "__main__":
    main()
