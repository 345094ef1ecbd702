"""Soak: train several pipelines for a while through the Supervisor API and hit them with faults at random.

    python scripts/soak.py [--minutes 10] [--pipelines 4] [--seed N] [--runs-dir DIR] [--keep]

One asyncio program: it starts a multi-pipeline run of the tiny test task (or the
built-in `regression`), then until time is up picks a fault every couple of
seconds: SIGKILL a worker (os.kill), stop it, restart it (sup.restart), kill it
(sup.kill), pause it and resume it later, ask for a checkpoint. Pipelines that
end (stopped, killed, completed) are relaunched with sup.restart to keep the load on.
At the end it stops everything gracefully and checks the run directory:

  - every pipeline either completed or ended with a recorded reason;
  - no attempt lost saved progress: each new attempt starts at or after the epoch
    and step of the last checkpoint saved before it started, without falling back
    to an older checkpoint; metrics.jsonl has every epoch_end of events.jsonl;
  - every SIGKILL it sent is reported as such;
  - no process is left (psutil): no child of ours, and no worker pid ever started.

It prints faults by kind, restarts and the progress lost to them (epochs redone
since the last checkpoint), and exits 1 on any violation.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, PipelineFinished, Resumed, RunFinished,  # noqa: E402
                             SnapshotSkipped, SnapshotTaken, StepMetrics, TrainingStarted, ValidatorStarted,
                             ValResult, WorkerExited, WorkerRestarting, WorkerStarted)
from torchherd.engine.rundir.directory import read_events, read_records  # noqa: E402
from torchherd.engine.protocol.states import WorkerState  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

TINY = ROOT / "tests" / "tasks" / "tiny.py"
LIVE = (WorkerState.RUNNING, WorkerState.PAUSED)


def make_config(runs_dir: Path, pipelines: int, task: str, epochs: int, validation: str):
    if task == "tiny":
        ref, params = f"{TINY}:build", {"samples": 512, "delay": 0.001}  # ~16 steps, well under a second an epoch
    else:
        ref, params = "regression", {"samples": 2048, "features": 8, "hidden": 32}
    data = {
        "name": "soak", "runs_dir": str(runs_dir),
        "defaults": {"task": ref, "max_epochs": epochs, "batch_size": 32, "log_every_n_steps": 4, "params": params},
        "pipelines": [{"name": f"p{i}", "seed": i} for i in range(pipelines)],
        "devices": {"placement": "cpu", "cpu_slots": pipelines},
        "validation": {"mode": validation},
        # Every SIGKILL is a crash: a budget this size never runs out, so crashes always restart.
        "restart": {"max_restarts": 100_000, "backoff": 0.2, "backoff_max": 2.0, "min_uptime": 0.0,
                    "max_failed_starts": 1000, "kill_grace": 2.0, "stop_timeout": 30.0},
        "telemetry": {"enabled": True, "interval": 2.0, "persist_every": 10.0},
    }
    return parse_config(data, str(runs_dir / "soak.toml"), runs_dir)


class Soak:
    def __init__(self, sup: Supervisor, rng: random.Random, interval: float):
        self.sup = sup
        self.rng = rng
        self.interval = interval  # mean seconds between faults
        self.faults: collections.Counter[str] = collections.Counter()
        self.sigkilled: set[int] = set()  # pids we sent SIGKILL to
        self.paused: dict[str, float] = {}  # pipeline -> monotonic time to resume it

    def _pick(self, states) -> str | None:
        names = [v.name for v in self.sup.views() if v.state in states and (v.pid is not None or v.state not in LIVE)]
        return self.rng.choice(names) if names else None

    def inject(self) -> None:
        sup = self.sup
        kind = self.rng.choices(["sigkill", "stop", "restart", "kill", "pause", "checkpoint", "validator"],
                                weights=[4, 2, 2, 1, 2, 1, 1])[0]
        if kind == "validator":
            pid = sup.validator_pid
            if pid is None:
                return
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
        elif kind == "sigkill":
            name = self._pick((WorkerState.RUNNING, WorkerState.PAUSED, WorkerState.STARTING))
            pid = sup.view(name).pid if name else None
            if pid is None:
                return
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            self.sigkilled.add(pid)
            self.paused.pop(name, None)
        else:
            name = self._pick(LIVE if kind != "pause" else (WorkerState.RUNNING,))
            if name is None:
                return
            if kind == "stop":
                sup.stop(name, reason="soak")
            elif kind == "restart":
                sup.restart(name)
            elif kind == "kill":
                sup.kill(name)
            elif kind == "pause":
                sup.pause(name)
                self.paused[name] = time.monotonic() + self.rng.uniform(0.5, 3.0)
            elif kind == "checkpoint":
                sup.checkpoint(name)
            if kind != "pause":
                self.paused.pop(name, None)
        self.faults[kind] += 1

    def keep_load(self) -> None:
        now = time.monotonic()
        for name, when in list(self.paused.items()):
            if now >= when:
                if self.sup.view(name).state == WorkerState.PAUSED:
                    self.sup.resume(name)
                del self.paused[name]
        for view in self.sup.views():
            if view.state.final:
                self.sup.restart(view.name)  # relaunch: a finished pipeline resumes from its checkpoint
                self.faults["relaunch"] += 1

    async def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        next_fault = time.monotonic() + self.rng.expovariate(1 / self.interval)
        while time.monotonic() < end:
            self.keep_load()
            if time.monotonic() >= next_fault:
                self.inject()
                next_fault = time.monotonic() + self.rng.expovariate(1 / self.interval)
            await asyncio.sleep(0.1)
        for name in list(self.paused):
            if self.sup.view(name).state == WorkerState.PAUSED:
                self.sup.resume(name)


def check(run_dir: Path, names: list[str], sigkilled: set[int]) -> tuple[list[str], dict]:
    """Violations found in the run directory, and figures for the report."""
    events = read_events(run_dir)
    violations: list[str] = []
    figures = {"attempts": 0, "crash_restarts": 0, "user_restarts": 0, "epochs_redone": 0, "completed": 0,
               "epochs_trained": 0}
    redone: dict[str, int] = collections.defaultdict(int)
    steps_redone: dict[str, int] = collections.defaultdict(int)
    for name in names:
        last_ckpt: CheckpointSaved | None = None
        best_epoch_end = -1
        best_step = 0
        floor = 0  # epoch of the last checkpoint saved before this attempt started
        started_attempts = 0
        mine = [e for e in events if getattr(e, "pipeline", None) == name]
        for e in mine:
            if isinstance(e, CheckpointSaved) and Path(e.path).name == "last.pt":
                last_ckpt = e
            elif isinstance(e, WorkerStarted):
                started_attempts += 1
            elif isinstance(e, Resumed) and e.note:
                violations.append(f"{name}: fell back to an older checkpoint: {e.note}")
            elif isinstance(e, TrainingStarted):
                if last_ckpt is not None and (e.epoch, e.step) < (last_ckpt.epoch, last_ckpt.step):
                    violations.append(f"{name}: an attempt started at epoch {e.epoch} step {e.step}, before the "
                                      f"checkpoint saved at epoch {last_ckpt.epoch} step {last_ckpt.step}")
                floor = last_ckpt.epoch if last_ckpt is not None else 0
                if e.epoch <= best_epoch_end:
                    redone[name] += best_epoch_end + 1 - e.epoch
                steps_redone[name] += max(0, best_step - e.step)
            elif isinstance(e, EpochEnd):
                if e.epoch < floor:
                    violations.append(f"{name}: epoch {e.epoch} trained again although an attempt resumed "
                                      f"from a checkpoint at epoch {floor}")
                best_epoch_end = max(best_epoch_end, e.epoch)
                best_step = max(best_step, e.step)
                figures["epochs_trained"] += 1
            elif isinstance(e, StepMetrics):
                best_step = max(best_step, e.step)
            elif isinstance(e, WorkerExited) and e.signal == "SIGKILL" and e.pid in sigkilled and \
                    e.reason not in ("crashed", "restarted", "killed", "stopped"):
                violations.append(f"{name}: SIGKILLed pid {e.pid} reported as {e.reason!r}")
        figures["attempts"] += started_attempts
        finals = [e for e in mine if isinstance(e, PipelineFinished)]
        if not finals:
            violations.append(f"{name}: no final status")
        else:
            last = finals[-1]
            if last.status == "completed":
                figures["completed"] += 1
            if any(f.status != "completed" and not f.reason for f in finals):
                violations.append(f"{name}: ended {last.status} without a reason")
        metrics = [r for r in read_records(run_dir / name / "metrics.jsonl") if r.get("type") == "epoch_end"]
        if len(metrics) != len([e for e in mine if isinstance(e, EpochEnd)]):
            violations.append(f"{name}: metrics.jsonl has {len(metrics)} epoch_end records, events.jsonl "
                              f"{len([e for e in mine if isinstance(e, EpochEnd)])}")
    validators = [e for e in events if isinstance(e, ValidatorStarted)]
    figures["validator_restarts"] = max(len(validators) - 1, 0)
    taken = {(e.pipeline, e.seq) for e in events if isinstance(e, SnapshotTaken) and not e.dropped}
    scored = {(e.pipeline, e.seq) for e in events if isinstance(e, ValResult) and e.mode == "background"}
    skipped = {(e.pipeline, e.seq) for e in events if isinstance(e, SnapshotSkipped)}
    figures["snapshots"] = (len(taken), len(scored & taken), len(skipped & taken))
    # A snapshot handed off just before the end may still be in flight; anything else must be accounted for.
    last_seq = {}
    for pipeline, seq in taken:
        last_seq[pipeline] = max(last_seq.get(pipeline, 0), seq)
    lost = sorted(k for k in taken - scored - skipped if k[1] != last_seq[k[0]])
    if lost:
        violations.append(f"snapshots neither validated nor recorded as skipped: {lost[:10]}")
    figures["crash_restarts"] = len([e for e in events if isinstance(e, WorkerRestarting)])
    figures["user_restarts"] = len([e for e in events if isinstance(e, WorkerExited) and e.reason == "restarted"])
    figures["epochs_redone"] = sum(redone.values())
    figures["redone_by_pipeline"] = dict(redone)
    figures["steps_redone"] = sum(steps_redone.values())
    reported = {e.pid for e in events if isinstance(e, WorkerExited) and e.signal == "SIGKILL"}
    missing = sigkilled - reported - {e.pid for e in events if isinstance(e, WorkerExited)}
    if missing:
        violations.append(f"SIGKILLed pids never reported as exited: {sorted(missing)}")
    if not events or not isinstance(events[-1], RunFinished):
        violations.append("events.jsonl does not end with run_finished")
    return violations, figures


def leftovers(worker_procs: list[psutil.Process], timeout: float = 10.0) -> list[str]:
    """Our descendants and every worker ever started that are still alive after `timeout` seconds."""
    def alive() -> list[psutil.Process]:
        procs = {p.pid: p for p in psutil.Process().children(recursive=True)}
        procs.update({p.pid: p for p in worker_procs})
        out = []
        for p in procs.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out
    deadline = time.monotonic() + timeout
    left = alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = alive()
    described = []
    for p in left:
        try:
            described.append(f"{p.pid} {' '.join(p.cmdline()[:4])}")
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return described


async def soak(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    runs_dir = Path(args.runs_dir) if args.runs_dir else Path(tempfile.mkdtemp(prefix="torchherd-soak-"))
    config = make_config(runs_dir, args.pipelines, args.task, args.epochs, args.validation)
    sup = Supervisor(config)
    stream = sup.subscribe()
    worker_procs: list[psutil.Process] = []
    names = [p.name for p in config.pipelines]
    print(f"soak: {args.pipelines} pipelines of {args.task} for {args.minutes:g} min, seed {args.seed}, "
          f"run directory {sup.run_dir}", flush=True)

    async def watch() -> None:
        async for event in stream:
            if isinstance(event, (WorkerStarted, ValidatorStarted)):
                try:
                    worker_procs.append(psutil.Process(event.pid))
                except psutil.NoSuchProcess:
                    pass

    watcher = asyncio.get_running_loop().create_task(watch())
    chaos = Soak(sup, rng, args.interval)
    await sup.start()
    try:
        await chaos.run(args.minutes * 60)
    finally:
        sup.stop(reason="soak over")
        try:
            await asyncio.wait_for(sup.wait(), 60)
        except asyncio.TimeoutError:
            states = ", ".join(f"{v.name} {v.state.value}" for v in sup.views())
            print(f"soak: pipelines did not stop within 60 s ({states}; validator pid {sup.validator_pid}); "
                  "killing them", flush=True)
        await sup.shutdown(graceful=False)
        await asyncio.wait_for(watcher, 10)

    violations, figures = check(sup.run_dir, names, chaos.sigkilled)
    left = leftovers(worker_procs)
    if left:
        violations.append(f"processes left behind: {left}")
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(chaos.faults.items())))
    print(f"worker attempts {figures['attempts']}, restarts after crashes {figures['crash_restarts']}, "
          f"user restarts {figures['user_restarts']}, epochs trained {figures['epochs_trained']}, "
          f"pipelines completed (last status) {figures['completed']}/{len(names)}")
    print(f"progress lost: {figures['epochs_redone']} whole epoch(s) redone "
          f"{figures['redone_by_pipeline'] or ''}".rstrip() +
          f"; {figures['steps_redone']} optimizer step(s) redone since the last checkpoint (partial epochs)")
    taken, scored, skipped = figures["snapshots"]
    print(f"validator restarts {figures['validator_restarts']}; snapshots handed off {taken}, "
          f"validated {scored}, recorded as skipped {skipped}")
    print(f"orphans: {len(left)}")
    if violations:
        print(f"VIOLATIONS ({len(violations)}):")
        for v in violations:
            print(f"  {v}")
    else:
        print("ok: no violations")
    if not args.keep and not args.runs_dir and not violations:
        shutil.rmtree(runs_dir, ignore_errors=True)
    return 1 if violations else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to inject faults (minutes)")
    parser.add_argument("--pipelines", type=int, default=4, help="pipelines (one CPU slot each)")
    parser.add_argument("--task", choices=["tiny", "regression"], default="tiny")
    parser.add_argument("--epochs", type=int, default=60, help="max_epochs of each pipeline")
    parser.add_argument("--interval", type=float, default=2.0, help="mean seconds between faults")
    parser.add_argument("--validation", choices=["auto", "background", "inline", "off"], default="auto")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: time-based; printed)")
    parser.add_argument("--runs-dir", help="where the run directory goes (kept); default a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run directory")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int(time.time()) % 100_000
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
