"""Does torchherd's background validation take Lightning's validation off the training clock? Timed in one script.

One workload (benchmarks/_lightning_workload.py), three ways, one training thread each:
plain Lightning with its sequential validation, plain Lightning train-only
(limit_val_batches=0), and the same module under torchherd with background
validation (a validator thread of its own: on a 2-core machine one core each).

Every way is timed the same: from the start of training (Lightning's
`on_train_start`; torchherd's TrainingStarted, sent from that hook in the worker)
to the end of the last epoch (its last `on_train_epoch_end`, or the inline
validation after it; torchherd's last EpochEnd), on the clock of the process that
trains. Start-up (imports, building the module, Lightning's fit set-up; for
torchherd also spawning the worker) is printed apart. Neither side checkpoints
inside that window: plain runs have checkpointing off, torchherd writes its one
`last.ckpt` after the last epoch (checkpoint_every_n_epochs = EPOCHS); a checkpoint
per epoch costs about 10 ms each here. The three run in turn, ROUNDS times, and the
best of each is compared, so a spell of load from elsewhere hits all of them alike.

A fourth way isolates torchherd's own cost from the processes around it: its
Lightning runner (the callback, the snapshot hand-offs) in this process, on this
thread, with no validator reading, against the same plain train-only fit.

Run: python benchmarks/lightning_overlap.py [--quick]   (EPOCHS, ROUNDS, HIDDEN to change the size; --quick: one
round of 2 epochs at the least size, torchherd's workers forked from one warm process: CI, figures meaningless)
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import lightning.pytorch as pl  # noqa: E402

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, TrainingStarted, ValResult, WorkerStarted  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

HERE = Path(__file__).resolve().parent
QUICK = "--quick" in sys.argv[1:]
# 20 epochs: enough that the validator's one Lightning import is amortised
EPOCHS = int(os.environ.get("EPOCHS", "2" if QUICK else "20"))
ROUNDS = int(os.environ.get("ROUNDS", "1" if QUICK else "3"))
PARAMS = {"hidden": int(os.environ.get("HIDDEN", "32" if QUICK else "1024"))}


class Clock(pl.Callback):
    """When plain Lightning's training started and its last epoch (with any inline validation) ended."""

    def __init__(self):
        self.start = self.end = 0.0

    def on_train_start(self, trainer, module):
        self.start = time.monotonic()

    def on_train_epoch_end(self, trainer, module):
        self.end = time.monotonic()

    def on_validation_end(self, trainer, module):
        self.end = max(self.end, time.monotonic())


def plain(validate: bool, root: Path) -> tuple[float, float]:
    """(start-up, training seconds) of `Trainer.fit` in this process on one thread (Lightning already imported)."""
    sys.path.insert(0, str(HERE))
    from _lightning_workload import LitOverlap

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    clock = Clock()
    begun = time.monotonic()
    trainer = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=None if validate else 0, default_root_dir=str(root), callbacks=[clock])
    trainer.fit(LitOverlap(**PARAMS))
    return clock.start - begun, clock.end - clock.start


async def herd(root: Path) -> tuple[float, float, float]:
    """(start-up, training seconds, seconds from training start to the last validation result)."""
    data = {"runs_dir": str(root), "defaults": {
                "task": f"lightning:{HERE / '_lightning_workload.py'}:LitOverlap", "max_epochs": EPOCHS,
                "log_every_n_steps": 50, "checkpoint_every_n_epochs": EPOCHS, "params": PARAMS},
            "pipelines": [{"name": "p"}],
            "devices": {"placement": "cpu", "cpu_slots": 1, "threads_per_worker": 1},
            "validation": {"mode": "background", "device": "cpu", "threads": 1, "policy": "all", "slots": 4},
            "telemetry": {"enabled": False}}
    sup = Supervisor(parse_config(data, str(root / "bench.toml"), root))
    await sup.start()
    try:
        await asyncio.wait_for(sup.wait(), 1800)
    finally:
        await sup.shutdown(graceful=True)
    from torchherd.engine.rundir.directory import read_events

    events = read_events(sup.run_dir)
    spawned = [e.time for e in events if isinstance(e, WorkerStarted)][0]
    start = [e.time for e in events if isinstance(e, TrainingStarted)][0]  # both on the worker's clock
    trained = [e.time for e in events if isinstance(e, EpochEnd)][-1] - start
    validated = [e.time for e in events if isinstance(e, ValResult)][-1] - start
    return start - spawned, trained, validated


