"""The workload benchmarks/lightning_overlap.py times: an MLP regression whose validation costs about half an epoch."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


def _data(n: int, width: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


class LitOverlap(pl.LightningModule):
    """Two hidden layers of `hidden`; `train` and `val` samples (validation is forward only, so more of it)."""

    def __init__(self, hidden: int = 1024, train: int = 4096, val: int = 6144, width: int = 64):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(_data(self.hparams.train, self.hparams.width, 1), batch_size=128, shuffle=True)

    def val_dataloader(self):
        return DataLoader(_data(self.hparams.val, self.hparams.width, 2), batch_size=512)
