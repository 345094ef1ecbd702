"""The `lightning` kind: Lightning's own `Trainer.fit` over a LightningModule, with a torchherd callback.

`LightningRunner` is its contract (engine/runners/base.py); the attempt and its
callback are runner.py, building modules support.py, the validator's side scorer.py.
Lightning itself is imported only when one of these parts runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...protocol.names import PipelineKind
from ..base import Runner, Scorer, set_up_torch


def check_built(task: Any, background: bool) -> None:
    """What a built LightningTask allows, checked in the probe (no data, no Trainer): in the background, no
    callback or scheduler may watch a validation metric the worker never computes."""
    from ..task.api import TaskError
    from .support import monitors_problem, val_monitors

    if background:
        found = val_monitors(task)
        if found:
            raise TaskError(monitors_problem(found))


class LightningRunner(Runner):
    """`task = "lightning:module.py:LitModel"`: the module (and its DataModule) trained by Trainer.fit."""

    kind = PipelineKind.LIGHTNING
    checkpoint_suffix = ".ckpt"  # Lightning's own checkpoints: LitModel.load_from_checkpoint reads them
    gang_problem = ("Lightning pipelines run on one device for now: set ranks = 1, or train the module with a "
                    "DDP script of your own as `script` with ranks")
    plan_note = " (Lightning Trainer.fit)"

    def probe_job(self, pipe) -> dict[str, Any] | None:
        return {"datamodule": pipe.datamodule, "datamodule_params": pipe.datamodule_params}

    def probe(self, ref: str, params: dict[str, Any], job: dict[str, Any]) -> PipelineKind:
        from .support import build_lightning

        task = build_lightning(ref, params, job["datamodule"], job["datamodule_params"])
        check_built(task, job["background"])
        return PipelineKind.LIGHTNING

    def run(self, spec, pipe, validation, sender, control) -> int:
        set_up_torch(spec, pipe)
        from .runner import run_lightning

        return run_lightning(spec, pipe, validation, sender, control)

    def scorer(self, name: str, directory: Path, device: str) -> Scorer:
        from .scorer import LightningScorer

        return LightningScorer(name, directory, device)