class _Sender:
    """The worker's status sender, keeping events in memory (with the worker-side clock) instead of a pipe."""

    def __init__(self):
        self.events: list[tuple[float, object]] = []

    def step(self, event) -> None:
        self.events.append((time.monotonic(), event))

    send = step


class _NoCommands:
    def poll(self, timeout: float = 0.0) -> list:
        return []


def runner_here(root: Path) -> float:
    """Training seconds of torchherd's Lightning runner in this process (hand-offs to slots nobody reads)."""
    from types import SimpleNamespace

    from torchherd.engine.worker.control import WorkerControl
    from torchherd.engine.runners.lightning.runner import LightningAttempt

    data = {"runs_dir": str(root), "defaults": {
                "task": f"lightning:{HERE / '_lightning_workload.py'}:LitOverlap", "max_epochs": EPOCHS,
                "log_every_n_steps": 50, "checkpoint_every_n_epochs": EPOCHS, "params": PARAMS},
            "pipelines": [{"name": "p"}],
            "validation": {"mode": "background", "device": "cpu", "policy": "latest", "slots": 2},
            "telemetry": {"enabled": False}}
    config = parse_config(data, str(root / "bench.toml"), root)
    (root / "p").mkdir(parents=True)
    spec = SimpleNamespace(pipeline_dir=str(root / "p"), snapshot_dir=str(root / "p-snapshots"), snapshot_seq=0,
                           device="cpu", rank=0, world_size=1)
    sender = _Sender()
    torch.set_num_threads(1)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):  # the worker's model summary
        LightningAttempt(spec, config.pipelines[0], config.validation, sender,
                        WorkerControl("p", sender, _NoCommands())).run()
    start = [t for t, e in sender.events if isinstance(e, TrainingStarted)][0]
    return [t for t, e in sender.events if isinstance(e, EpochEnd)][-1] - start


def main() -> None:
    from _quick import warm

    with warm(QUICK):
        measure()


def measure() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # "GPU available: False" per fit
    warnings.filterwarnings("ignore", module="lightning")  # its per-fit advice on loggers and log intervals
    load = os.getloadavg()[0]
    runs: dict[str, list] = {"train-only": [], "sequential": [], "herd": [], "here": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(ROUNDS):
            runs["train-only"].append(plain(False, root / f"train-only-{i}"))
            runs["sequential"].append(plain(True, root / f"sequential-{i}"))
            runs["herd"].append(asyncio.run(herd(root / f"herd-{i}")))
            runs["here"].append(runner_here(root / f"here-{i}"))
            print(f"round {i + 1}: train-only {runs['train-only'][-1][1]:.2f} s, sequential "
                  f"{runs['sequential'][-1][1]:.2f} s, torchherd training {runs['herd'][-1][1]:.2f} s, "
                  f"last result {runs['herd'][-1][2]:.2f} s, runner in-process {runs['here'][-1]:.2f} s", flush=True)
    base = min(r[1] for r in runs["train-only"])
    seq = min(r[1] for r in runs["sequential"])
    trained = min(r[1] for r in runs["herd"])
    validated = min(r[2] for r in runs["herd"])
    print(f"workload: {EPOCHS} epochs, hidden {PARAMS['hidden']}, one training thread; best of {ROUNDS} "
          f"alternating rounds; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"{os.cpu_count()} cores")
    print(f"start-up (not in the ratios): plain fit set-up {min(r[0] for r in runs['train-only']):.2f} s, "
          f"torchherd worker spawn to training start {min(r[0] for r in runs['herd']):.2f} s")
    print(f"plain Lightning train-only        {base:7.2f} s   1.00x")
    print(f"plain Lightning sequential val    {seq:7.2f} s   {seq / base:.2f}x")
    print(f"torchherd background: training    {trained:7.2f} s   {trained / base:.2f}x "
          f"(training speed {base / trained:.2f}x plain Trainer.fit)")
    print(f"torchherd background: last result {validated:7.2f} s   {validated / base:.2f}x")
    here = min(runs["here"])
    print(f"torchherd runner in this process  {here:7.2f} s   {here / base:.2f}x "
          f"(training speed {base / here:.2f}x plain Trainer.fit, same thread, no validator)")


if __name__ == "__main__":
    main()
