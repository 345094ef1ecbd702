"""A LightningModule and DataModule written the usual way, for Lightning gangs: regression y = 3*sum(x) + 1.

Run as a script it is plain Lightning DDP on 2 CPU processes (Lightning launches the second itself) and
saves the trained weights: `python lit_gang.py OUT.pt [max_epochs]`, the baseline torchherd's gang must equal.
"""
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class RegressionData(pl.LightningDataModule):
    def __init__(self, samples=256, batch_size=16):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(self.samples, 4, generator=g)
        self.train = TensorDataset(x, x.sum(dim=1, keepdim=True) * 3 + 1, torch.arange(self.samples))
        g = torch.Generator().manual_seed(2)
        x = torch.randn(64, 4, generator=g)
        self.val = TensorDataset(x, x.sum(dim=1, keepdim=True) * 3 + 1)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=32)


class LitRegression(pl.LightningModule):
    """`delay` seconds per batch lets a test act mid-epoch; `seen_file` records which samples each process
    trained, at which epoch and step."""

    def __init__(self, lr=0.05, delay=0.0, seen_file=""):
        super().__init__()
        self.save_hyperparameters()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x)

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        if self.hparams.delay:
            time.sleep(self.hparams.delay)
        if self.hparams.seen_file:
            with open(self.hparams.seen_file, "a") as fh:
                fh.write(" ".join(str(int(i)) for i in ids) +
                         f" e{self.current_epoch} s{self.global_step} p{os.getpid()}\n")
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.log("val_loss", nn.functional.mse_loss(out, y))
        self.log("val_mae", (out - y).abs().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def main(out: str, max_epochs: int = 2, batch_size: int = 16) -> None:
    """Plain Lightning: `Trainer(devices=2, strategy="ddp", accelerator="cpu").fit`, one thread a process."""
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    model = LitRegression()
    trainer = pl.Trainer(devices=2, strategy="ddp", accelerator="cpu", max_epochs=max_epochs, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0)
    start = time.perf_counter()
    trainer.fit(model, datamodule=RegressionData(batch_size=batch_size))
    if trainer.is_global_zero:
        torch.save({"state_dict": model.state_dict(), "seconds": time.perf_counter() - start,
                    "steps": trainer.global_step}, out)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
