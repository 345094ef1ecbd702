"""The runner contract: everything a pipeline kind provides, from `torchherd check` to the validator.

A kind is one sub-package of engine/runners/ whose `__init__.py` defines a `Runner`
subclass, named by one line of engine/runners/registry.py. The contract module imports
neither torch nor user code: each part imports what it needs when it is called.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..protocol.names import PipelineKind

if TYPE_CHECKING:
    from ..config.schema import Pipeline, ValidationConfig
    from ..protocol.channel import EventSink, StatusSender
    from ..protocol.spec import WorkerSpec
    from ..worker.control import WorkerControl


def error_text(text: str) -> str:
    """An error as the table, the log and a restart's reason say it: led by "CUDA out of memory" when that is
    what it is (torch.cuda.OutOfMemoryError, a RuntimeError saying so, or either inside a factory's error)."""
    if "out of memory" in text.lower() and not text.startswith("CUDA out of memory"):
        return f"CUDA out of memory: {text}"
    return text


class Scorer(Protocol):
    """One pipeline as the validator scores it (engine/runners/scoring.py has what scorers share)."""

    last_seq: int  # the newest snapshot scored: the validator serves the pipeline with the oldest first

    def score_newest(self, sender: EventSink) -> bool:
        """Score the snapshot due next, if one is waiting; True if one was scored."""


class Runner(ABC):
    """What a pipeline kind must provide (`kind`, `run`) and may provide (the rest, with their defaults).

    The supervisor's process asks `scan`, `check`, `describe` and `gang_problem` (cheap: no
    import of user code); the probe process asks `probe_job` and `probe`; the worker calls
    `run`; the validator asks `scorer`. Instances hold no state: the registry makes one per ask.
    """

    kind: ClassVar[PipelineKind]
    checkpoint_suffix: ClassVar[str] = ".pt"  # of `last`, `prev` and `best` in the pipeline's checkpoints/
    gang_problem: ClassVar[str] = ""  # why this kind cannot train as a DDP gang (ranks > 1); "" when it can
    plan_note: ClassVar[str] = ""  # said after the task in `torchherd check`'s plan, e.g. " (Lightning ...)"

    def scored_in_background(self, pipe: Pipeline) -> bool:
        """Whether background validation has anything of this pipeline's to score, so a validator process is
        worth starting for it (default: yes; a script only with a `validate` factory)."""
        return True

    # ------------------------------------------------------------ torchherd check (no user code runs)

    def scan(self, pipe: Pipeline) -> str:
        """What is wrong with the factory the config names, read without importing it; "" when nothing is
        (default: nothing to read). Reported at `pipelines[i].task`, or once at `defaults.task`."""
        return ""

    def check(self, pipe: Pipeline, validation_mode: str) -> list[tuple[str, str]]:
        """Problems of the pipeline once the config is otherwise sound, as (its key under `pipelines[i]`,
        message); `validation_mode` is the resolved one. Default: none."""
        return []

    def strategy_problem(self, pipe: Pipeline, gpus: bool) -> str:
        """Why this kind cannot train `pipe`'s gang (ranks > 1) by its `strategy` on this run's slots (`gpus`:
        whether any is a GPU); "" when it can (the default: a kind that reads no strategy ignores it)."""
        return ""

    def elastic_problem(self, pipe: Pipeline) -> str:
        """Why `pipe`'s gang cannot change size between attempts (ranks = "MIN:MAX"); "" when it can (the
        default)."""
        return ""

    def describe(self, pipe: Pipeline) -> str:
        """What the pipeline trains, for the plan `torchherd check` prints (default: the task, its limits
        and precision: 'task tasks/mlp.py:build, 5 epochs, precision 32')."""
        datamodule = f", datamodule {pipe.datamodule}" if pipe.datamodule else ""
        limits = f"{pipe.max_epochs} epochs" + (f", max {pipe.max_steps} steps" if pipe.max_steps else "") + \
            (f", max {pipe.max_time:g}s" if pipe.max_time else "")
        return f"task {pipe.task}{datamodule}{self.plan_note}, {limits}, precision {pipe.precision}"

    # ------------------------------------------------------------ the probe (`check --probe`, a fresh process)

    def probe_job(self, pipe: Pipeline) -> dict[str, Any] | None:
        """What the probe must know, beyond the task and its params, to build the pipeline (JSON-able); None
        when there is nothing to build (the default)."""
        return None

    def probe(self, ref: str, params: dict[str, Any], job: dict[str, Any]) -> tuple[PipelineKind, str]:
        """Build the pipeline in the probe process, raising what building raises; returns the kind whose runner
        would train what was built (a task factory may return a LightningTask) and a note `check --probe` says of
        it ("" for none). Called only when `probe_job` said there is something to build."""
        raise NotImplementedError(f"{self.kind} pipelines have nothing to build")

    # ------------------------------------------------------------ the worker

    @abstractmethod
    def run(self, spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
            control: WorkerControl) -> int:
        """Train one attempt in this worker process; returns its exit code (protocol/channel.py). It reports the
        events every runner reports, obeys `control` between steps, checkpoints atomically and, with background
        validation, hands snapshots off (engine/worker/: control, reporting, handoff, checkpoint)."""

    # ------------------------------------------------------------ the validator

    def scorer(self, name: str, directory: Path, device: str) -> Scorer:
        """The validator's scorer for the pipeline whose snapshots are in `directory` (its meta.json names this
        kind as its "runner"). Default: none; a kind that never hands off never gets asked."""
        raise NotImplementedError(f"{self.kind} pipelines hand no snapshots to the validator")

    # ------------------------------------------------------------ checkpoints

    @classmethod
    def checkpoint_name(cls, which: str) -> str:
        """The file name of the pipeline's `which` checkpoint ("last", "prev" or "best")."""
        return f"{which}{cls.checkpoint_suffix}"

    def resumes_from(self, pipe: Pipeline, checkpoints: Path) -> str:
        """Where its next attempt starts given its `checkpoints` folder, for the resume plan people read
        ("from its last checkpoint"). Default: from `last` or `prev` when one of them is there."""
        if any((checkpoints / self.checkpoint_name(w)).exists() for w in ("last", "prev")):
            return "from its last checkpoint"
        return "from scratch (no checkpoint yet)"


def set_up_torch(spec: WorkerSpec, pipe: Pipeline) -> None:
    """Threads, matmul precision, seed and memory cap for this slot: for the runners that train in the worker's
    own process (a script's process sets itself up, and a script worker never imports torch)."""
    import torch

    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    torch.set_float32_matmul_precision(pipe.float32_matmul_precision)
    torch.manual_seed(pipe.seed)
    if spec.device.startswith("cuda"):
        # A gang's rank sees every GPU of its gang: its own is cuda:LOCAL_RANK, current from here on (so its
        # CUDA context and memory cap land there, never on rank 0's GPU).
        index = cuda_index(spec.device)
        torch.cuda.set_device(index)
        if pipe.gpu_memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(pipe.gpu_memory_fraction, index)


def cuda_index(device: str) -> int:
    """The index of a worker's own GPU among those it sees: "cuda:1" -> 1; "cuda" (one GPU seen) -> 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0
