"""A small LightningModule and DataModule on scikit-learn's handwritten digits (bundled, no download).

Used by sample_configs/lightning_digits.toml; it is plain Lightning code with
nothing of torchherd in it, so the same classes train under `Trainer.fit` alone.
"""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class DigitsData(pl.LightningDataModule):
    """8x8 digit images, 1,437 to train on and 360 to validate on, split by a fixed seed."""

    def __init__(self, batch_size: int = 32):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32) / 16.0  # pixel values are 0..16
        y = torch.tensor(y)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        train, val = order[:1437], order[1437:]
        self.train_set, self.val_set = TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)


class LitDigits(pl.LightningModule):
    """A two-layer MLP classifier with a step-interval cosine schedule."""

    def __init__(self, hidden: int = 128, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.estimated_stepping_batches)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
