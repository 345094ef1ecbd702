"""Time to recover: a rank of a 2-rank DDP gang SIGKILLed mid-epoch, under torchherd and under torchrun.

Each round trains benchmarks/_recovery_torchrun.py's model (gloo, CPU, Adam) as a plain DDP loop under
`torchrun --nproc-per-node=2 --max-restarts=1`, as a torchherd Task gang with one restart allowed (its restarted
ranks forked from the session's forking process, which has imported torch), and as the same gang with
`warm_start = false` (each restarted rank a fresh Python), in an order that alternates; all checkpoint every
epoch, and rank 1 is SIGKILLed once half an epoch past the first
checkpoint is reported. Figures: seconds from the kill to the gang's next step (step times as each records them:
events.jsonl, the plain loop's step lines), steps lost (the highest step reported before the kill minus the step
training resumed at) and when each phase between them ended; medians with their spread, and the ratios to
torchrun (goal <= 0.5). Run: python benchmarks/recovery.py [--rounds 3] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--quick" in sys.argv[1:]:  # read by the workload at its import, here and in every rank (inherited)
    os.environ["TORCHHERD_BENCH_QUICK"] = "1"

from benchmarks import _recovery_torchrun as workload
from benchmarks._gang_support import torchrun_command
from torchherd.engine.config.load import parse_config
from torchherd.engine.config.schema import RunConfig
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.launch.process import keep_warm, let_go
from torchherd.engine.protocol.messages import (
    Event,
    Resumed,
    StepMetrics,
    TrainingStarted,
    WorkerExited,
    WorkerRestarting,
    WorkerStarted,
)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor

EPOCHS = 3  # more than the kill needs: each way is ended at its first step after the restart
KILL_AT = workload.STEPS_PER_EPOCH * 3 // 2  # half an epoch past the first checkpoint
BACKOFF = 0.0  # torchherd's restart.backoff, seconds (default 1): torchrun restarts at once
TIMEOUT = 300.0  # seconds either way may take from its start to its first step after the restart


@dataclass
class Recovery:
    """One kill: seconds from it to the next step, steps lost, and when each phase between them ended."""

    seconds: float
    lost: int
    phases: dict[str, float] = field(default_factory=dict)  # what -> seconds after the kill


# ------------------------------------------------------------ torchherd


def herd_config(tmp: Path, n: int, warm: bool = True) -> RunConfig:
    data = {"cluster": {"warm_start": warm}, "runs_dir": str(tmp / "runs"), "name": f"recovery{n}",
            "pipelines": [{"name": "g", "task": f"{workload.__file__}:build", "ranks": workload.RANKS,
                           "max_epochs": EPOCHS, "batch_size": workload.BATCH, "log_every_n_steps": 1,
                           "checkpoint_every_n_epochs": 1}],
            "devices": {"placement": "cpu", "cpu_slots": workload.RANKS, "threads_per_worker": 1},
            "restart": {"max_restarts": 1, "backoff": BACKOFF},
            "validation": {"mode": "off"}, "telemetry": {"enabled": False}}
    return parse_config(data, str(tmp / "recovery.toml"), tmp)


async def under_torchherd(tmp: Path, n: int, warm: bool = True) -> Recovery:
    """torchherd as `torchherd run` runs it; `warm` false is `[cluster] warm_start = false`: each restarted rank
    a fresh Python that imports torch."""
    sup = Supervisor(herd_config(tmp, n, warm), inventory=Inventory(cpu_count=workload.RANKS, note="benchmark"))
    stream = sup.subscribe(replay=False)
    await sup.start()
    try:
        killed = await asyncio.wait_for(_kill_and_wait(stream), TIMEOUT)
    finally:
        await sup.shutdown(graceful=False)
    return herd_recovery(read_events(sup.run_dir), killed)


def warm_torchherd(tmp: Path, n: int) -> Recovery:
    """torchherd as `torchherd run` runs a gang that may restart: its restarted ranks are forked from the session's
    forking process, which has imported torch. That process starts with the session, beside the gang's first
    (cold) ranks, and is ready seconds later; so that the kill finds it ready in a run this short, it is started
    and made ready first (`keep_warm`, which the session then uses as its own)."""
    forker = keep_warm()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not forker.ready():
            if forker.gone or time.monotonic() > deadline:
                raise SystemExit("torchherd's forking process did not get ready")
            time.sleep(0.05)
        return asyncio.run(under_torchherd(tmp, n))
    finally:
        let_go()


async def _kill_and_wait(stream) -> float:
    """SIGKILL rank 1 once step KILL_AT is reported; returns the kill's time once the restarted gang steps."""
    pids: tuple[int, ...] = ()
    killed: float | None = None
    restarted = False
    async for event in stream:
        if isinstance(event, WorkerStarted):
            pids, restarted = event.pids, killed is not None
        elif isinstance(event, StepMetrics) and restarted and killed is not None:
            return killed
        elif isinstance(event, StepMetrics) and killed is None and event.step >= KILL_AT:
            os.kill(pids[1], signal.SIGKILL)
            killed = time.time()
    raise SystemExit("torchherd's gang ended without a step after the restart")


