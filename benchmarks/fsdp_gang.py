"""Sharded gang overhead: samples/s of a torchherd `fsdp` Task gang over the same FSDP2 loop under torchrun.

Each round trains benchmarks/_fsdp_workload.py's model (2 ranks, gloo, Adam, FSDP2 per layer) once
as a plain loop under `torchrun --standalone --nproc-per-node 2` and once as a torchherd Task gang with
`strategy = "fsdp"`, alternating which goes first; both count from their first batch (torchherd's
epochs' own durations), so start-up is left out. Prints each round, the medians with their spread,
and the ratio (goal: at least 0.95). Run: python benchmarks/fsdp_gang.py [--rounds 3] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--quick" in sys.argv[1:]:  # read by the workload at its import, here and in every rank (inherited)
    os.environ["TORCHHERD_BENCH_QUICK"] = "1"

from benchmarks import _fsdp_workload as workload  # noqa: E402
from benchmarks._gang_support import RANKS, torchrun_command  # noqa: E402
from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd  # noqa: E402
from torchherd.engine.rundir.directory import read_events  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

SPEED = re.compile(r"fsdp_loop: trained (\d+) samples in ([\d.]+)s")


def under_torchrun(tmp: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out = subprocess.run(torchrun_command() + ["--standalone", f"--nproc-per-node={RANKS}", workload.__file__],
                         capture_output=True, text=True, cwd=tmp, env=env, timeout=900)
    m = SPEED.search(out.stdout + out.stderr)
    if m is None:
        raise SystemExit("the plain loop did not report its speed:\n" + (out.stdout + out.stderr)[-2000:])
    return int(m.group(1)) / float(m.group(2))


async def under_torchherd(tmp: Path, n: int) -> float:
    data = {"runs_dir": str(tmp / "runs"), "name": f"fsdp{n}",
            "pipelines": [{"name": "f", "task": f"{workload.__file__}:build", "ranks": RANKS, "strategy": "fsdp",
                           "max_epochs": workload.EPOCHS, "batch_size": workload.BATCH, "log_every_n_steps": 10}],
            "devices": {"placement": "cpu", "cpu_slots": RANKS, "threads_per_worker": 1},
            "validation": {"mode": "off"}, "telemetry": {"enabled": False}}
    sup = Supervisor(parse_config(data, str(tmp / "fsdp.toml"), tmp),
                     inventory=Inventory(cpu_count=RANKS, note="benchmark"))
    await sup.start()
    statuses = await sup.wait()
    await sup.shutdown()
    if statuses != {"f": "completed"}:
        raise SystemExit(f"torchherd's gang did not complete: {statuses}")
    ends = [e for e in read_events(sup.run_dir) if isinstance(e, EpochEnd)]
    return sum(e.samples_per_s * e.duration for e in ends) / sum(e.duration for e in ends)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round at the least size (CI: it still runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    herd: list[float] = []
    plain: list[float] = []
    with tempfile.TemporaryDirectory(prefix="torchherd-fsdp-bench-") as tmp:
        # A ledger of its own: torchrun asks none, so neither waits behind other runs on a shared box
        os.environ["TORCHHERD_LEDGER"] = str(Path(tmp) / "ledger")
        for i in range(args.rounds):
            ways = [lambda: plain.append(under_torchrun(Path(tmp))),
                    lambda: herd.append(asyncio.run(under_torchherd(Path(tmp), i)))]
            for way in (ways if i % 2 == 0 else ways[::-1]):
                way()
            print(f"round {i + 1}: torchrun {plain[-1]:,.0f} samples/s, torchherd {herd[-1]:,.0f} samples/s",
                  flush=True)
    for name, xs in (("torchrun", plain), ("torchherd", herd)):
        print(f"{name}: median {statistics.median(xs):,.0f} samples/s (spread {min(xs):,.0f}-{max(xs):,.0f})")
    print(f"samples/s torchherd fsdp gang / plain FSDP2 under torchrun: "
          f"{statistics.median(herd) / statistics.median(plain):.3f} (goal >= 0.95)")


if __name__ == "__main__":
    main()
