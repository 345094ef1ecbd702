"""Gang restarts: the same DDP script under torchrun (--max-restarts) and under torchherd, K rank kills each.

For every kill (SIGKILL of a random rank, at a random moment once it trains) it
records whether the gang came back up (printed a step line within the timeout) and
the seconds from the kill to that first step. Prints restarts that came back, and
the median and worst time to resume, for each; then the ratio torchherd/torchrun
of the medians. Run: python benchmarks/gang_restart.py [--kills 20] [--timeout 60]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._gang_support import RANKS, Torchrun, herd_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.protocol.messages import StepMetrics, WorkerExited, WorkerStarted  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

# Long enough to outlast every kill; a checkpoint each epoch to come back to.
ARGS = ["--epochs", "10000", "--samples", "2048", "--delay", "0.01"]


def torchrun_kills(kills: int, timeout: float, rng: random.Random, tmp: Path) -> list[float | None]:
    """Seconds from each kill to the first step after it (None: the gang did not come back)."""
    args = ARGS + ["--checkpoint", str(tmp / "torchrun.pt")]
    out: list[float | None] = []
    run = Torchrun(args, max_restarts=kills, cwd=tmp)
    try:
        if run.first_line_after(0.0, "step ", 120) is None:
            raise SystemExit("torchrun never trained: " + "\n".join(line for _, line in run.lines[-20:]))
        while len(out) < kills:
            time.sleep(rng.uniform(0.2, 1.5))  # a random moment in training
            ranks = run.ranks()
            if len(ranks) < RANKS:
                time.sleep(0.2)
                continue
            os.kill(rng.choice(ranks), signal.SIGKILL)
            killed = time.monotonic()
            # A step line counts once new ranks exist: the old rank 0 may print one more as it goes.
            renewed = run.wait_for_new_ranks(set(ranks), timeout)
            back = run.first_line_after(renewed, "step ", timeout - (renewed - killed)) if renewed else None
            out.append(None if back is None else back - killed)
            print(f"  torchrun kill {len(out)}: " + ("did not come back" if back is None else f"{back - killed:.2f}s"),
                  flush=True)
            if back is None:  # a torchrun that hangs or gave up: start a fresh one for the next kill
                run.end()
                run = Torchrun(args, max_restarts=kills, cwd=tmp)
                run.first_line_after(0.0, "step ", 120)
    finally:
        run.end()
    return out


async def herd_kills(kills: int, timeout: float, rng: random.Random, tmp: Path) -> list[float | None]:
    config = herd_config(tmp, ARGS + ["--checkpoint", str(tmp / "herd.pt")], max_restarts=kills + 1)
    sup = Supervisor(config, inventory=Inventory(cpu_count=RANKS, note="benchmark"))
    stream = sup.subscribe(replay=False)
    out: list[float | None] = []
    down: list[float] = []  # seconds from each kill to the whole gang being reaped
    current: WorkerStarted | None = None
    killed = 0.0

    async def next_step() -> float | None:
        """When the next attempt (started after now) reports its first step."""
        nonlocal current
        deadline = time.monotonic() + timeout
        fresh = False  # a step the killed attempt sent before it died does not count
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                event = await asyncio.wait_for(stream.__anext__(), left)
            except asyncio.TimeoutError:
                return None
            if isinstance(event, WorkerExited):
                down.append(time.monotonic() - killed)
            elif isinstance(event, WorkerStarted):
                current, fresh = event, True
            elif isinstance(event, StepMetrics) and fresh:
                return time.monotonic()

    await sup.start()
    try:
        if await next_step() is None:
            raise SystemExit("torchherd's gang never trained")
        while len(out) < kills:
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            os.kill(rng.choice(current.pids), signal.SIGKILL)
            killed = time.monotonic()
            back = await next_step()
            out.append(None if back is None else back - killed)
            print(f"  torchherd kill {len(out)}: " + ("did not come back" if back is None else f"{back - killed:.2f}s"),
                  flush=True)
            if back is None:
                break
    finally:
        await sup.shutdown(graceful=False)
    if down:
        print(f"torchherd: kill to the whole gang down (every rank reaped): median {statistics.median(down):.2f}s, "
              f"worst {max(down):.2f}s (kill_grace {config.restart.kill_grace:g}s)")
    return out


def summary(name: str, times: list[float | None]) -> float | None:
    ok = [t for t in times if t is not None]
    line = f"{name:<10} {len(ok)}/{len(times)} restarts came back"
    if ok:
        line += f"; kill to first step: median {statistics.median(ok):.2f}s, worst {max(ok):.2f}s"
    print(line)
    return statistics.median(ok) if ok else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a restart may take to train again")
    parser.add_argument("--herd-only", action="store_true", help="skip torchrun (it can take a minute a kill)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchherd-gang-bench-") as tmp:
        print(f"{args.kills} kills of a random rank of a 2-rank gloo DDP script, each:", flush=True)
        herd = asyncio.run(herd_kills(args.kills, args.timeout, random.Random(1), Path(tmp)))
        torchrun = [] if args.herd_only else torchrun_kills(args.kills, args.timeout, random.Random(1), Path(tmp))
    h = summary("torchherd", herd)
    t = summary("torchrun", torchrun) if torchrun else None
    if h and t:
        print(f"time to resume, torchherd / torchrun (medians): {h / t:.2f}")


if __name__ == "__main__":
    main()
