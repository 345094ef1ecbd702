"""The validator's side of a Lightning pipeline: score snapshots with the module's own `validation_step`.

`LightningScorer` builds the module and DataModule once, loads each snapshot's
weights into the module and runs `Trainer.validate` on them, so a result is what
plain Lightning reports for the same weights. It keeps the best checkpoint as a
`.ckpt` that `LitModel.load_from_checkpoint` reads, and asks for early stops.
"""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...protocol.channel import EventSink
from ...protocol.messages import Notice, ValResult
from ...protocol.names import ValidationMode
from ..scoring import PipelineScoring, keep_best, load_newest, open_pipeline
from . import LightningRunner

if TYPE_CHECKING:
    from ...worker.snapshot import Loaded

BEST = LightningRunner.checkpoint_name("best")


def validator_logger(pipeline_dir: Path) -> Any:
    """A TensorBoard logger into the pipeline's validator/ folder: a validation_step that writes to `self.logger`
    (images, text, as Lightning users do) works as under plain Lightning, and what it writes is kept there."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(save_dir=str(pipeline_dir / "validator"), name="", version="", default_hp_metric=False)


class LightningScorer(PipelineScoring):
    """One Lightning pipeline as the validator sees it (the same interface as PipelineScorer)."""

    def __init__(self, name: str, directory: Path, device: str):
        import lightning.pytorch as pl
        from lightning.pytorch.utilities.model_helpers import is_overridden

        from .runner import PRECISION
        from .support import build_for

        open_pipeline(self, name, directory)
        self.noticed: set[str] = set()
        pl.seed_everything(self.pipe.seed, verbose=False)
        self.task = build_for(self.pipe)
        for obj in (self.task.module, self.task.datamodule):
            if obj is not None:  # the worker's fit already prepared the data for this run
                obj.prepare_data = lambda: None
        self.module = self.task.module
        self.has_step = is_overridden("validation_step", self.module)
        self.trainer = pl.Trainer(
            accelerator="gpu" if device.startswith("cuda") else "cpu", devices=1,
            logger=validator_logger(self.pipeline_dir),
            precision=PRECISION[self.pipe.precision], enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, default_root_dir=str(self.pipeline_dir / "validator"))

    def _notice(self, sender: EventSink, key: str, text: str) -> None:
        if key not in self.noticed:
            self.noticed.add(key)
            sender.send(Notice(pipeline=self.name, level="warning", text=text))

    def validate(self) -> dict[str, float]:
        """Trainer.validate on the module's current weights: what plain Lightning reports for them."""
        results = self.trainer.validate(self.module, datamodule=self.task.datamodule, verbose=False)
        out: dict[str, float] = {}
        for per_loader in results:
            out.update({k: float(v) for k, v in per_loader.items()})
        return out

    def score_newest(self, sender: EventSink) -> bool:
        """Validate the newest unseen snapshot, if any; True if one was scored."""
        from ...worker.snapshot import weights_checksum

        loaded = load_newest(self, self.module)
        if loaded is None:
            return False
        if not self.has_step:
            self._notice(sender, "no-step", f"{type(self.module).__name__} has no validation_step: "
                         "snapshots are not scored (add one that self.log()s, e.g. 'val_loss')")
            sender.send(ValResult(pipeline=self.name, epoch=loaded.epoch, step=loaded.step, metrics={},
                                  latency=time.time() - loaded.handoff, mode=ValidationMode.BACKGROUND, seq=loaded.seq))
            return True
        checksum = weights_checksum(self.module.state_dict()) if self.validation.checksum else None
        try:
            metrics = self.validate()
        except Exception as exc:
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            sender.send(ValResult(pipeline=self.name, epoch=loaded.epoch, step=loaded.step, metrics={},
                                  latency=time.time() - loaded.handoff, mode=ValidationMode.BACKGROUND, seq=loaded.seq,
                                  error=f"{type(exc).__name__}: {exc}", traceback=tb))
            return True
        if not metrics:
            self._notice(sender, "no-metrics", f"{type(self.module).__name__}.validation_step logs nothing: "
                         "call self.log('val_loss', loss) in it to get validation results")
        sender.send(ValResult(pipeline=self.name, epoch=loaded.epoch, step=loaded.step, metrics=metrics,
                              latency=time.time() - loaded.handoff, mode=ValidationMode.BACKGROUND, seq=loaded.seq,
                              checksum=checksum))
        self._track_best(sender, metrics, loaded)
        return True

    def _track_best(self, sender: EventSink, metrics: dict[str, float], loaded: Loaded) -> None:
        from ...worker import checkpoint as ckpt
        metric = self.validation.metric
        value = metrics.get(metric)
        if value is None:  # the supervisor says so (supervise/health/metric_watch.py), whichever the mode
            return
        keep_best(self, sender, value,
                  lambda: ckpt.write_atomic(self.pipeline_dir / "checkpoints" / BEST, self._best_state(loaded, value)))

    def _best_state(self, loaded: Loaded, value: float) -> dict[str, Any]:
        """A checkpoint `LitModel.load_from_checkpoint` reads: weights, hyperparameters, version."""
        import lightning

        hparams = dict(self.module.hparams) if self.module.hparams else dict(self.pipe.params)
        return {"state_dict": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
                "hyper_parameters": hparams, "pytorch-lightning_version": lightning.__version__,
                "epoch": loaded.epoch, "global_step": loaded.step,
                "torchherd": {"metric": self.validation.metric, "value": value, "pipeline": self.name,
                              "seq": loaded.seq}}

