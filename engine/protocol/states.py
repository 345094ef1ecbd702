"""The worker lifecycle: states, the transitions allowed between them, and a guard.

Imports nothing outside the standard library, so any consumer can read it.
"""
from __future__ import annotations

from enum import StrEnum


class WorkerState(StrEnum):
    """Where a pipeline's worker is in its life. Final states end the pipeline; in a resting state a sweep's trial
    has no process and waits for its policy to queue it again."""

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
    WAITING_AT_RUNG = "waiting_at_rung"
    """Resting: promoting ASHA paused this trial at a rung (checkpointed, its slot freed) until the rung has filled
    enough for it to be promoted (-> QUEUED) or the sweep can go no further (-> PRUNED)."""
    EXPLOITING = "exploiting"
    """Resting: PBT stopped this trial (checkpointed) to take over a better trial's checkpoint; it queues again
    with the copy and its explored values."""
    YIELDING = "yielding"
    """Resting: PBT's trial gave up its slot (checkpointed) to trials behind it; it queues again after them."""
    FAILED = "failed"
    """Final: crashed more often than the restart policy allows."""
    KILLED = "killed"
    """Final: killed on request."""

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def resting(self) -> bool:
        """No process, none coming until a sweep's policy decides: not final, yet nothing to supervise."""
        return self in RESTING_STATES

    @property
    def ended(self) -> bool:
        """Its attempt is over and nothing starts another by itself: final or resting."""
        return self in FINAL_STATES or self in RESTING_STATES

    @property
    def alive(self) -> bool:
        """A process exists (or is being spawned) for this state."""
        return self in _ALIVE


FINAL_STATES = frozenset(
    {WorkerState.COMPLETED, WorkerState.EARLY_STOPPED, WorkerState.PRUNED, WorkerState.STOPPED,
     WorkerState.FAILED, WorkerState.KILLED}
)
# States in which a sweep's trial waits, with no process, for its policy to queue it again (or cut it).
RESTING_STATES = frozenset({WorkerState.WAITING_AT_RUNG, WorkerState.EXPLOITING, WorkerState.YIELDING})
# Final states that end a pipeline well: exit status 0, and `torchherd resume` leaves them as they are.
SUCCESS_STATES = frozenset({WorkerState.COMPLETED, WorkerState.EARLY_STOPPED, WorkerState.PRUNED})
_ALIVE = frozenset(
    {WorkerState.STARTING, WorkerState.RUNNING, WorkerState.PAUSED,
     WorkerState.STOPPING, WorkerState.KILLING, WorkerState.HUNG}
)

_S = WorkerState
_REST = RESTING_STATES
_BY_STOP = frozenset({_S.EARLY_STOPPED, _S.PRUNED}) | _REST  # reached as a stop is, by the stop's intent
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    # QUEUED -> COMPLETED/FAILED/...: a resumed run's pipeline that keeps how it had ended (it had
    # completed, or it is not among those resumed); QUEUED -> a resting state: a resumed trial that waits again.
    _S.QUEUED: frozenset({_S.STARTING, _S.STOPPED, _S.KILLED, _S.COMPLETED, _S.FAILED}) | _BY_STOP,
    _S.STARTING: frozenset({_S.RUNNING, _S.PAUSED, _S.STOPPING, _S.KILLING, _S.HUNG, _S.BACKOFF,
                            _S.COMPLETED, _S.STOPPED, _S.FAILED}) | _BY_STOP,
    _S.RUNNING: frozenset({_S.PAUSED, _S.STOPPING, _S.KILLING, _S.HUNG, _S.BACKOFF,
                           _S.COMPLETED, _S.STOPPED, _S.FAILED}) | _BY_STOP,
    _S.HUNG: frozenset({_S.KILLING, _S.BACKOFF, _S.FAILED, _S.STOPPED, _S.KILLED, _S.COMPLETED}) | _BY_STOP,
    # PAUSED -> COMPLETED: the pause reached a worker that had just trained its last step.
    _S.PAUSED: frozenset({_S.RUNNING, _S.STOPPING, _S.KILLING, _S.BACKOFF,
                          _S.STOPPED, _S.FAILED, _S.COMPLETED}) | _BY_STOP,
    _S.STOPPING: frozenset({_S.KILLING, _S.HUNG, _S.STOPPED, _S.COMPLETED, _S.BACKOFF, _S.FAILED}) | _BY_STOP,
    _S.KILLING: frozenset({_S.KILLED, _S.STARTING, _S.QUEUED, _S.STOPPED, _S.COMPLETED,
                           _S.FAILED, _S.BACKOFF}) | _BY_STOP,
    _S.BACKOFF: frozenset({_S.STARTING, _S.STOPPED, _S.KILLED}) | _BY_STOP,
    # A resting trial queues again when its policy says so (promoted, its copy staged, its turn come), or a
    # person stops or kills it; WAITING_AT_RUNG -> PRUNED: the sweep can go no further and never promoted it.
    _S.WAITING_AT_RUNG: frozenset({_S.QUEUED, _S.PRUNED, _S.STOPPED, _S.KILLED}),
    _S.EXPLOITING: frozenset({_S.QUEUED, _S.STOPPED, _S.KILLED}),
    _S.YIELDING: frozenset({_S.QUEUED, _S.STOPPED, _S.KILLED}),
    # A final state is left only when a person asks to restart the pipeline (or promotes a pruned trial).
    _S.COMPLETED: frozenset({_S.QUEUED}),
    _S.EARLY_STOPPED: frozenset({_S.QUEUED}),
    _S.PRUNED: frozenset({_S.QUEUED}),
    _S.STOPPED: frozenset({_S.QUEUED}),
    _S.FAILED: frozenset({_S.QUEUED}),
    _S.KILLED: frozenset({_S.QUEUED}),
}


def ended_label(state: WorkerState | str, rung: float | None = None, never_ran: bool = False) -> str:
    """A state as people read it: 'never ran' for a stop or kill before any attempt ran (the state itself stays
    'stopped' or 'killed'), 'early stop', 'waiting at rung 2' (`rung`: where it waits), 'exploiting',
    'yielding'; any other state is its own name (one this version does not know, from a newer or a damaged
    file, too: 'unknown' when it is empty)."""
    try:
        value = WorkerState(state)
    except ValueError:
        return str(state) or "unknown"
    if value in (_S.STOPPED, _S.KILLED) and never_ran:
        return "never ran"
    if value == _S.EARLY_STOPPED:
        return "early stop"
    if value == _S.WAITING_AT_RUNG:
        return f"waiting at rung {rung:g}" if rung is not None else "waiting at a rung"
    return value.value


class IllegalTransition(RuntimeError):
    """A state change the lifecycle does not allow."""


def check_transition(old: WorkerState, new: WorkerState) -> None:
    """Raise IllegalTransition unless `old -> new` is allowed."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.value} -> {new.value} is not allowed")
