"""The validator's side of a `Task` pipeline (and of a script's `validate` factory): score snapshots with
the task's loss and metrics on its validation data."""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from ...protocol.channel import EventSink
from ...protocol.messages import ValResult
from ...protocol.names import PipelineKind, ValidationMode
from ..scoring import PipelineScoring, keep_best, load_newest, open_pipeline


class PipelineScorer(PipelineScoring):
    """One pipeline as the validator sees it: its model and data, built once, and its best score."""

    def __init__(self, name: str, directory: Path, device: str):
        import torch

        from ...worker.data import make_loader
        from ...worker.precision import autocast
        from .api import build_task, build_validation

        open_pipeline(self, name, directory)
        self.device = torch.device(device)
        self.failed = ""
        if self.pipe.kind == PipelineKind.SCRIPT:  # the script's `validate` factory: model and data, no training parts
            task = build_validation(self.pipe.validate_ref or self.pipe.validate_factory or "", self.pipe.params)
        else:
            task = build_task(self.pipe.task_ref or self.pipe.task or "", self.pipe.params)
        self.task = task
        self.model = task.model.to(self.device)
        self.model.eval()
        self.data = make_loader(task.val_data, self.pipe, self.device, shuffle=False, num_workers=0)[0] \
            if task.val_data is not None else None
        self.autocast = autocast(self.device, self.pipe.precision)

    def score_newest(self, sender: EventSink) -> bool:
        """Validate the newest unseen snapshot, if any; True if one was scored."""
        from ...worker import checkpoint as ckpt
        from ...worker.evaluate import evaluate
        from ...worker.snapshot import weights_checksum

        if self.data is None:
            return False
        loaded = load_newest(self, self.model)
        if loaded is None:
            return False
        checksum = weights_checksum(self.model.state_dict()) if self.validation.checksum else None
        try:
            metrics = evaluate(self.model, self.data, self.task.loss_fn, self.task.metrics_fn, self.device,
                               self.autocast)
        except Exception as exc:
            tb = traceback.format_exc()
            print(tb, file=sys.stderr, flush=True)
            sender.send(ValResult(pipeline=self.name, epoch=loaded.epoch, step=loaded.step, metrics={},
                                  latency=time.time() - loaded.handoff, mode=ValidationMode.BACKGROUND, seq=loaded.seq,
                                  error=f"{type(exc).__name__}: {exc}", traceback=tb))
            return True
        sender.send(ValResult(pipeline=self.name, epoch=loaded.epoch, step=loaded.step, metrics=metrics,
                              latency=time.time() - loaded.handoff, mode=ValidationMode.BACKGROUND, seq=loaded.seq,
                              checksum=checksum))
        value = metrics.get(self.validation.metric)
        if value is None:
            return True
        keep_best(self, sender, value, lambda: ckpt.save_checkpoint(self.pipeline_dir / "checkpoints", {
            "model": self.model.state_dict(), "epoch": loaded.epoch, "step": loaded.step,
            "metric": self.validation.metric, "value": value, "pipeline": self.name}, ckpt.BEST))
        return True
