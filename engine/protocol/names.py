"""The names the engine and the app agree on: pipeline kinds, validation modes, intents and exit reasons.

Each is a `StrEnum`: a member equals its documented string, so the config, the JSON
of the run directory and old runs read back keep the strings they always had.
"""
from __future__ import annotations

from enum import StrEnum


class PipelineKind(StrEnum):
    """Which runner trains a pipeline (one sub-package of `engine/runners/` each)."""

    TASK = "task"  # torchherd's own loop over a `Task` a factory returns
    LIGHTNING = "lightning"  # Lightning's Trainer.fit over a LightningModule
    SCRIPT = "script"  # the user's own training script, run as it is


class ValidationMode(StrEnum):
    """How a pipeline's weights are scored (`[validation] mode`)."""

    AUTO = "auto"  # background where the pipeline can hand off, else inline
    BACKGROUND = "background"  # snapshots scored by the validator process while training goes on
    INLINE = "inline"  # the worker scores its own weights between epochs
    OFF = "off"  # no validation


class Intent(StrEnum):
    """Why the supervisor asked an attempt to end; what it asked wins over the exit code."""

    STOP = "stop"  # a graceful stop: the worker checkpoints and exits
    KILL = "kill"  # killed for good by the person
    RESTART = "restart"  # killed to be started again at once, spending no budget
    HUNG = "hung"  # no heartbeat within hang_timeout: stacks dumped, then killed
    NODE_LEFT = "node left"  # its cluster node left (a launcher's cause, not a request)
    RESIZE = "resize"  # an elastic gang stopped at its checkpoint to start again at another size, spending no budget


class ExitReason(StrEnum):
    """How an attempt ended, as `worker_exited.reason` records it."""

    RESTARTED = "restarted"
    KILLED = "killed"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"  # a deterministic failure (bad task, bad config): not restarted
    RESTART_REQUESTED = "restart requested"
    CRASHED = "crashed"
    HUNG = "hung"


class NoticeTopic(StrEnum):
    """What a notice is about, where the engine or the app acts on it rather than only showing its text."""

    NONE = ""  # for people only
    CHECKPOINT_FAILED = "checkpoint_failed"  # a pipeline's checkpoint could not be written (a full disk?)
    STACKS_ASKED = "stacks_asked"  # a person asked for a pipeline's stacks (the triage reads them)
    RESUMING = "resuming"  # the run carries on from its folder (the app keeps the history before it)
