"""Steps an unchanged, flag-resuming training script loses per SIGKILL: with `resume_args` and without.

Two pipelines run the same GPT-style script side by side (tests/tasks/scripts/gpt_like.py: it writes
ckpt.pt into --out_dir every --eval_interval iterations and resumes only when told
--init_from=resume). "resume_args" passes --out_dir={checkpoint_dir} and resume_args; "no_flag" is how a
script ran before them: the same command line on every restart. K times, at a random moment once both
train, both scripts are SIGKILLed; torchherd restarts them. Steps lost per kill = the last step reported
before the kill minus the step the restarted script starts from. Prints the median and worst for each
and the ratio of the medians (no_flag / resume_args). Run: python benchmarks/script_resume.py [--kills 10]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.protocol.messages import StepMetrics, WorkerStarted  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "tasks" / "scripts" / "gpt_like.py"
INTERVAL = 20  # the script's checkpoint interval, in iterations
NAMES = ("resume_args", "no_flag")


def config(tmp: Path, kills: int):
    common = {"script": str(SCRIPT), "metrics": r"iter (?P<step>\d+): loss (?P<loss>\S+)",
              "args": ["--out_dir={checkpoint_dir}", "--max_iters=1000000", f"--eval_interval={INTERVAL}",
                       "--delay=0.02"]}
    return parse_config({
        "name": "script-resume", "runs_dir": str(tmp / "runs"), "validation": {"mode": "off"},
        "telemetry": {"enabled": False}, "devices": {"placement": "cpu", "cpu_slots": 2},
        "restart": {"max_restarts": kills + 2, "min_uptime": 0.0, "backoff": 0.1},
        "pipelines": [{"name": "resume_args", **common, "resume_args": ["--init_from=resume"]},
                      {"name": "no_flag", **common}]}, str(tmp / "bench.toml"), tmp)


async def measure(kills: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    lost: dict[str, list[int]] = {n: [] for n in NAMES}
    with tempfile.TemporaryDirectory(prefix="torchherd-bench-") as tmp:
        sup = Supervisor(config(Path(tmp), kills), inventory=Inventory(cpu_count=2, note="benchmark"))
        stream = sup.subscribe()
        await sup.start()
        last: dict[str, int] = {}
        first_after: dict[str, int] = {}
        workers: dict[str, int] = {}
        restarted: set[str] = set(NAMES)  # whose next step is the first of a fresh attempt
        killed: set[str] = set()  # killed, and not started again yet
        killed_at: dict[str, int] = {}  # the last step each reported before the latest kill

        async def until(predicate, timeout: float = 180.0) -> None:
            async def scan():
                async for e in stream:
                    if isinstance(e, WorkerStarted):
                        workers[e.pipeline] = e.pid
                        if e.pipeline in killed:  # steps from here on are the restarted script's
                            killed.discard(e.pipeline)
                            restarted.add(e.pipeline)
                    if isinstance(e, StepMetrics):
                        if e.pipeline in restarted:
                            restarted.discard(e.pipeline)
                            first_after[e.pipeline] = e.step
                        last[e.pipeline] = e.step
                    if predicate():
                        return
            await asyncio.wait_for(scan(), timeout)
        try:
            for k in range(kills + 1):
                await until(lambda: not restarted and not killed)  # each has trained since it (re)started
                if k:  # where each came back after the last kill
                    for n in NAMES:
                        lost[n].append(killed_at[n] - (first_after[n] - 1))
                if k == kills:
                    break
                target = {n: last[n] + rng.randint(INTERVAL + 5, 3 * INTERVAL) for n in NAMES}
                await until(lambda: all(last[n] >= target[n] for n in NAMES))
                killed_at.update(last)
                for n in NAMES:
                    for proc in psutil.Process(workers[n]).children():
                        if SCRIPT.name in " ".join(proc.cmdline()):
                            proc.kill()
                killed.update(NAMES)
        finally:
            await sup.shutdown(graceful=False)
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    lost = asyncio.run(measure(args.kills, args.seed))
    for name in NAMES:
        print(f"{name:12s} steps lost per kill: median {statistics.median(lost[name]):g}, "
              f"worst {max(lost[name])} (checkpoint interval {INTERVAL}; {len(lost[name])} kills)")
    ratio = statistics.median(lost["no_flag"]) / max(statistics.median(lost["resume_args"]), 1)
    print(f"no_flag / resume_args (median steps lost): {ratio:.1f}x")


if __name__ == "__main__":
    main()
