"""The worker lifecycle: states, the transitions allowed between them, and a guard.

Imports nothing outside the standard library, so any consumer can read it.
"""
from __future__ import annotations

from enum import Enum


class WorkerState(str, Enum):
    """Where a pipeline's worker is in its life. Final states end the pipeline."""

    QUEUED = "queued"
    """Waiting for a free device slot."""
    STARTING = "starting"
    """Process spawned; it has not reported progress yet."""
    RUNNING = "running"
    """Training."""
    PAUSED = "paused"
    """Holding between steps until resumed."""
    STOPPING = "stopping"
    """Asked to finish its step, checkpoint and exit."""
    KILLING = "killing"
    """Sent SIGTERM to its process group; SIGKILL follows after a grace period."""
    HUNG = "hung"
    """Made no progress for `hang_timeout`; its stack is in its log and it is being killed."""
    BACKOFF = "backoff"
    """Exited unexpectedly; waiting before the next attempt."""
    COMPLETED = "completed"
    """Final: trained to its limits."""
    STOPPED = "stopped"
    """Final: stopped on request, with a checkpoint."""
    EARLY_STOPPED = "early_stopped"
    """Final: its validation's `patience` ran out; a completion, which resuming leaves as it is."""
    PRUNED = "pruned"
    """Final: a sweep's scheduler cut it for a worse metric than its peers; keeps its checkpoints."""
    FAILED = "failed"
    """Final: crashed more often than the restart policy allows."""
    KILLED = "killed"
    """Final: killed on request."""

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def alive(self) -> bool:
        """A process exists (or is being spawned) for this state."""
        return self in _ALIVE


FINAL_STATES = frozenset(
    {WorkerState.COMPLETED, WorkerState.EARLY_STOPPED, WorkerState.PRUNED, WorkerState.STOPPED,
     WorkerState.FAILED, WorkerState.KILLED}
)
# Final states that end a pipeline well: exit status 0, and `torchherd resume` leaves them as they are.
SUCCESS_STATES = frozenset({WorkerState.COMPLETED, WorkerState.EARLY_STOPPED, WorkerState.PRUNED})
_ALIVE = frozenset(
    {WorkerState.STARTING, WorkerState.RUNNING, WorkerState.PAUSED,
     WorkerState.STOPPING, WorkerState.KILLING, WorkerState.HUNG}
)

_S = WorkerState
_DONE_WELL = frozenset({_S.EARLY_STOPPED, _S.PRUNED})  # reached as a stop is, by the stop's intent
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    # QUEUED -> COMPLETED/FAILED/...: a resumed run's pipeline that keeps how it had ended (it had
    # completed, or it is not among those resumed).
    _S.QUEUED: frozenset({_S.STARTING, _S.STOPPED, _S.KILLED, _S.COMPLETED, _S.FAILED}) | _DONE_WELL,
    _S.STARTING: frozenset({_S.RUNNING, _S.PAUSED, _S.STOPPING, _S.KILLING, _S.HUNG, _S.BACKOFF,
                            _S.COMPLETED, _S.STOPPED, _S.FAILED}) | _DONE_WELL,
    _S.RUNNING: frozenset({_S.PAUSED, _S.STOPPING, _S.KILLING, _S.HUNG, _S.BACKOFF,
                           _S.COMPLETED, _S.STOPPED, _S.FAILED}) | _DONE_WELL,
    _S.HUNG: frozenset({_S.KILLING, _S.BACKOFF, _S.FAILED, _S.STOPPED, _S.KILLED, _S.COMPLETED}) | _DONE_WELL,
    # PAUSED -> COMPLETED: the pause reached a worker that had just trained its last step.
    _S.PAUSED: frozenset({_S.RUNNING, _S.STOPPING, _S.KILLING, _S.BACKOFF,
                          _S.STOPPED, _S.FAILED, _S.COMPLETED}) | _DONE_WELL,
    _S.STOPPING: frozenset({_S.KILLING, _S.HUNG, _S.STOPPED, _S.COMPLETED, _S.BACKOFF, _S.FAILED}) | _DONE_WELL,
    _S.KILLING: frozenset({_S.KILLED, _S.STARTING, _S.QUEUED, _S.STOPPED, _S.COMPLETED,
                           _S.FAILED, _S.BACKOFF}) | _DONE_WELL,
    _S.BACKOFF: frozenset({_S.STARTING, _S.STOPPED, _S.KILLED}) | _DONE_WELL,
    # A final state is left only when a person asks to restart the pipeline (or promotes a pruned trial).
    _S.COMPLETED: frozenset({_S.QUEUED}),
    _S.EARLY_STOPPED: frozenset({_S.QUEUED}),
    _S.PRUNED: frozenset({_S.QUEUED}),
    _S.STOPPED: frozenset({_S.QUEUED}),
    _S.FAILED: frozenset({_S.QUEUED}),
    _S.KILLED: frozenset({_S.QUEUED}),
}


# How the engine words the reasons that a final state alone does not tell apart.
EARLY_STOP = "early stopping"  # begins the reason of a pipeline its validation stopped (`patience`)
BEFORE_START = "before it started"  # ends the reason of a pipeline that ended without ever running
EXPLOITING = "takes over "  # begins the reason of a PBT trial stopped to train on from another's checkpoint (pruned)
PAUSED_AT = "paused at rung "  # begins the reason of a sweep's trial waiting at a rung to be promoted (pruned)
YIELDING = "yields its slot "  # begins the reason of a PBT trial queued again behind trials it is ahead of (pruned)


def ended_label(state: WorkerState | str, reason: str = "") -> str:
    """A final state as people read it: 'never ran' is told apart from a stop on request (the state itself
    stays 'stopped' or 'killed' in the records), and 'early_stopped' reads 'early stop' (as does a run
    recorded before that state existed, 'stopped' for early stopping), a trial paused at a rung 'paused at
    rung 2', a PBT trial taking over a checkpoint 'exploiting' or giving up its slot 'yielding'; any other
    state is its own name."""
    value = WorkerState(state).value
    if value in ("stopped", "killed") and reason.endswith(BEFORE_START):
        return "never ran"
    if value == "early_stopped" or (value == "stopped" and reason.startswith(EARLY_STOP)):
        return "early stop"
    if value == "pruned" and reason.startswith(PAUSED_AT):
        return reason.split(":", 1)[0]  # 'paused at rung 2': promoting ASHA may train it on
    if value == "pruned" and reason.startswith(EXPLOITING):
        return "exploiting"  # PBT: it trains on from a better trial's checkpoint
    if value == "pruned" and reason.startswith(YIELDING):
        return "yielding"  # PBT: queued again behind the trials it is ahead of
    return value


class IllegalTransition(RuntimeError):
    """A state change the lifecycle does not allow."""


def check_transition(old: WorkerState, new: WorkerState) -> None:
    """Raise IllegalTransition unless `old -> new` is allowed."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.value} -> {new.value} is not allowed")
