"""A Lightning 2-rank DDP gang under torchherd against plain Lightning DDP, timed in one script.

One workload (benchmarks/_lightning_workload.py), one thread a rank, four ways:
plain `Trainer(devices=2, strategy="ddp", accelerator="cpu").fit` train-only and with
its own sequential validation (benchmarks/_lightning_ddp_plain.py; Lightning starts its
second rank itself), and torchherd's 2-rank Lightning gang with validation off and with
background validation. Each is timed from the start of training to the end of its last
epoch on rank 0's clock (Lightning's `on_train_start` / torchherd's TrainingStarted, the
last epoch end), so start-up is left out of every one. The four run in turn, ROUNDS
times; the best of each is compared.

Prints: torchherd gang samples/s over plain DDP samples/s (goal >= 0.97), and training
time with background validation over train-only for the gang (goal <= 1.05), beside
plain Lightning's sequential validation over its train-only.
Run: python benchmarks/lightning_gang.py [--quick]   (EPOCHS, ROUNDS, HIDDEN to change the size; --quick: one
round of one epoch at the least size, torchherd's ranks forked from one warm process: CI, figures meaningless)
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, TrainingStarted  # noqa: E402
from torchherd.engine.rundir.directory import read_events  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

HERE = Path(__file__).resolve().parent
QUICK = "--quick" in sys.argv[1:]
EPOCHS = int(os.environ.get("EPOCHS", "1" if QUICK else "6"))
ROUNDS = int(os.environ.get("ROUNDS", "1" if QUICK else "3"))
HIDDEN = int(os.environ.get("HIDDEN", "32" if QUICK else "512"))
SAMPLES = 4096  # LitOverlap's training samples an epoch (both ranks together)


def plain(validate: bool, root: Path) -> float:
    """Training seconds of plain Lightning DDP (a fresh process, as people run it).

    Plain Lightning's ranks have died by SIGABRT on a loaded 2-core machine (once in CI, not reproduced): its
    stderr is kept, a time rank 0 wrote before such a death at teardown stands, and a run that died before it
    is run once more, saying why, before the benchmark gives up with the tail of what it printed.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_", "WORLD_", "MASTER_"))}
    for attempt in (1, 2):
        where = root / f"try-{attempt}"
        where.mkdir(parents=True)
        out, err = where / "plain.json", where / "stderr.txt"
        with err.open("wb") as stderr:
            proc = subprocess.run([sys.executable, str(HERE / "_lightning_ddp_plain.py"), str(out), str(EPOCHS),
                                   str(HIDDEN), str(int(validate))], cwd=where, env=env,
                                  stdout=subprocess.DEVNULL, stderr=stderr, timeout=1800)
        if out.exists():
            if proc.returncode:
                print(f"plain Lightning DDP exited {proc.returncode} after writing its time; the time stands")
            return json.loads(out.read_text())["seconds"]
        tail = err.read_text(errors="replace")[-3000:]
        print(f"plain Lightning DDP (try {attempt}) exited {proc.returncode} before its time; it printed:\n{tail}",
              flush=True)
    raise RuntimeError("plain Lightning DDP failed twice; see what it printed above")


async def herd(mode: str, root: Path) -> float:
    """Training seconds of torchherd's 2-rank Lightning gang with validation `mode` ("off" or "background")."""
    data = {"runs_dir": str(root), "defaults": {
                "task": f"lightning:{HERE / '_lightning_workload.py'}:LitOverlap", "max_epochs": EPOCHS,
                "log_every_n_steps": 50, "checkpoint_every_n_epochs": EPOCHS, "params": {"hidden": HIDDEN}},
            "pipelines": [{"name": "p", "ranks": 2}],
            "devices": {"placement": "cpu", "cpu_slots": 2, "threads_per_worker": 1},
            "validation": {"mode": mode, "device": "cpu", "threads": 1} if mode == "background" else {"mode": mode},
            "telemetry": {"enabled": False}}
    sup = Supervisor(parse_config(data, str(root / "bench.toml"), root))
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 1800)
    finally:
        await sup.shutdown(graceful=True)
    assert statuses == {"p": "completed"}, statuses
    events = read_events(sup.run_dir)
    start = [e.time for e in events if isinstance(e, TrainingStarted)][0]  # rank 0's clock, both
    return [e.time for e in events if isinstance(e, EpochEnd)][-1] - start


def main() -> None:
    from _quick import warm

    with warm(QUICK):
        measure()


def measure() -> None:
    load = os.getloadavg()[0]
    runs: dict[str, list[float]] = {"plain": [], "plain-seq": [], "herd": [], "herd-bg": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(ROUNDS):
            runs["plain"].append(plain(False, root / f"plain-{i}"))
            runs["herd"].append(asyncio.run(herd("off", root / f"herd-{i}")))
            runs["plain-seq"].append(plain(True, root / f"plain-seq-{i}"))
            runs["herd-bg"].append(asyncio.run(herd("background", root / f"herd-bg-{i}")))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items()), flush=True)
    best = {k: min(v) for k, v in runs.items()}
    rate = {k: SAMPLES * EPOCHS / v for k, v in best.items()}
    print(f"workload: {EPOCHS} epochs of {SAMPLES} samples, hidden {HIDDEN}, 2 ranks of one thread; best of "
          f"{ROUNDS} alternating rounds; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"{os.cpu_count()} cores")
    print(f"plain Lightning DDP train-only        {best['plain']:7.2f} s  {rate['plain']:8.0f} samples/s")
    print(f"torchherd Lightning gang, val off     {best['herd']:7.2f} s  {rate['herd']:8.0f} samples/s  "
          f"ratio {rate['herd'] / rate['plain']:.3f} (goal >= 0.97)")
    print(f"torchherd gang, background validation {best['herd-bg']:7.2f} s  "
          f"background/train-only {best['herd-bg'] / best['herd']:.3f} (goal <= 1.05)")
    print(f"plain Lightning DDP sequential val    {best['plain-seq']:7.2f} s  "
          f"sequential/train-only {best['plain-seq'] / best['plain']:.3f}")


if __name__ == "__main__":
    main()