def herd_recovery(events: list[Event], killed: float) -> Recovery:
    """The figures of one kill, from the run's events (each stamped where it happened)."""
    before = [e.step for e in events if isinstance(e, StepMetrics) and e.time <= killed]
    restart = next(i for i, e in enumerate(events) if isinstance(e, WorkerStarted) and e.time > killed)
    after = events[restart:]
    resumed = next((e for e in after if isinstance(e, Resumed)), None)
    step = next(e for e in after if isinstance(e, StepMetrics))
    down = [e for e in events[:restart] if e.time > killed]
    phases = {}
    for kind, what, where in ((WorkerExited, "gang reaped (worker_exited)", down),
                              (WorkerRestarting, "restart decided (worker_restarting)", down),
                              (WorkerStarted, "ranks spawned (worker_started)", after),
                              (Resumed, "checkpoint loaded (resumed)", after),
                              (TrainingStarted, "training_started", after), (StepMetrics, "first step", after)):
        hit = next((e for e in where if isinstance(e, kind)), None)
        if hit is not None:
            phases[what] = hit.time - killed
    return Recovery(step.time - killed, max(before) - (resumed.step if resumed else 0), phases)


# ------------------------------------------------------------ torchrun

STEP = re.compile(r"step (\d+) restart (\d+) at ([\d.]+)")
RANK = re.compile(r"rank (\d+) restart (\d+) pid (\d+) started ([\d.]+) joined ([\d.]+)")
RESUMED = re.compile(r"resumed (\d+) at ([\d.]+)")
FAILED = re.compile(r"^E(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*failed \(exitcode", re.MULTILINE)  # the agent's line


