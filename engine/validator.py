"""The validation process: scores weight snapshots while workers train.

One long-lived process for the whole run. It finds each pipeline's snapshot
folder (a worker writes `meta.json` there when it first hands off), builds that
pipeline's task once, and then validates the newest snapshot each time one
appears, keeping the best checkpoint and asking for early stops.
"""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from torchherd.engine.channel import ControlReceiver, StatusSender
from torchherd.engine.messages import EarlyStop, Notice, Stop, ValResult
from torchherd.engine.progress import better
from torchherd.engine.spec import ValidatorSpec

POLL = 0.02  # seconds between looks for new snapshots when idle


def open_pipeline(scorer: Any, name: str, directory: Path) -> None:
    """What every scorer reads from a pipeline's snapshot folder: its reader, the pipeline and validation
    settings the worker wrote there, its run folder, and the best score so far."""
    from torchherd.engine.config import Pipeline, ValidationConfig
    from torchherd.engine.snapshot import SnapshotReader

    scorer.name = name
    scorer.reader = SnapshotReader(directory)
    meta = scorer.reader.meta
    scorer.pipe = Pipeline.model_validate(meta["pipeline"])
    scorer.validation = ValidationConfig.model_validate(meta["validation"])
    scorer.pipeline_dir = Path(meta["pipeline_dir"])
    scorer.last_seq = 0
    scorer.best = meta.get("best")
    scorer.since_best = 0


class PipelineScorer:
    """One pipeline as the validator sees it: its model and data, built once, and its best score."""

    def __init__(self, name: str, directory: Path, device: str):
        import torch

        from torchherd.engine.data import make_loader
        from torchherd.engine.precision import autocast
        from torchherd.engine.task import build_task

        open_pipeline(self, name, directory)
        self.device = torch.device(device)
        self.failed = ""
        if self.pipe.kind == "script":  # the script's `validate` factory: model and data, no training parts
            from torchherd.engine.script_validation import build_validation

            task = build_validation(self.pipe.validate_ref or self.pipe.validate_factory, self.pipe.params)
        else:
            task = build_task(self.pipe.task_ref or self.pipe.task, self.pipe.params)
        self.task = task
        self.model = task.model.to(self.device)
        self.model.eval()
        self.data = make_loader(task.val_data, self.pipe, self.device, shuffle=False, num_workers=0)[0] \
            if task.val_data is not None else None
        self.autocast = autocast(self.device, self.pipe.precision)

    def score_newest(self, sender: StatusSender) -> bool:
        """Validate the newest unseen snapshot, if any; True if one was scored."""
        from torchherd.engine import checkpoint as ckpt
        from torchherd.engine.evaluate import evaluate
        from torchherd.engine.snapshot import weights_checksum

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
                                  latency=time.time() - loaded.handoff, mode="background", seq=loaded.seq,
                                  error=f"{type(exc).__name__}: {exc}", traceback=tb))
            return True
        sender.send(ValResult(pipeline=self.name, epoch=loaded.epoch, step=loaded.step, metrics=metrics,
                              latency=time.time() - loaded.handoff, mode="background", seq=loaded.seq,
                              checksum=checksum))
        value = metrics.get(self.validation.metric)
        if value is None:
            return True
        keep_best(self, sender, value, lambda: ckpt.save_checkpoint(self.pipeline_dir / "checkpoints", {
            "model": self.model.state_dict(), "epoch": loaded.epoch, "step": loaded.step,
            "metric": self.validation.metric, "value": value, "pipeline": self.name}, ckpt.BEST))
        return True


def load_newest(scorer: Any, model: Any) -> Any:
    """The snapshot a scorer takes next (the newest unseen, or the oldest under policy 'all') loaded into
    `model`, or None; it becomes the scorer's `last_seq`. Shared by every kind of scorer."""
    for _ in range(5):  # a torn read means a newer snapshot just landed: take that one
        found = scorer.reader.newest(after=scorer.last_seq, oldest=scorer.validation.policy == "all")
        if found is None:
            return None
        loaded = scorer.reader.load_into(model, found[0])
        if loaded is not None:
            scorer.last_seq = loaded.seq
            return loaded
    return None


def keep_best(scorer: Any, sender: StatusSender, value: float, save: Callable[[], Any]) -> None:
    """One result against the scorer's best: a better one is saved with `save()` (a checkpoint write),
    `patience` results in a row that are not ask for an early stop."""
    from torchherd.engine import checkpoint as ckpt

    v = scorer.validation
    if better(value, scorer.best, v.metric_mode):
        scorer.best, scorer.since_best = value, 0
        try:
            save()
        except ckpt.CheckpointError as exc:
            sender.send(Notice(pipeline=scorer.name, level="error", text=f"best checkpoint failed: {exc}"))
        return
    scorer.since_best += 1
    if v.patience is not None and scorer.since_best >= v.patience:
        sender.send(EarlyStop(pipeline=scorer.name, reason=(
            f"early stopping: {v.metric} did not improve on {scorer.best:.6g} in {v.patience} validations")))
        scorer.since_best = 0


def make_scorer(name: str, directory: Path, device: str):
    """The scorer for the pipeline whose snapshots are in `directory`: a Task's (or a script's `validate`
    factory's), or a Lightning module's."""
    import json

    meta = json.loads((directory / "meta.json").read_text())
    task = meta["pipeline"].get("task") or ""  # None for a script
    # A factory's LightningTask has no "lightning:" prefix: its worker says which runner wrote the snapshots.
    if task.startswith("lightning:") or meta.get("runner") == "lightning":
        from torchherd.engine.lightning_scorer import LightningScorer

        return LightningScorer(name, directory, device)
    return PipelineScorer(name, directory, device)


def serve(spec: ValidatorSpec, sender: StatusSender, control: ControlReceiver) -> int:
    """Score snapshots until the supervisor says stop; returns the exit code."""
    import torch

    root = Path(spec.snapshot_root)
    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    scorers: dict[str, Any] = {}  # PipelineScorer or LightningScorer
    broken: set[str] = set()
    while True:
        for cmd in control.poll(0.0):
            if isinstance(cmd, Stop):
                return 0
        if root.is_dir():
            for meta in root.glob("*/meta.json"):
                name = meta.parent.name
                if name in scorers or name in broken:
                    continue
                try:
                    scorers[name] = make_scorer(name, meta.parent, spec.device)
                except Exception as exc:
                    broken.add(name)
                    tb = traceback.format_exc()
                    print(tb, file=sys.stderr, flush=True)
                    sender.send(ValResult(pipeline=name, epoch=-1, step=-1, metrics={}, mode="background",
                                          error=f"building the validation task failed: {type(exc).__name__}: {exc}",
                                          traceback=tb))
        worked = False
        # Oldest result first, so one busy pipeline cannot starve the others.
        for scorer in sorted(scorers.values(), key=lambda s: s.last_seq):
            worked |= scorer.score_newest(sender)
        if not worked:
            for cmd in control.poll(POLL):
                if isinstance(cmd, Stop):
                    return 0
