"""The `task` kind: torchherd's own training loop over the `Task` a user's factory returns.

`TaskRunner` is its contract (engine/runners/base.py); the loop is trainer.py, the
factory API api.py, the DDP gang distributed.py, the validator's side scorer.py.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ...protocol.names import PipelineKind
from ..base import Runner, Scorer, cuda_index, error_text, set_up_torch

if TYPE_CHECKING:
    from ...config.schema import Pipeline, ValidationConfig
    from ...protocol.channel import StatusSender
    from ...protocol.spec import WorkerSpec
    from ...worker.control import WorkerControl
    from .api import Task


def factory_traceback(exc: BaseException) -> str:
    """What a TaskError's factory raised, from the factory's own frames: the torchherd frames that called it
    (and the TaskError saying so) tell the person nothing the error line does not."""
    cause = exc.__cause__
    if cause is None:
        return "".join(traceback.format_exception(exc))
    tb = cause.__traceback__
    if tb is not None and tb.tb_next is not None:  # the first frame is torchherd's call of the factory
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(cause), cause, tb))


class TaskRunner(Runner):
    """`task = "file.py:build"`: a factory that returns a torchherd Task (or a LightningTask, then Lightning trains)."""

    kind = PipelineKind.TASK

    def scan(self, pipe: Pipeline) -> str:
        from .scan import scan_ref

        return scan_ref(cast(str, pipe.task_ref or pipe.task))  # a task pipeline names its task (config/load.py)

    def probe_job(self, pipe: Pipeline) -> dict[str, Any] | None:
        return {}

    def probe(self, ref: str, params: dict[str, Any], job: dict[str, Any]) -> tuple[PipelineKind, str]:
        from ..lightning import check_built
        from ..lightning.support import LightningTask, build_factory
        from .api import no_val_data_text

        task = build_factory(ref, params)
        if isinstance(task, LightningTask):  # only building tells: then Lightning's runner trains it
            check_built(task, job["background"])
            return PipelineKind.LIGHTNING, ""
        return PipelineKind.TASK, no_val_data_text(job["background"]) if task.val_data is None else ""

    def run(self, spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
            control: WorkerControl) -> int:
        """Build the user's task and train it with torchherd's own loop (or with Lightning's, when the factory
        returned a torchherd.LightningTask)."""
        from ...protocol.channel import WorkerExit
        from ...protocol.messages import TaskBuilt, WorkerError
        from ...protocol.names import ValidationMode
        from ..lightning import check_built
        from ..lightning.support import LightningTask, build_factory
        from .api import TaskError

        set_up_torch(spec, pipe)
        try:
            task = build_factory(cast(str, pipe.task_ref or pipe.task), pipe.params)
            if spec.hold and isinstance(task, LightningTask):  # what the probe checks of one, checked here
                check_built(task, validation.mode == ValidationMode.BACKGROUND)
        except TaskError as exc:
            print(f"torchherd: {exc}", file=sys.stderr)
            sender.send(WorkerError(pipeline=pipe.name, error=error_text(str(exc)), where="build",
                                    traceback=factory_traceback(exc)))
            return WorkerExit.FATAL
        if spec.hold:  # its build is the run's task check (engine/supervise/build_check.py): no step until all built
            sender.send(TaskBuilt(pipeline=pipe.name))
            if not control.hold():
                return WorkerExit.STOPPED
        if isinstance(task, LightningTask):  # only the factory could tell: the config says "task"
            from ..lightning.runner import run_lightning

            return run_lightning(spec, pipe, validation, sender, control, task=task)
        return self._train(spec, pipe, validation, sender, control, task)

    @staticmethod
    def _train(spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
               control: WorkerControl, task: Task) -> int:
        from ...protocol.messages import Notice
        from ...protocol.names import ValidationMode
        from .api import no_val_data_text
        from .trainer import Trainer

        if task.val_data is None and validation.mode != ValidationMode.OFF and spec.attempt == 1 and spec.rank == 0:
            sender.send(Notice(pipeline=pipe.name, level="info",
                               text=no_val_data_text(validation.mode == ValidationMode.BACKGROUND)))
        gang = None
        if spec.world_size > 1:  # one rank of a gang (DDP or FSDP2): MASTER_ADDR/MASTER_PORT come from the launcher
            import torch

            from .distributed import Gang

            # cuda:LOCAL_RANK among the gang's GPUs, which every rank sees: set_device and DDP's device_ids
            device = torch.device("cuda", cuda_index(spec.device)) if spec.device.startswith("cuda") \
                else torch.device("cpu")
            gang = Gang.join(spec.rank, spec.world_size, device, spec.collective_timeout, pipe.strategy,
                             pipe.shard_group)
        trainer = Trainer(task, pipe, validation, spec.device, Path(spec.pipeline_dir), sender, control,
                          Path(spec.snapshot_dir) if spec.snapshot_dir else None, spec.snapshot_seq, gang=gang)
        # No destroy_process_group at the end: it can wait for ever on rank 0's store once rank 0 has
        # exited, and the child ends with os._exit, which releases the group as well.
        return trainer.run()

    def check(self, pipe: Pipeline, validation_mode: str) -> list[tuple[str, str]]:
        if pipe.shard_group is not None and pipe.elastic:
            return [("shard_group", f"an elastic gang (ranks = {pipe.ranks!r}) may train at any size from "
                                    f"{pipe.min_ranks} to {pipe.max_ranks}, and shard_group must divide each: "
                                    "remove shard_group, or give a whole number of ranks")]
        if pipe.shard_group is None or (pipe.strategy == "fsdp" and pipe.max_ranks % pipe.shard_group == 0):
            return []
        if pipe.strategy != "fsdp":
            return [("shard_group", f"shards a model only with strategy = \"fsdp\" (this pipeline's is "
                                    f"{pipe.strategy!r}): set it, or remove shard_group")]
        return [("shard_group", f"{pipe.shard_group} does not divide ranks = {pipe.max_ranks}: every group must hold "
                                "a whole copy of the model, so ranks must be a multiple of shard_group")]

    def strategy_problem(self, pipe: Pipeline, gpus: bool) -> str:
        if pipe.strategy == "deepspeed":
            return ("strategy 'deepspeed' is Lightning's (a LightningModule's Trainer): a torchherd Task gang trains "
                    "by \"ddp\" or \"fsdp\" (FSDP2, which shards the model as DeepSpeed's ZeRO-3 does)")
        return ""

    def describe(self, pipe: Pipeline) -> str:
        if pipe.max_ranks < 2 or pipe.strategy != "fsdp":
            return super().describe(pipe)
        groups = pipe.max_ranks // pipe.shard_group if pipe.shard_group else 1
        how = f"{groups} copies, each sharded over {pipe.shard_group} ranks (HSDP)" if groups > 1 else "sharded"
        return super().describe(pipe) + (
            f", {pipe.max_ranks} ranks {how} by FSDP2 (fully_shard per layer; checkpoints by torch.distributed."
            "checkpoint, one shard per rank; background validation gathers the whole weights to rank 0's CPU at "
            "each hand-off, every rank taking part)")

    def resumes_from(self, pipe: Pipeline, checkpoints: Path) -> str:
        from .sharded_checkpoint import find_latest, written_by

        path = find_latest(checkpoints) if pipe.strategy == "fsdp" else None
        if path is None:
            return super().resumes_from(pipe, checkpoints)
        wrote = written_by(path)
        return "from its last sharded checkpoint" + (
            f" (written by {wrote} ranks, resharded to {pipe.max_ranks})" if wrote != pipe.max_ranks else "")

    def scorer(self, name: str, directory: Path, device: str) -> Scorer:
        from .scorer import PipelineScorer

        return PipelineScorer(name, directory, device)