def under_torchrun(tmp: Path, n: int) -> Recovery:
    """The plain loop under `torchrun --standalone --nproc-per-node=2 --max-restarts=1`."""
    folder = tmp / f"plain{n}"
    folder.mkdir()
    lines = folder / "steps.txt"
    lines.touch()
    # pytorch/pytorch#135712: a restarted gloo gang shares the rendezvous store with the attempt before and can
    # read its dead peers' addresses (the restart then fails, or hangs); torch's documented way out
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    with open(folder / "torchrun.log", "wb") as log:
        proc = subprocess.Popen([*torchrun_command(), "--standalone", f"--nproc-per-node={workload.RANKS}",
                                 "--max-restarts=1", workload.__file__, str(lines), str(EPOCHS)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=folder, env=env, start_new_session=True)
    try:
        killed = _kill_plain(proc, lines)
    finally:
        _end(proc)
    return plain_recovery(lines.read_text(), (folder / "torchrun.log").read_text(errors="replace"), killed)


def _kill_plain(proc: subprocess.Popen, lines: Path) -> float:
    """SIGKILL rank 1 once step KILL_AT is written; returns the kill's time once a restarted rank steps."""
    deadline = time.monotonic() + TIMEOUT
    killed: float | None = None
    while time.monotonic() < deadline:
        text = lines.read_text()
        steps = [(int(s), int(r)) for s, r, _ in STEP.findall(text)]
        if killed is None and any(s >= KILL_AT for s, r in steps if r == 0):
            [pid] = [int(p) for rank, r, p, _, _ in RANK.findall(text) if rank == "1" and r == "0"]
            os.kill(pid, signal.SIGKILL)
            killed = time.time()
        elif killed is not None and any(r == 1 for _, r in steps):
            return killed
        if proc.poll() is not None:
            log = (lines.parent / "torchrun.log").read_text(errors="replace")
            raise SystemExit(f"torchrun ended ({proc.returncode}) before a step after the restart:\n{log[-3000:]}")
        time.sleep(0.01)  # poll the step lines: a step takes longer on this workload
    raise SystemExit(f"torchrun did not step again within {TIMEOUT:g}s of its start")


def _end(proc: subprocess.Popen) -> None:
    """End torchrun and its ranks (each rank runs in a process group of its own)."""
    try:
        ranks = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    for p in [psutil.Process(proc.pid), *ranks] if proc.poll() is None else ranks:
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait()


def plain_recovery(text: str, log: str, killed: float) -> Recovery:
    """The figures of one kill, from the plain loop's lines (each stamped where it happened) and torchrun's log."""
    steps = [(int(s), int(r), float(t)) for s, r, t in STEP.findall(text)]
    before = max(s for s, r, t in steps if r == 0 and t <= killed)
    first = min(t for s, r, t in steps if r == 1)
    ranks = [(float(s), float(j)) for _, r, _, s, j in RANK.findall(text) if r == "1"]
    resumed = RESUMED.search(text)
    phases = {}
    seen = FAILED.search(log)  # glog's stamp: month, day and local time
    if seen:
        day = time.strftime("%Y", time.localtime(killed)) + seen.group(1) + " " + seen.group(2).split(".")[0]
        at = time.mktime(time.strptime(day, "%Y%m%d %H:%M:%S")) + float("0." + seen.group(2).split(".")[1])
        phases["agent saw the exit, stopped rank 0"] = at - killed
    phases["ranks spawned (before import torch)"] = min(s for s, _ in ranks) - killed
    phases["process group joined (both ranks)"] = max(j for _, j in ranks) - killed
    if resumed:
        phases["checkpoint loaded (resumed)"] = float(resumed.group(2)) - killed
    phases["first step"] = first - killed
    return Recovery(first - killed, before - (int(resumed.group(1)) if resumed else 0), phases)


# ------------------------------------------------------------ report


def spread(xs: list[float], fmt: str) -> str:
    return f"median {format(statistics.median(xs), fmt)} (spread {format(min(xs), fmt)}-{format(max(xs), fmt)})"


def report(name: str, runs: list[Recovery]) -> None:
    print(f"{name}: kill to next step {spread([r.seconds for r in runs], '.2f')} s; "
          f"steps lost {spread([float(r.lost) for r in runs], '.0f')}")
    for what in runs[0].phases:
        got = [r.phases[what] for r in runs if what in r.phases]
        print(f"    {what:<40} {statistics.median(got):6.2f} s after the kill (median)")


WAYS = {"torchrun": under_torchrun,
        "torchherd": warm_torchherd,
        "torchherd, cold restarts": lambda tmp, n: asyncio.run(under_torchherd(tmp, n, warm=False))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round at the least size (CI: it still runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    got: dict[str, list[Recovery]] = {name: [] for name in WAYS}
    print(f"2-rank gloo DDP on CPU ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}), {workload.SAMPLES} "
          f"samples, {workload.BATCH} per rank per step; checkpoint every epoch = {workload.STEPS_PER_EPOCH} steps "
          f"both ways; rank 1 SIGKILLed at step {KILL_AT}; torchherd restart.backoff {BACKOFF:g} s (default 1 s); "
          f"torchrun --max-restarts=1 with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", flush=True)
    with tempfile.TemporaryDirectory(prefix="torchherd-recovery-bench-") as tmp:
        # A ledger of its own: torchrun asks none, so neither waits behind other runs on a shared box
        os.environ["TORCHHERD_LEDGER"] = str(Path(tmp) / "ledger")
        for i in range(args.rounds):
            order = list(WAYS) if i % 2 == 0 else list(WAYS)[::-1]
            for k, name in enumerate(order):
                got[name].append(WAYS[name](Path(tmp), 10 * i + k))
            print(f"round {i + 1}: " + "; ".join(f"{name} {got[name][-1].seconds:.2f} s, {got[name][-1].lost} "
                                                  f"steps lost" for name in WAYS), flush=True)
    for name, runs in got.items():
        report(name, runs)
    plain = statistics.median(r.seconds for r in got["torchrun"])
    for name in list(WAYS)[1:]:
        ratio = statistics.median(r.seconds for r in got[name]) / plain
        print(f"kill to next step, {name} / torchrun: {ratio:.2f} (goal <= 0.5)")


if __name__ == "__main__":
    main()
