"""A pipeline as the supervisor keeps it: its plan (fixed), its current attempt (changing) and its progress.

The plan is what to run and under which rules, as torch elastic's WorkerSpec; an
attempt is one start of its worker, with the handle and why we asked it to end,
as elastic's Worker. `PipelineView` is the plain-data copy screens are given.
"""
from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path

from ..config.schema import Pipeline, RunConfig
from ..hardware.grants import Request
from ..hardware.placement import ValidationPlan
from ..hardware.slots import Slot
from ..launch.backend import Handle
from ..protocol.messages import EpochEnd, Event, Heartbeat, StepMetrics, TrainingStarted, WorkerError
from ..protocol.names import Intent, ValidationMode
from ..protocol.progress import PipelineProgress, apply
from ..protocol.states import WorkerState
from .policy import RestartPolicy


@dataclass(frozen=True)
class Plan:
    """What to run for one pipeline and under which rules; fixed once the pipeline is added."""

    config: Pipeline
    run_config: RunConfig
    policy: RestartPolicy
    order: int  # arrival: ties in priority start in this order
    validation: ValidationPlan
    request: Request = Request()  # what it asks of the devices: a slot per rank (engine/hardware/grants.py)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def background(self) -> bool:
        return self.validation.mode == ValidationMode.BACKGROUND


@dataclass
class Attempt:
    """One start of a pipeline's worker."""

    number: int
    handle: Handle | None = None
    started_mono: float = 0.0  # monotonic seconds
    started_at: float | None = None  # wall clock, for people
    deadline: float | None = None  # monotonic time to escalate (KILLING / STOPPING / HUNG)
    intent: Intent | None = None  # why we asked it to end (STOP, KILL, RESTART or HUNG)
    escalated: bool = False
    last_progress: float = 0.0  # monotonic time of its last sign of training
    start_step: int | None = None  # the step it resumed at (from TrainingStarted)
    stepped: bool = False  # it completed an optimizer step: dying now is no failed start
    failure: tuple[str, int] | None = None  # (error, step) of the exception it reported
    failed_on: tuple[Slot, int] | None = None  # a gang of 2+ ranks: (slot, rank) of the rank that failed first
    announced: bool = False  # its WorkerStarted is out (on Ray, once the actor knows the child's pid)
    slowest: float = 0.0  # the longest it went without news since its first step (seconds)
    stalled: bool = False  # flagged for making no step (Stalled), until it is heard from again

    def heard(self, now: float) -> bool:
        """News from the worker at `now`; True when that ends a stall it was flagged for."""
        if self.stepped:
            self.slowest = max(self.slowest, now - self.last_progress)
        self.last_progress = now
        was, self.stalled = self.stalled, False
        return was

    def saw(self, event: Event) -> None:
        """Note what an event says about this attempt's progress and failure."""
        if isinstance(event, TrainingStarted):
            self.start_step = event.step
        elif isinstance(event, (Heartbeat, StepMetrics, EpochEnd)):
            if self.start_step is not None and event.step > self.start_step:
                self.stepped = True
        elif isinstance(event, WorkerError) and event.where == "train":
            self.failure = (event.error, event.step)

    def saw_steps(self, steps: list[StepMetrics]) -> None:
        """`saw` of each of a run of step reports (the bulk of a worker's batch)."""
        if not self.stepped and self.start_step is not None:
            start = self.start_step
            self.stepped = any(s.step > start for s in steps)


