"""A pipeline's worker: read its settings, ask the registry for the runner of the pipeline's kind, run it.

Every runner shares the same control (`WorkerControl`), data loading, precision,
checkpoints and hand-off, and reports the same events. Any exception is reported
with its traceback before the worker exits non-zero.
"""
from __future__ import annotations

import sys
import traceback

from ..protocol.channel import ControlReceiver, StatusSender, SupervisorGone, WorkerExit
from ..protocol.messages import WorkerError
from ..protocol.spec import WorkerSpec
from .base import error_text
from .registry import runner_for


def run(spec: WorkerSpec, sender: StatusSender, receiver: ControlReceiver) -> int:
    """Train one attempt of a pipeline; returns the worker's exit code."""
    name = spec.name
    where = "build"
    control = None
    try:
        from ..config.schema import Pipeline, ValidationConfig
        from ..worker.control import WorkerControl

        pipe = Pipeline.model_validate(spec.pipeline)
        validation = ValidationConfig.model_validate(spec.validation)
        control = WorkerControl(name, sender, receiver, pipe.nan_policy)
        where = "train"
        return runner_for(pipe.kind).run(spec, pipe, validation, sender, control)
    except SupervisorGone:
        raise
    except BaseException as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        error = str(exc) if str(exc).startswith("CUDA out of memory") else error_text(f"{type(exc).__name__}: {exc}")
        sender.send(WorkerError(pipeline=name, error=error, traceback=tb, where=where,
                                step=control.step if control is not None else -1))
        return WorkerExit.ERROR
