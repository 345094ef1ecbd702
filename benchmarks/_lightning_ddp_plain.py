"""Plain Lightning DDP on CPU, as people run it: `Trainer(devices=2, strategy="ddp", accelerator="cpu").fit`.

Lightning starts the second rank itself (it runs this script again). Rank 0 writes its training
seconds (from `on_train_start` to the end of the last epoch, validation included) as JSON to OUT.
Run by benchmarks/lightning_gang.py: python _lightning_ddp_plain.py OUT EPOCHS HIDDEN VALIDATE(0/1)
"""
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import torch
import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lightning_workload import LitOverlap  # noqa: E402


class Clock(pl.Callback):
    def __init__(self):
        self.start = self.end = 0.0

    def on_train_start(self, trainer, module):
        self.start = time.monotonic()

    def on_train_epoch_end(self, trainer, module):
        self.end = time.monotonic()

    def on_validation_end(self, trainer, module):
        self.end = max(self.end, time.monotonic())


def main(out: str, epochs: int, hidden: int, validate: int) -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # one thread a rank, as torchherd's slots of threads_per_worker = 1
    pl.seed_everything(0, verbose=False)
    clock = Clock()
    trainer = pl.Trainer(devices=2, strategy="ddp", accelerator="cpu", max_epochs=epochs, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=None if validate else 0, callbacks=[clock])
    trainer.fit(LitOverlap(hidden=hidden))
    if trainer.is_global_zero:
        Path(out).write_text(json.dumps({"seconds": clock.end - clock.start, "steps": trainer.global_step}))


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
