"""Soak the machine-wide ledger: runs of mixed GPU requests started at random on the fake NVIDIA driver; the ledger
must never grant more than a device holds.

Six runs (whole GPUs, two GPUs a rank, gangs, memory shares) start at random moments over the soak, each as
`torchherd run CONFIG --headless` of its own, all on one ledger and one fake 4-GPU driver (tests/nvml_fake)
whose gpu3 another user's process holds half of the time. Their workers are scripts that touch no GPU: they
sleep a few seconds and exit. Afterwards every worker's [start, exit] from the runs' events.jsonl is checked:
a GPU never had a whole-GPU holder beside anyone else, nor shares above its memory.
Run: python scripts/soak_ledger.py [--minutes 10] [--runs 6] [--seed 0] [--separate]   (needs cc for the fake driver)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.nvml_fake import FakeDriver, FakeGpu, GiB, build  # noqa: E402

SLEEPER = """import os, random, time
time.sleep(random.uniform(1, 6))
print("slept on", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""
# (name, pipeline keys, GiB of one GPU each rank reserves or None for whole GPUs, GPUs a rank)
KINDS = [("whole", {}, None, 1), ("pair", {"gpus_per_rank": 2}, None, 2), ("gang", {"ranks": 2}, None, 1),
         ("share20", {"gpu_memory": "20GiB"}, 20, 1), ("quarter", {"gpu_memory": 0.25}, 20, 1),
         ("share30", {"gpu_memory": "30GiB"}, 30, 1)]


def write_config(folder: Path, index: int, rng: random.Random, sleeper: Path) -> tuple[Path, dict]:
    """A run of 3-6 pipelines of random kinds; returns its path and {pipeline: (GiB share or None, GPUs a rank)}."""
    lines = [f'name = "soak{index}"', "[defaults]", f'script = "{sleeper}"', "max_epochs = 1"]
    requests = {}
    for n in range(rng.randint(3, 6)):
        kind, keys, share, per_rank = rng.choice(KINDS)
        name = f"{kind}{n}"
        lines += ["[[pipelines]]", f'name = "{name}"'] + [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
        requests[name] = (share, per_rank)
    lines += ["[validation]", 'mode = "off"', "[telemetry]", "enabled = false", "[restart]", "max_restarts = 0"]
    path = folder / f"soak{index}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, requests


def intervals(run_dir: Path, requests: dict) -> list[tuple[float, float, list[str], float | None]]:
    """(start, end, GPUs, GiB share or None) of every worker of the run, from its events."""
    starts, out = {}, []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["type"] == "worker_started":
            starts[r["pipeline"]] = (r["time"], r["device"])
        elif r["type"] in ("worker_exited", "pipeline_finished") and r["pipeline"] in starts:
            begun, device = starts.pop(r["pipeline"])
            gpus = sorted({g for part in device.split(",") for g in part.split("+")})
            out.append((begun, r["time"], gpus, requests[r["pipeline"]][0]))
    return out


def violations(spans: list) -> list[str]:
    """Every moment a GPU held a whole-GPU worker beside another, or shares above its 80 GiB."""
    found = []
    for begun, _, gpus, _ in spans:
        for gpu in gpus:
            here = [s for s in spans if gpu in s[2] and s[0] <= begun < s[1]]
            whole = [s for s in here if s[3] is None]
            shares = sum(s[3] for s in here if s[3] is not None)
            if (whole and len(here) > 1) or shares > 80:
                found.append(f"{gpu} at {begun:.2f}: {len(whole)} whole, {shares} GiB of shares")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--separate", action="store_true",
                        help="a ledger for each run, as before the ledger: proves the check finds over-grants")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="torchherd-soak-"))
    driver = FakeDriver(folder / "nvml", build(folder / "lib"), [FakeGpu(memory_used=GiB) for _ in range(4)])
    sleeper = folder / "sleeper.py"
    sleeper.write_text(SLEEPER)
    env = driver.env(TORCHHERD_LEDGER=str(folder / "ledger"), PYTHONPATH=str(REPO))
    deadline = time.monotonic() + args.minutes * 60
    starts = sorted(rng.uniform(0, args.minutes * 60 * 0.8) for _ in range(args.runs))
    procs, requests = [], {}
    began = time.monotonic()
    while time.monotonic() < deadline and (starts or any(p.poll() is None for p, _ in procs)):
        if starts and time.monotonic() - began >= starts[0]:
            starts.pop(0)
            path, asked = write_config(folder, len(procs), rng, sleeper)
            runs = folder / f"runs{len(procs)}"
            requests[runs] = asked
            own = {"TORCHHERD_LEDGER": str(folder / f"ledger{len(procs)}")} if args.separate else {}
            procs.append((subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(path), "--headless",
                                            "--runs-dir", str(runs)], env={**env, **own}, cwd=REPO,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), runs))
            print(f"{time.monotonic() - began:6.1f}s started run {len(procs)} ({len(asked)} pipelines)", flush=True)
        foreign = int(time.monotonic() - began) // 30 % 2 == 1  # another user's job on gpu3, every other 30 s
        driver.gpus[3] = FakeGpu(memory_used=41 * GiB, processes=[(1, 40 * GiB)]) if foreign else FakeGpu(memory_used=GiB)
        driver.write()
        time.sleep(0.5)
    for p, _ in procs:
        if p.poll() is None:
            p.terminate()
        p.wait(60)
    spans = [s for runs, asked in requests.items() for d in runs.iterdir() if d.is_dir()
             for s in intervals(d, asked)]
    bad = violations(spans)
    print(f"{len(procs)} runs, {len(spans)} workers checked, exit codes {[p.returncode for p, _ in procs]}; "
          f"{len(bad)} over-grants")
    for line in bad[:20]:
        print("  " + line)
    return 1 if bad or not spans else 0


if __name__ == "__main__":
    sys.exit(main())
