"""What telemetry costs: one sampling pass (ms) and the sampler's CPU at 1 Hz with 8 real workers.

Spawns 8 busy-ish Python workers, each with one busy-ish child (a DataLoader
worker's stand-in), samples them with the real NVML and psutil, and prints
figures measured in this run. Usage: python benchmarks/telemetry_cost.py [--seconds 20]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from torchherd.engine.telemetry.host import ppid_map  # noqa: E402
from torchherd.engine.telemetry.sampler import TelemetrySampler  # noqa: E402

# ~1 ms of work every ~50 ms: about 2% of a core each, so 16 of them leave the machine usable
BUSY = ("import time\nwhile True:\n    t = time.perf_counter()\n"
        "    while time.perf_counter() - t < 0.001: pass\n    time.sleep(0.05)\n")
WORKER = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {BUSY!r}])\n" + BUSY


def spawn(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", WORKER], start_new_session=True) for _ in range(n)]


def reap(procs: list[subprocess.Popen]) -> int:
    """Kill every worker's process group; return how many of their processes are still alive."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
    deadline = time.monotonic() + 10
    groups = {p.pid for p in procs}
    while True:
        alive = 0
        for proc in psutil.process_iter(["status"]):
            try:
                alive += os.getpgid(proc.pid) in groups and proc.info["status"] != psutil.STATUS_ZOMBIE
            except (ProcessLookupError, psutil.Error):
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def pass_costs(sampler: TelemetrySampler, passes: int) -> tuple[float, float]:
    """Median wall ms (sample_ms) and median CPU ms of back-to-back passes."""
    wall, cpu = [], []
    for _ in range(passes):
        c = time.thread_time()
        wall.append(sampler.sample_once().sample_ms)
        cpu.append((time.thread_time() - c) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def tree_walk_costs(pids: list[int], rounds: int) -> tuple[float, float]:
    """ms per pass to find every worker's descendants: one /proc scan vs children() per worker."""
    procs = [psutil.Process(pid) for pid in pids]
    t = time.perf_counter()
    for _ in range(rounds):
        ppid_map()
    once = (time.perf_counter() - t) / rounds * 1000
    t = time.perf_counter()
    for _ in range(rounds):
        for proc in procs:
            proc.children(recursive=True)
    each = (time.perf_counter() - t) / rounds * 1000
    return once, each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to run the sampler at 1 Hz")
    parser.add_argument("--passes", type=int, default=100, help="back-to-back passes timed for the per-pass cost")
    args = parser.parse_args()

    procs = spawn(args.workers)
    try:
        pids = {f"w{i}": p.pid for i, p in enumerate(procs)}
        probe = TelemetrySampler(pids=lambda: pids, tree_every=0)
        deadline = time.monotonic() + 30
        while sum(p.children for p in probe.sample_once().processes) < args.workers:
            if time.monotonic() > deadline:
                sys.exit("workers' children did not start within 30 s")
            time.sleep(0.1)
        snap = probe.sample_once()
        print(f"host: {psutil.cpu_count()} cores, {len(psutil.pids())} processes; "
              f"{args.workers} workers + {sum(p.children for p in snap.processes)} children; "
              f"GPUs: {len(snap.gpus)}" + (f" ({snap.gpu_note})" if snap.gpu_note else ""))

        wall_scan, cpu_scan = pass_costs(probe, args.passes)  # tree_every=0: a /proc scan every pass
        probe.stop()
        cached = TelemetrySampler(pids=lambda: pids)  # the default: a scan every 5 s
        cached.sample_once()
        wall_cached, cpu_cached = pass_costs(cached, args.passes)
        cached.stop()
        print(f"one pass, with a /proc scan:   {wall_scan:6.2f} ms wall, {cpu_scan:6.2f} ms CPU (median of {args.passes})")
        print(f"one pass, tree from cache:     {wall_cached:6.2f} ms wall, {cpu_cached:6.2f} ms CPU")
        once, each = tree_walk_costs(list(pids.values()), rounds=20)
        print(f"finding descendants: one /proc scan {once:.2f} ms vs children(recursive=True) per worker "
              f"{each:.2f} ms ({each / once:.1f}x)")

        got, first = [], []

        def on_snapshot(snap):
            if not got:  # after the first pass: NVML opened (or found missing), caches warm
                first.append((time.process_time(), time.monotonic()))
            got.append(snap)

        sampler = TelemetrySampler(interval=1.0, pids=lambda: pids, on_snapshot=on_snapshot)
        cpu0, wall0 = time.process_time(), time.monotonic()
        sampler.start()
        time.sleep(args.seconds)  # the main thread idles; the process's CPU is the sampler's
        sampler.stop()
        cpu1, wall1 = time.process_time(), time.monotonic()
        cpu, wall = cpu1 - cpu0, wall1 - wall0
        share = cpu / wall * 100
        steady = (cpu1 - first[0][0]) / (wall1 - first[0][1]) * 100
        print(f"sampler at 1 Hz for {wall:.1f} s: {len(got)} snapshots, {cpu * 1000:.1f} ms CPU = "
              f"{share:.3f}% of one core (goal < 1%: {'met' if share < 1 else 'NOT met'}; "
              f"{share / 1.0 * 100:.0f}% of the budget); after the first pass {steady:.3f}%")
        print(f"pass cost in those snapshots: median {statistics.median(s.sample_ms for s in got):.2f} ms wall")
    finally:
        left = reap(procs)
        print(f"processes left alive: {left}")


if __name__ == "__main__":
    main()
