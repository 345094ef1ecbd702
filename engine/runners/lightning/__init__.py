"""The `lightning` kind: Lightning's own `Trainer.fit` over a LightningModule, with a torchherd callback.

`LightningRunner` is its contract (engine/runners/base.py); the attempt and its
callback are runner.py, building modules support.py, the validator's side scorer.py.
Lightning itself is imported only when one of these parts runs.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...protocol.names import PipelineKind, ValidationMode
from ..base import Runner, Scorer, set_up_torch

if TYPE_CHECKING:
    from ...config.schema import Pipeline, ValidationConfig
    from ...protocol.channel import StatusSender
    from ...protocol.spec import WorkerSpec
    from ...worker.control import WorkerControl
    from .support import LightningTask

FSDP_ON_CPU = ("strategy 'fsdp' needs GPUs for a Lightning module (Lightning's FSDPStrategy refuses "
               "accelerator='cpu'): on CPU use strategy = \"ddp\" (gloo), or a torchherd Task, whose fsdp runs on CPU")
DEEPSPEED_ON_CPU = ("strategy 'deepspeed' needs CUDA GPUs (DeepSpeed trains on CUDA devices only) and this run "
                    "has CPU slots only: use strategy = \"ddp\" (gloo)")
DEEPSPEED_MISSING = "strategy 'deepspeed' needs the deepspeed package, not installed here: pip install deepspeed"
FSDP_BACKGROUND = ("strategy 'fsdp' with background validation is not supported yet (the validator needs the "
                   "whole module, which FSDP shards): set [validation] mode = \"inline\" or \"off\", or "
                   "strategy = \"ddp\"")


def check_built(task: LightningTask, background: bool) -> None:
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
    plan_note = " (Lightning Trainer.fit)"

    def elastic_problem(self, pipe: Pipeline) -> str:
        return ("an elastic gang ('MIN:MAX') resumes at another size from its checkpoint, and Lightning's Trainer "
                "restores its loops and DDP state only at the world size that wrote them (its data position and "
                "global batch would silently change): give a whole number of ranks")

    def check(self, pipe: Pipeline, validation_mode: str) -> list[tuple[str, str]]:
        """FSDP shards the weights over the gang: only rank 0's whole module can be handed off, which FSDP
        would have to gather on every hand-off step; not done yet."""
        if pipe.max_ranks > 1 and pipe.strategy in ("fsdp", "deepspeed") and \
                validation_mode == ValidationMode.BACKGROUND:
            return [("strategy", FSDP_BACKGROUND.replace("'fsdp'", f"'{pipe.strategy}'").replace(
                "which FSDP shards", "which it shards"))]
        return []

    def strategy_problem(self, pipe: Pipeline, gpus: bool) -> str:
        if pipe.strategy == "deepspeed":
            import importlib.util

            return DEEPSPEED_ON_CPU if not gpus else "" if importlib.util.find_spec("deepspeed") else DEEPSPEED_MISSING
        return FSDP_ON_CPU if pipe.strategy == "fsdp" and not gpus else ""

    def describe(self, pipe: Pipeline) -> str:
        gang = f", {pipe.max_ranks} ranks by Lightning's {pipe.strategy!r} strategy" if pipe.max_ranks > 1 else ""
        return super().describe(pipe) + gang

    def probe_job(self, pipe: Pipeline) -> dict[str, Any] | None:
        return {"datamodule": pipe.datamodule, "datamodule_params": pipe.datamodule_params}

    def probe(self, ref: str, params: dict[str, Any], job: dict[str, Any]) -> tuple[PipelineKind, str]:
        from .support import build_lightning

        task = build_lightning(ref, params, job["datamodule"], job["datamodule_params"])
        check_built(task, job["background"])
        return PipelineKind.LIGHTNING, ""

    def run(self, spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
            control: WorkerControl) -> int:
        set_up_torch(spec, pipe)
        from .runner import run_lightning

        return run_lightning(spec, pipe, validation, sender, control)

    def scorer(self, name: str, directory: Path, device: str) -> Scorer:
        from .scorer import LightningScorer

        return LightningScorer(name, directory, device)

