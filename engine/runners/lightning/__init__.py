"""The Lightning runner: a LightningModule trained by Lightning's own `Trainer.fit` with a torchherd callback."""
