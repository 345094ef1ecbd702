"""What a person can ask of one pipeline from the dashboard, as frozen dataclasses, and when it cannot apply.

The dashboard builds a command, asks `refusal` whether the pipeline's state allows it (so a key
that would do nothing says why instead), and posts it; the bridge carries it out. The states each
command acts in are the supervisor's: `Supervisor.pause` ignores anything but STARTING or RUNNING,
and so on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engine.protocol.states import RESTING_STATES, WorkerState
from .steering import ScriptSteering

S = WorkerState


@dataclass(frozen=True)
class PipelineCommand:
    """Base of every command: the pipeline it is for."""

    pipeline: str
    acts_in: ClassVar[frozenset[WorkerState]] = frozenset()
    cannot: ClassVar[str] = ""  # what the refusal says it cannot be

    def doing(self, script: ScriptSteering | None = None) -> str:
        """A short line saying what is happening, for a notification; `script`: how the pipeline's script can
        be steered, where it is a script (what it cannot do without torchherd.client is said, not promised)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Kill(PipelineCommand):
    """SIGTERM to its processes, SIGKILL after the grace period; a queued one leaves the queue."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset(
        {S.QUEUED, S.BACKOFF, S.STARTING, S.RUNNING, S.PAUSED, S.STOPPING, S.KILLING, S.HUNG} | RESTING_STATES)
    cannot: ClassVar[str] = "killed"

    def doing(self, script: ScriptSteering | None = None) -> str:
        return f"killing {self.pipeline}"


@dataclass(frozen=True)
class Restart(PipelineCommand):
    """Kill the worker and start it again from its last checkpoint; a final one goes back to the queue."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset(set(S) - {S.QUEUED})
    cannot: ClassVar[str] = "restarted"

    def doing(self, script: ScriptSteering | None = None) -> str:
        return f"restarting {self.pipeline} from its last checkpoint"


@dataclass(frozen=True)
class Pause(PipelineCommand):
    """Hold before the next step."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset({S.STARTING, S.RUNNING})
    cannot: ClassVar[str] = "paused"

    def doing(self, script: ScriptSteering | None = None) -> str:
        if script is not None and not script.client:
            return f"pausing {self.pipeline}: its script's processes are frozen (SIGSTOP) where they are"
        return f"pausing {self.pipeline}"


@dataclass(frozen=True)
class Unpause(PipelineCommand):
    """Carry on after a pause."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset({S.PAUSED})
    cannot: ClassVar[str] = "unpaused"

    def doing(self, script: ScriptSteering | None = None) -> str:
        return f"unpausing {self.pipeline}"


@dataclass(frozen=True)
class Stop(PipelineCommand):
    """Finish the step, checkpoint and exit; a queued one leaves the queue."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset(
        {S.QUEUED, S.BACKOFF, S.STARTING, S.RUNNING, S.PAUSED, S.KILLING, S.HUNG} | RESTING_STATES)
    cannot: ClassVar[str] = "stopped"

    def doing(self, script: ScriptSteering | None = None) -> str:
        if script is None or script.client:
            return f"stopping {self.pipeline}: it checkpoints, then exits"
        if script.stop_mode == "after_checkpoint":
            return (f"stopping {self.pipeline}: its script gets {script.stop_signal} after its next save; "
                    "the moment after that save is lost")
        return (f"stopping {self.pipeline}: its script gets {script.stop_signal} now; what it trained since its "
                f"last save is lost unless it saves on {script.stop_signal}")


@dataclass(frozen=True)
class Checkpoint(PipelineCommand):
    """Write a checkpoint after the current step."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset({S.STARTING, S.RUNNING, S.PAUSED})
    cannot: ClassVar[str] = "checkpointed"

    def doing(self, script: ScriptSteering | None = None) -> str:
        if script is not None and not script.client:
            return (f"{self.pipeline} cannot checkpoint on request: its script does not use torchherd.client "
                    "(it saves when it saves)")
        return f"{self.pipeline} writes a checkpoint after its current step"


@dataclass(frozen=True)
class Stacks(PipelineCommand):
    """Every process of the pipeline writes its Python stacks to its log (for one that makes no step)."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset({S.STARTING, S.RUNNING, S.PAUSED, S.STOPPING, S.HUNG})
    cannot: ClassVar[str] = "asked for its stacks"

    def doing(self, script: ScriptSteering | None = None) -> str:
        return f"{self.pipeline}'s processes write their Python stacks to its log (l shows it)"


@dataclass(frozen=True)
class Promote(PipelineCommand):
    """A sweep's trial is never pruned again this session; a pruned one trains on from its checkpoint."""

    acts_in: ClassVar[frozenset[WorkerState]] = frozenset(
        {S.PRUNED, S.WAITING_AT_RUNG, S.QUEUED, S.BACKOFF, S.STARTING, S.RUNNING, S.PAUSED})
    cannot: ClassVar[str] = "promoted"

    def doing(self, script: ScriptSteering | None = None) -> str:
        return f"promoting {self.pipeline}: it trains on and is never pruned again"


def refusal(command: PipelineCommand, state: WorkerState) -> str | None:
    """Why `command` would do nothing to a pipeline in `state`, or None when it applies."""
    if state in command.acts_in:
        return None
    name = command.pipeline
    if state.final:
        hint = "; r starts it again" if not isinstance(command, Restart) else ""
        if isinstance(command, Promote):
            return f"{name} is {state.value}, not pruned: it cannot be promoted{hint}"
        return f"{name} is {state.value}: it cannot be {command.cannot}{hint}"
    if state == S.QUEUED:
        return f"{name} is queued, waiting for a free device: it cannot be {command.cannot} before it starts"
    if isinstance(command, Unpause):
        return f"{name} is {state.value}, not paused: nothing to unpause"
    return f"{name} is {state.value}: it cannot be {command.cannot} now"
