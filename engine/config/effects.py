"""Pipeline keys that do nothing for a pipeline of some kind, so that sweeping one is refused.

A Lightning pipeline's batches come from its DataModule (or the module's own *_dataloader): a sweep
over `batch_size` trains identical trials; its module compiles itself. A script runs its own loop:
torchherd's loop settings, and an elastic gang's `keep`, are its own business. Sweeping or setting such a
key is a config error that says what to do instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.names import PipelineKind

if TYPE_CHECKING:
    from .schema import Pipeline

LOADER = "the DataModule (or the module's own *_dataloader) makes its batches: {verb} datamodule_params.{key}"
COMPILE_OWN = ("torchherd does not compile a LightningModule: compile its parts in the module itself, e.g. "
               "self.net = torch.compile(net) in its __init__")
OWN_LOOP = "the script runs its own loop: pass the value in args, e.g. \"--{key}\", {example}"
OWN_BATCH = ("torchherd does not size a script's batch: an elastic script is told the WORLD_SIZE it runs at "
             "and keeps its global batch (or not) itself")
NO_EFFECT: dict[PipelineKind, dict[str, str]] = {
    PipelineKind.LIGHTNING: {**{key: LOADER for key in ("batch_size", "num_workers", "pin_memory")},
                             "compile": COMPILE_OWN},
    PipelineKind.SCRIPT: {**{key: OWN_LOOP for key in (
        "precision", "compile", "float32_matmul_precision", "num_workers", "pin_memory", "accumulate_grad_batches",
        "checkpoint_every_n_epochs", "keep_last", "async_checkpoints")}, "keep": OWN_BATCH},
}


def no_effect(pipe: Pipeline, key: str, verb: str = "sweep") -> str | None:
    """Why `key` does nothing for `pipe` (a Pipeline), or None when it applies; `verb`: what the user does with
    the key ("sweep" or "set"). A script's batch_size sizes only its `validate` factory's batches."""
    why = NO_EFFECT.get(pipe.kind, {}).get(key)
    if why is None and key == "batch_size" and pipe.kind == PipelineKind.SCRIPT and not pipe.validate_factory:
        why = OWN_LOOP
    example = f'"{{{key}}}"' if verb == "sweep" else "and its value"  # a placeholder fills only a swept key
    return why.format(key=key, verb=verb, example=example) if why is not None else None
