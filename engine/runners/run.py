"""A pipeline's worker: set up torch for its slot, pick the runner for the pipeline's kind, and run it.

A runner decides how training runs (today the `Task` trainer); every runner shares
the same control (`WorkerControl`), data loading, precision and checkpoints, and
reports the same events. Any exception is reported with its traceback before the
worker exits non-zero.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Callable

from ..protocol.channel import EXIT_ERROR, EXIT_FATAL, ControlReceiver, StatusSender, SupervisorGone
from ..protocol.messages import WorkerError
from .script.runner import run_script
from ..protocol.spec import WorkerSpec


def set_up_torch(spec: WorkerSpec, pipe) -> None:
    """Threads, matmul precision, seed and memory cap for this slot: for the runners that train in this
    process (a script's own process sets itself up, and a script worker never imports torch)."""
    import torch

    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    torch.set_float32_matmul_precision(pipe.float32_matmul_precision)
    torch.manual_seed(pipe.seed)
    if spec.device.startswith("cuda") and pipe.gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(pipe.gpu_memory_fraction, 0)


def run_task(spec: WorkerSpec, pipe, validation, sender: StatusSender, control) -> int:
    """The `Task` runner: build the user's task and train it with torchherd's own loop (or with
    Lightning's, when the factory returned a torchherd.LightningTask)."""
    set_up_torch(spec, pipe)
    from .lightning.support import LightningTask, build_factory
    from .task.api import TaskError
    from .task.trainer import Trainer

    try:
        task = build_factory(pipe.task_ref or pipe.task, pipe.params)
    except TaskError as exc:
        print(f"torchherd: {exc}", file=sys.stderr)
        sender.send(WorkerError(pipeline=pipe.name, error=str(exc), where="build", traceback=traceback.format_exc()))
        return EXIT_FATAL
    if isinstance(task, LightningTask):  # only the factory could tell: the config says "task"
        if spec.world_size > 1:
            error = (f"{pipe.task}: the factory returned a LightningTask, and Lightning pipelines run on one "
                     "device for now: set ranks = 1")
            print(f"torchherd: {error}", file=sys.stderr)
            sender.send(WorkerError(pipeline=pipe.name, error=error, where="build"))
            return EXIT_FATAL
        from .lightning.runner import run_lightning as run

        return run(spec, pipe, validation, sender, control, task=task)
    gang = None
    if spec.world_size > 1:  # one rank of a DDP gang: MASTER_ADDR/MASTER_PORT come from the launcher
        import torch

        from .task.distributed import Gang

        device = torch.device("cuda", 0) if spec.device.startswith("cuda") else torch.device("cpu")
        gang = Gang.join(spec.rank, spec.world_size, device, spec.collective_timeout)
    trainer = Trainer(task, pipe, validation, spec.device, Path(spec.pipeline_dir), sender, control,
                      Path(spec.snapshot_dir) if spec.snapshot_dir else None, spec.snapshot_seq, gang=gang)
    # No destroy_process_group at the end: it can wait for ever on rank 0's store once rank 0 has
    # exited, and the child ends with os._exit, which releases the group as well.
    return trainer.run()


def run_lightning(spec: WorkerSpec, pipe, validation, sender: StatusSender, control) -> int:
    """The Lightning runner: Lightning's own Trainer.fit with a torchherd callback."""
    set_up_torch(spec, pipe)
    from .lightning.runner import run_lightning as run

    return run(spec, pipe, validation, sender, control)


RUNNERS: dict[str, Callable[..., int]] = {"task": run_task, "lightning": run_lightning,
                                         "script": run_script}  # by the pipeline's kind


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
        return RUNNERS[pipe.kind](spec, pipe, validation, sender, control)
    except SupervisorGone:
        raise
    except BaseException as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        error = f"{type(exc).__name__}: {exc}"
        if "out of memory" in str(exc).lower():  # torch.cuda.OutOfMemoryError, or a RuntimeError saying so
            error = str(exc) if str(exc).startswith("CUDA out of memory") else f"CUDA out of memory: {exc}"
        sender.send(WorkerError(pipeline=name, error=error, traceback=tb, where=where,
                                step=control.step if control is not None else -1))
        return EXIT_ERROR
