"""Tiny LightningModules for tests: regression y = 3*sum(x) + 1, with knobs for schedulers and optimisers."""
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


def data(n, seed, ids=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(dim=1, keepdim=True) * 3 + 1
    return TensorDataset(x, y, torch.arange(n)) if ids else TensorDataset(x, y)


class LitTiny(pl.LightningModule):
    """Linear regression; logs train_loss and val_loss/val_mae; `delay` seconds per batch slows it on purpose."""

    def __init__(self, lr=0.05, samples=256, batch_size=16, delay=0.0, scheduler="", seen_file="", val_file="",
                 epoch_end_file=""):
        super().__init__()
        self.save_hyperparameters()
        self.lin = nn.Linear(4, 1)
        self.val_steps_run = 0

    def forward(self, x):
        return self.lin(x)

    def on_train_epoch_end(self):
        if self.hparams.epoch_end_file:  # which epochs Lightning called this hook for
            with open(self.hparams.epoch_end_file, "a") as fh:
                fh.write(f"{self.current_epoch}\n")

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        if self.hparams.delay:
            time.sleep(self.hparams.delay)  # workload knob: lets tests act mid-epoch
        if self.hparams.seen_file:
            with open(self.hparams.seen_file, "a") as fh:  # which samples were trained, when, by which process
                fh.write(" ".join(str(int(i)) for i in ids) +
                         f" e{self.current_epoch} s{self.global_step} p{os.getpid()}\n")
        out = self(x)
        loss = nn.functional.mse_loss(out, y)
        self.log("train_loss", loss)
        self.log("train_mae", (out - y).abs().mean(), on_epoch=True)  # a logger sees train_mae_step per step
        self.log("batch", float(len(x)), prog_bar=True, logger=False)  # for the progress bar only
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        if self.hparams.val_file and batch_idx == 0:
            with open(self.hparams.val_file, "a") as fh:  # which process ran validation_step
                fh.write(f"{os.getpid()}\n")
        out = self(x)
        self.log("val_loss", nn.functional.mse_loss(out, y))
        self.log("val_mae", (out - y).abs().mean())

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        if self.hparams.scheduler == "onecycle":
            sched = torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=self.hparams.lr, total_steps=self.trainer.estimated_stepping_batches)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        if self.hparams.scheduler == "step":
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        return opt

    def train_dataloader(self):
        return DataLoader(data(self.hparams.samples, 1, ids=True), batch_size=self.hparams.batch_size,
                          shuffle=True)

    def val_dataloader(self):
        return DataLoader(data(64, 2), batch_size=32)


class LitTwoOptimizers(LitTiny):
    """Manual optimisation with two optimisers and a step scheduler on each."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.automatic_optimization = False
        self.bias_net = nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x) + self.bias_net(x)

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        opt_a, opt_b = self.optimizers()
        loss = nn.functional.mse_loss(self(x), y)
        opt_a.zero_grad()
        opt_b.zero_grad()
        self.manual_backward(loss)
        opt_a.step()
        opt_b.step()
        for sched in self.lr_schedulers():
            sched.step()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt_a = torch.optim.SGD(self.lin.parameters(), lr=self.hparams.lr)
        opt_b = torch.optim.Adam(self.bias_net.parameters(), lr=self.hparams.lr / 5)
        return [opt_a, opt_b], [torch.optim.lr_scheduler.StepLR(opt_a, 2, 0.5),
                                torch.optim.lr_scheduler.ExponentialLR(opt_b, 0.9)]


class NoValidation(LitTiny):
    """No validation_step at all: background validation must say so, not crash."""

    validation_step = pl.LightningModule.validation_step


class LogsToItsLogger(LitTiny):
    """A validation_step that writes to `self.logger` as Lightning users do (an image, a scalar)."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        if batch_idx == 0:
            self.logger.experiment.add_image("val/sample", torch.rand(3, 4, 4), self.global_step)


def with_early_stopping(params):
    """A factory whose EarlyStopping watches val_loss: impossible inside the worker in background mode."""
    from lightning.pytorch.callbacks import EarlyStopping

    from torchherd import LightningTask

    return LightningTask(module=LitTiny(**params), callbacks=[EarlyStopping(monitor="val_loss")])


def with_impatient_early_stopping(params):
    """A factory whose EarlyStopping stops after one check with no improvement of 10 (never, on this data)."""
    from lightning.pytorch.callbacks import EarlyStopping

    from torchherd import LightningTask

    return LightningTask(module=LitTiny(**params),
                         callbacks=[EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0)])


def build(params):
    """A plain `task = "lit_tiny.py:build"` (no `lightning:` prefix) whose factory returns a LightningTask."""
    from torchherd import LightningTask

    return LightningTask(module=LitTiny(**params))