@dataclass
class SupervisedPipeline:
    """One pipeline of a session: its plan, state, current attempt, restart accounting and progress."""

    plan: Plan
    state: WorkerState = WorkerState.QUEUED
    slots: list[Slot] = field(default_factory=list)
    current: Attempt | None = None
    attempts: int = 0  # attempts started so far
    restarts: int = 0  # restarts spent from the budget
    failed_starts: int = 0  # consecutive
    restart_at: float | None = None  # monotonic time to leave BACKOFF
    stop_reason: str = ""
    stop_as: WorkerState = WorkerState.STOPPED  # the state a requested stop ends in (early_stopped, pruned, resting)
    stop_rung: float | None = None  # the rung a stop into waiting_at_rung waits at
    last_error: str = ""
    last_traceback: str = ""
    finish_reason: str = ""
    last_failure: tuple[str, int] | None = None  # (error, step) the previous crashed attempt reported
    last_failed_on: tuple[Slot, int] | None = None  # (slot, rank) that failed first in the previous crash, if known
    ranks_run: int = 0  # ranks its last attempt ran with; 0 before its first
    regrant_cause: str = ""  # an elastic gang that gave its slots back to restart: the failure that ended it
    resize_why: str = ""  # an elastic gang asked to stop and start again bigger: why (its gang_resized says it)
    progress: PipelineProgress = field(init=False)  # folded from every event of this pipeline the session emits
    pending_step: StepMetrics | None = None  # the newest step report, not folded yet

    def __post_init__(self) -> None:
        v = self.plan.run_config.validation
        self.progress = PipelineProgress(name=self.name, metric=v.metric, metric_mode=v.metric_mode,
                                         epochs_total=self.plan.config.epochs_planned)

    def fold(self, event: Event) -> None:
        """Fold an event the session emitted into this pipeline's progress (engine.progress.apply).

        Step reports supersede one another: only the newest of a burst is folded, when it is read.
        """
        if isinstance(event, StepMetrics):
            self.pending_step = event
        else:
            self.progress = apply(self.figures(), event)

    def figures(self) -> PipelineProgress:
        """Its progress, with the newest step report in it."""
        if self.pending_step is not None:
            self.progress, self.pending_step = apply(self.progress, self.pending_step), None
        return self.progress

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def handle(self) -> Handle | None:
        return self.current.handle if self.current is not None else None

    @property
    def live(self) -> Attempt:
        """The current attempt, in a state that has one (STARTING to the end of KILLING/STOPPING/HUNG)."""
        if self.current is None:
            raise RuntimeError(f"{self.name} is {self.state.value}: no attempt")
        return self.current

    @property
    def live_handle(self) -> Handle:
        """The current attempt's worker, in a state that has one."""
        handle = self.live.handle
        if handle is None:
            raise RuntimeError(f"{self.name}'s attempt {self.live.number} has no worker")
        return handle

    @property
    def intent(self) -> Intent | None:
        return self.current.intent if self.current is not None else None


@dataclass(frozen=True)
class PipelineView:
    """A pipeline as a screen shows it: plain data, safe to hand to widgets."""

    name: str
    state: WorkerState
    device: str
    pid: int | None
    attempt: int
    restarts: int
    epoch: int
    step: int
    epochs_total: int
    steps_per_epoch: int
    train_loss: float | None
    val_loss: float | None
    best_val: float | None
    samples_per_s: float | None
    started_at: float | None
    log_path: Path
    last_error: str
    priority: int = 0
    node: str = ""  # the cluster node its worker runs on; "" for this machine (or none running)
    finish_reason: str = ""  # why it reached its final (or resting) state
    error: str = ""  # the newest error of its attempts ("" when the newest ran well), whatever its state


def view_of(pipe: SupervisedPipeline, run_dir: Path) -> PipelineView:
    p = pipe.figures()
    handle = pipe.handle
    return PipelineView(
        name=pipe.name, state=pipe.state, device=",".join(s.name for s in pipe.slots),
        pid=handle.pid if handle is not None else None, attempt=pipe.attempts, restarts=pipe.restarts,
        epoch=p.epoch, step=p.step, epochs_total=p.epochs_total, steps_per_epoch=p.steps_per_epoch,
        train_loss=p.train_loss, val_loss=p.val_loss, best_val=p.best, samples_per_s=p.samples_per_s,
        started_at=pipe.current.started_at if pipe.current is not None else None,
        log_path=run_dir / pipe.name / "log.txt",
        last_error=pipe.finish_reason if pipe.state == WorkerState.FAILED else pipe.last_error,
        priority=pipe.plan.config.priority, node=handle.node if handle is not None else "",
        finish_reason=pipe.finish_reason, error=pipe.last_error)


def unique_name(name: str, taken: Container[str]) -> str:
    """`name`, or `name-2`, `name-3` ... when a pipeline of the session already has it."""
    out, n = name, 2
    while out in taken:
        out, n = f"{name}-{n}", n + 1
    return out
