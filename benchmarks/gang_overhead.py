"""Gang overhead: samples/s of the same DDP script under torchherd over samples/s under torchrun.

Each round runs the script once under `torchrun --standalone --nproc-per-node 2` and
once as a torchherd script gang, alternating which goes first; the script itself
reports its training speed (samples over the seconds from its first batch), so
start-up is left out of both. Prints the best of the rounds for each and the ratio
(goal: at least 0.97). Run: python benchmarks/gang_overhead.py [--rounds 3] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._gang_support import RANKS, Torchrun, herd_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

ARGS = ["--epochs", "6", "--samples", "8192", "--width", "256"]
SPEED = re.compile(r"ddp_loop: trained (\d+) samples in ([\d.]+)s")


def speed(text: str) -> float:
    m = SPEED.search(text)
    if m is None:
        raise SystemExit("the script did not report its speed:\n" + text[-2000:])
    return int(m.group(1)) / float(m.group(2))


def under_torchrun(tmp: Path) -> float:
    run = Torchrun(ARGS, max_restarts=0, cwd=tmp)
    run.proc.wait()
    run._reader.join()
    return speed("\n".join(line for _, line in run.lines))


async def under_torchherd(tmp: Path, n: int) -> float:
    sup = Supervisor(herd_config(tmp, ARGS, max_restarts=0, name=f"gang{n}"),
                     inventory=Inventory(cpu_count=RANKS, note="benchmark"))
    await sup.start()
    statuses = await sup.wait()
    await sup.shutdown()
    if statuses != {f"gang{n}": "completed"}:
        logs = sorted((sup.run_dir / f"gang{n}").glob("log*.txt"))
        raise SystemExit(f"torchherd's gang did not complete: {statuses}\n"
                         + "\n".join(f"{log.name}: ...{log.read_text()[-1500:]}" for log in logs))
    return speed((sup.run_dir / f"gang{n}" / "log.txt").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round at the least size (CI: it still runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
        ARGS[:] = ["--epochs", "1", "--samples", "256", "--width", "16"]
    herd, torchrun = [], []
    with tempfile.TemporaryDirectory(prefix="torchherd-gang-bench-") as tmp:
        for i in range(args.rounds):
            order = [("torchrun", lambda: torchrun.append(under_torchrun(Path(tmp)))),
                     ("torchherd", lambda: herd.append(asyncio.run(under_torchherd(Path(tmp), i))))]
            for _, run in (order if i % 2 == 0 else order[::-1]):
                run()
            print(f"round {i + 1}: torchrun {torchrun[-1]:,.0f} samples/s, torchherd {herd[-1]:,.0f} samples/s",
                  flush=True)
    print(f"best: torchrun {max(torchrun):,.0f} samples/s, torchherd {max(herd):,.0f} samples/s")
    print(f"samples/s torchherd / torchrun: {max(herd) / max(torchrun):.3f} (goal >= 0.97)")


if __name__ == "__main__":
    main()
