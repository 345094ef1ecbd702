"""What a worker's batch of events does in its session, in the order it was sent: the step reports, the bulk of
it, are published a run at a time (`Publisher.steps`); every other event on its own moves the pipeline's state,
hands a snapshot to validation or stops an early-stopped pipeline, and is published."""
from __future__ import annotations

from collections.abc import Callable

from ..launch.backend import Handle
from ..protocol.health import RankPace
from ..protocol.messages import EarlyStop, Event, Heartbeat, SnapshotTaken, TrainingStarted, WorkerError
from ..protocol.states import WorkerState
from .bus import Publisher, step_runs
from .lifecycle import States
from .pipeline import SupervisedPipeline
from .validation_service import ValidationService


class WorkerIntake:
    """Takes each batch a worker's handle delivers (`take`, which the lifecycle calls)."""

    def __init__(self, *, states: States, publish: Publisher, validation: ValidationService,
                 early_stop: Callable[[str, EarlyStop], None]):
        self._states, self._publish, self._validation = states, publish, validation
        self._early_stop = early_stop

    def take(self, pipe: SupervisedPipeline, handle: Handle, events: list[Event]) -> None:
        if pipe.handle is not handle:
            return  # a late batch from an attempt already reaped
        self._states.heard(pipe)
        for steps, event in step_runs(events):  # the step reports in bulk, each other event on its own, in order
            if steps:
                pipe.live.saw_steps(steps)
                self._publish.steps(pipe, steps)
            if event is not None:
                self._one(pipe, event)

    def _one(self, pipe: SupervisedPipeline, event: Event) -> None:
        pipe.live.saw(event)
        if isinstance(event, Heartbeat):
            return  # only proves progress; not worth a line anywhere
        if isinstance(event, RankPace):  # a gang's rank's own pace: for screens and the straggler rule, not kept
            self._publish.transient(event)
            return
        if isinstance(event, SnapshotTaken):
            for out in self._validation.on_snapshot(pipe.name, event):
                self._publish.event(out)
            return
        if isinstance(event, EarlyStop):  # inline validation's patience ran out
            self._early_stop(pipe.name, event)
            return
        if isinstance(event, TrainingStarted) and pipe.state == WorkerState.STARTING:
            self._states.set_state(pipe, WorkerState.RUNNING)  # STARTING -> RUNNING
        elif isinstance(event, WorkerError):
            pipe.last_error, pipe.last_traceback = event.error, event.traceback
        self._publish.event(event)
