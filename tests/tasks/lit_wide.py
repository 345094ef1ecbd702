"""A LightningModule whose `hidden` width shapes the model (a PBT sweep must keep it from the donor it takes over):
a one-hidden-layer MLP regressing y = sum(sin(x)) on fixed data, SGD at `lr`; `delay` seconds a batch slow it, and
with `sync_file` training waits after its first epoch until the validator has scored something (it touches the file
in validation_step): on a loaded machine the validator's start alone can outlast a short sweep."""
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, torch.sin(x).sum(dim=1, keepdim=True))


class LitWide(pl.LightningModule):
    def __init__(self, hidden=8, lr=0.05, samples=128, delay=0.0, sync_file=""):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.hparams.delay:
            time.sleep(self.hparams.delay)  # workload knob: epochs long enough for background results to come
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_epoch_start(self):
        end = time.monotonic() + 120  # seconds: past that, training goes on regardless
        while self.current_epoch >= 1 and self.hparams.sync_file and not os.path.exists(self.hparams.sync_file):
            if time.monotonic() > end:
                break
            time.sleep(0.05)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        if self.hparams.sync_file:
            open(self.hparams.sync_file, "a").close()
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(data(self.hparams.samples, 1), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(data(256, 2), batch_size=256)
