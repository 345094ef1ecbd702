"""What a worker's batch of events does in its session, in the order it was sent: the step reports, the bulk of
it, are published a run at a time (`EventBus.publish_steps`); every other event on its own moves the pipeline's
state, hands a snapshot to validation or stops an early-stopped pipeline, and is published."""
from __future__ import annotations

from typing import Callable

from ..launch.backend import Handle
from ..protocol.health import RankPace
from ..protocol.messages import EarlyStop, Event, Heartbeat, SnapshotTaken, TrainingStarted, WorkerError
from ..protocol.states import WorkerState
from .bus import EventBus, step_runs
from .lifecycle import Lifecycle
from .pipeline import PipelineRun
from .validation_service import ValidationService


class WorkerIntake:
    """Takes each batch a worker's handle delivers (`take`, which the lifecycle calls)."""

    def __init__(self, *, lifecycle: Lifecycle, bus: EventBus, validation: ValidationService,
                 emit: Callable[[Event], None], early_stop: Callable[[str, EarlyStop], None]):
        self._lifecycle, self._bus, self._validation = lifecycle, bus, validation
        self._emit, self._early_stop = emit, early_stop

    def take(self, run: PipelineRun, handle: Handle, events: list[Event]) -> None:
        if run.handle is not handle:
            return  # a late batch from an attempt already reaped
        self._lifecycle.heard(run)
        for steps, event in step_runs(events):  # the step reports in bulk, each other event on its own, in order
            if steps:
                run.live.saw_steps(steps)
                self._bus.publish_steps(steps)
                run.fold(steps[-1])  # a worker's own pipeline's, the newest superseding the rest (as _emit folds)
            if event is not None:
                self._one(run, event)

    def _one(self, run: PipelineRun, event: Event) -> None:
        run.live.saw(event)
        if isinstance(event, Heartbeat):
            return  # only proves progress; not worth a line anywhere
        if isinstance(event, RankPace):  # a gang's rank's own pace: for screens and the straggler rule, not kept
            self._bus.publish_transient(event)
            return
        if isinstance(event, SnapshotTaken):
            for out in self._validation.on_snapshot(run.name, event):
                self._emit(out)
            return
        if isinstance(event, EarlyStop):  # inline validation's patience ran out
            self._early_stop(run.name, event)
            return
        if isinstance(event, TrainingStarted) and run.state == WorkerState.STARTING:
            self._lifecycle.set_state(run, WorkerState.RUNNING)  # STARTING -> RUNNING
        elif isinstance(event, WorkerError):
            run.last_error, run.last_traceback = event.error, event.traceback
        self._emit(event)
