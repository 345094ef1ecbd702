"""Does torchherd's background validation take Lightning's validation off the training clock? Timed in one script.

One workload (benchmarks/_lightning_workload.py), three ways, one training thread each:
plain Lightning with its sequential validation, plain Lightning train-only
(limit_val_batches=0), and the same module under torchherd with background
validation (a validator thread of its own: on a 2-core machine one core each).
Prints each total over train-only, and torchherd's training speed against plain
`Trainer.fit`. Run: python benchmarks/lightning_overlap.py  (EPOCHS, HIDDEN to change the size)
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import lightning.pytorch as pl  # noqa: E402

from torchherd.engine.config import parse_config  # noqa: E402
from torchherd.engine.messages import EpochEnd, TrainingStarted, ValResult  # noqa: E402
from torchherd.engine.supervisor import Supervisor  # noqa: E402

HERE = Path(__file__).resolve().parent
EPOCHS = int(os.environ.get("EPOCHS", "5"))
PARAMS = {"hidden": int(os.environ.get("HIDDEN", "1024"))}


def plain(validate: bool, root: Path) -> float:
    """Seconds `Trainer.fit` takes in this process on one thread (Lightning already imported)."""
    sys.path.insert(0, str(HERE))
    from _lightning_workload import LitOverlap

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=None if validate else 0, default_root_dir=str(root))
    start = time.perf_counter()
    trainer.fit(LitOverlap(**PARAMS))
    return time.perf_counter() - start


async def herd(root: Path) -> tuple[float, float]:
    """(training seconds, seconds until the last validation result), both from the first training step."""
    data = {"runs_dir": str(root), "defaults": {
                "task": f"lightning:{HERE / '_lightning_workload.py'}:LitOverlap", "max_epochs": EPOCHS,
                "log_every_n_steps": 50, "params": PARAMS},
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
    from torchherd.engine.rundir import read_events

    events = read_events(sup.run_dir)
    start = [e.time for e in events if isinstance(e, TrainingStarted)][0]
    trained = [e.time for e in events if isinstance(e, EpochEnd)][-1] - start
    validated = [e.time for e in events if isinstance(e, ValResult)][-1] - start
    return trained, validated


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train_only = plain(False, root / "train-only")
        sequential = plain(True, root / "sequential")
        trained, validated = asyncio.run(herd(root / "herd"))
    print(f"workload: {EPOCHS} epochs, hidden {PARAMS['hidden']}, one training thread")
    print(f"plain Lightning train-only        {train_only:7.2f} s   1.00x")
    print(f"plain Lightning sequential val    {sequential:7.2f} s   {sequential / train_only:.2f}x")
    print(f"torchherd background: training    {trained:7.2f} s   {trained / train_only:.2f}x "
          f"(training speed {train_only / trained:.2f}x plain Trainer.fit)")
    print(f"torchherd background: last result {validated:7.2f} s   {validated / train_only:.2f}x")


if __name__ == "__main__":
    main()
