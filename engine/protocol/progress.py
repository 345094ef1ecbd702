"""Per-pipeline progress folded from the event stream: the one place that turns events into figures.

`apply(progress, event)` is a pure fold: it returns a new `PipelineProgress` (or the same object when
the event says nothing about this pipeline), so a live session and a run replayed from
`events.jsonl` arrive at the same figures. `better` is the one rule for "is this value the new best".

Epochs are counted as the events count them, from 0: `epoch` is the epoch in progress (after the
last epoch ends it equals `epochs_total`). `epoch_number` is the same for people, from 1.
Standard library only, like `states`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from . import health as h
from . import messages as m
from .states import WorkerState

RESIZES_KEPT = 5  # an elastic gang's newest gang_resized events its progress keeps


def better(value: float, best: float | None, mode: str) -> bool:
    """Whether `value` beats `best` when `mode` is "min" (lower is better) or "max"; NaN never does."""
    if value is None or not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value > best if mode == "max" else value < best


class Patience(Protocol):
    """What `judge` reads of the [validation] config (config.schema.ValidationConfig)."""

    @property
    def metric(self) -> str: ...
    @property
    def metric_mode(self) -> str: ...
    @property
    def patience(self) -> int | None: ...


def judge(value: float, best: float | None, since_best: int,
          validation: Patience) -> tuple[bool, float | None, int, str]:
    """One validation result against the best so far, under `validation`'s metric_mode and patience (the
    [validation] config): (whether it is a new best, the best, results since it, why to stop early or "")."""
    if better(value, best, validation.metric_mode):
        return True, value, 0, ""
    since_best += 1
    if validation.patience is not None and since_best >= validation.patience:
        return False, best, 0, early_stop_reason(validation.metric, best, validation.patience)
    return False, best, since_best, ""


def early_stop_reason(metric: str, best: float | None, patience: int) -> str:
    """Why `patience` validations without a better `metric` stopped a pipeline."""
    since = f"on {best:.6g} " if best is not None else ""
    return f"early stopping: {metric} did not improve {since}in {patience} validations"


def metric_value(metrics: dict[str, float], metric: str) -> float | None:
    """The value of `metric` in a validation result, else its `val_loss`; None when it has neither."""
    for key in (metric, "val_loss"):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


@dataclass(frozen=True, slots=True)
class PipelineProgress:
    """Where one pipeline is: lifecycle, position in training, losses and the best validation score."""

    name: str
    metric: str = "val_loss"  # the validation metric that decides the best
    metric_mode: str = "min"  # "min" or "max"
    state: WorkerState = WorkerState.QUEUED
    device: str = ""
    node: str = ""  # the cluster node its worker runs on; "" for this machine
    pid: int | None = None
    attempt: int = 0  # 1 for the first start; every start (crash restart or a person's restart) adds one
    restarts: int = 0  # restarts after crashes, spent from the restart budget
    restart_budget: int | None = None  # max_restarts, once a restart has told us
    epoch: int = 0  # 0-based epoch in progress
    step: int = 0  # optimizer steps so far, all epochs
    epochs_total: int = 0
    steps_per_epoch: int = 0
    train_loss: float | None = None
    val_loss: float | None = None  # the newest result's val_loss
    val_value: float | None = None  # the newest result's `metric`
    best: float | None = None  # the best `metric` so far
    samples_per_s: float | None = None
    started_at: float | None = None  # seconds since the epoch, first start
    finished_at: float | None = None  # seconds since the epoch; None while not final
    last_error: str = ""  # "ExceptionType: message" of the newest failure
    traceback: str = ""
    finish_reason: str = ""  # why it reached its final (or resting) state
    rung: float | None = None  # waiting_at_rung: the rung it waits at
    never_ran: bool = False  # it ended before any attempt of it ran
    cut_short: bool = False  # its supervisor died before it ended: nothing runs it, `torchherd resume` carries it on
    rate_origin: tuple[float, int] | None = None  # (time, step) of this attempt's first step report, + pauses
    step_rate: float = 0.0  # steps per second over this attempt, its pauses left out
    paused_at: float | None = None  # seconds since the epoch it was paused, while paused
    stalled_since: float | None = None  # seconds since the epoch of its last news, while flagged for no step
    waiting: str = ""  # while queued: what it waits for and what holds it ("" once it has its devices)
    rank_times: tuple[float, ...] = ()  # a gang's: each rank's own seconds per batch, its newest report
    straggler: str = ""  # "r1 1.6x" while a rank of its gang is flagged as a straggler
    verdict: str = ""  # its newest triage: where each rank is, the odd one first
    rank_places: tuple[str, ...] = ()  # where each rank was at that triage
    ranks: int = 0  # processes of its newest attempt (a gang's ranks, else 1); 0 while it holds no device
    min_ranks: int = 0  # an elastic gang's (ranks = "MIN:MAX") MIN; 0 for a fixed gang or one process
    max_ranks: int = 0  # an elastic gang's MAX; 0 for a fixed gang or one process
    resizes: tuple[m.GangResized, ...] = ()  # an elastic gang's newest gang_resized events, oldest first

    @property
    def elastic(self) -> bool:
        """Its gang may run at any size from `min_ranks` to `max_ranks` (ranks = "MIN:MAX")."""
        return self.max_ranks > 0

    def peers_median(self, rank: int) -> float | None:
        """The median of a gang's other ranks' own seconds per batch; None before all have reported."""
        times = self.rank_times
        if len(times) < 2 or any(math.isnan(t) for t in times):
            return None
        others = sorted(t for r, t in enumerate(times) if r != rank)
        mid = len(others) // 2
        return others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2

    @property
    def spread(self) -> tuple[float, float, int] | None:
        """A gang's (median of the others, slowest, slowest rank) of its ranks' own seconds per batch, as the
        straggler rule compares them; None before every rank has reported."""
        if len(self.rank_times) < 2:
            return None
        slowest = max(range(len(self.rank_times)), key=self.rank_times.__getitem__)
        median = self.peers_median(slowest)
        return None if median is None else (median, self.rank_times[slowest], slowest)

    @property
    def total_steps(self) -> int:
        return self.epochs_total * self.steps_per_epoch

    @property
    def fraction(self) -> float | None:
        """Share of the training done, 0 to 1; None while the length is unknown. A completed pipeline did all
        of it, whatever its counts say (a script's steps per epoch are a guess until its last epoch)."""
        if self.state == WorkerState.COMPLETED:
            return 1.0
        total = self.total_steps
        return min(1.0, self.step / total) if total else None

    @property
    def epoch_number(self) -> int:
        """The epoch in progress counted from 1, never past the last one."""
        return min(self.epoch + 1, self.epochs_total) if self.epochs_total else self.epoch + 1

    def elapsed(self, now: float) -> float | None:
        """Seconds since its first start (to its end once final)."""
        if self.started_at is None:
            return None
        return (self.finished_at or now) - self.started_at

    def eta(self) -> float | None:
        """Seconds to the last step at this attempt's step rate; None unless it is running at a known rate."""
        if self.state != WorkerState.RUNNING or self.cut_short or not self.total_steps or self.step_rate <= 0:
            return None
        return max(0.0, (self.total_steps - self.step) / self.step_rate)


def apply(progress: PipelineProgress, event: m.Event) -> PipelineProgress:
    """The progress after `event`; the same object when the event is not about this pipeline or changes nothing."""
    if m.pipeline_of(event) != progress.name:
        return progress
    fold = _FOLDS.get(type(event))
    return progress if fold is None else fold(progress, event)


def _queued(p: PipelineProgress, ev: m.PipelineQueued) -> PipelineProgress:
    # Queued (again) holds no device: a restarted pipeline may start on another slot.
    return replace(p, state=WorkerState.QUEUED, device="", node="", pid=None, finished_at=None, finish_reason="",
                   rung=None, never_ran=False, rate_origin=None, step_rate=0.0, waiting="", ranks=0)


def _waiting(p: PipelineProgress, ev: m.PipelineWaiting) -> PipelineProgress:
    return replace(p, waiting=ev.why)


def _started(p: PipelineProgress, ev: m.WorkerStarted) -> PipelineProgress:
    return replace(p, device=ev.device, node=ev.node, pid=ev.pid, attempt=ev.attempt,
                   started_at=p.started_at or ev.time, finished_at=None, rate_origin=None, step_rate=0.0,
                   stalled_since=None, waiting="", rank_times=(), straggler="", verdict="", rank_places=(),
                   ranks=len(ev.pids) or 1, min_ranks=ev.min_ranks, max_ranks=ev.max_ranks)


def _resized(p: PipelineProgress, ev: m.GangResized) -> PipelineProgress:
    return replace(p, ranks=ev.to_ranks, resizes=(*p.resizes, ev)[-RESIZES_KEPT:])


def _pace(p: PipelineProgress, ev: h.RankPace) -> PipelineProgress:
    times = list(p.rank_times) + [math.nan] * (ev.rank + 1 - len(p.rank_times))
    times[ev.rank] = ev.step_time
    return replace(p, rank_times=tuple(times))


def _straggler(p: PipelineProgress, ev: h.Straggler) -> PipelineProgress:
    return replace(p, straggler=f"r{ev.rank} {ev.ratio:.1f}x" if ev.ratio else "")


def _stalled(p: PipelineProgress, ev: m.Stalled) -> PipelineProgress:
    return replace(p, stalled_since=ev.time - ev.quiet if ev.quiet else None)


def _state(p: PipelineProgress, ev: m.WorkerStateChanged) -> PipelineProgress:
    state = WorkerState(ev.state)
    if state == WorkerState.PAUSED:
        return replace(p, state=state, paused_at=ev.time)
    origin = p.rate_origin
    if p.paused_at is not None and origin is not None:  # the step rate counts training time, not the pause
        origin = (origin[0] + max(0.0, ev.time - p.paused_at), origin[1])
    return replace(p, state=state, paused_at=None, rate_origin=origin)


def _training_started(p: PipelineProgress, ev: m.TrainingStarted) -> PipelineProgress:
    return replace(p, epoch=ev.epoch, step=ev.step, epochs_total=ev.epochs_total,
                   steps_per_epoch=ev.steps_per_epoch, device=p.device or ev.device)


def _step(p: PipelineProgress, ev: m.StepMetrics) -> PipelineProgress:
    origin, rate = p.rate_origin, p.step_rate
    if origin is None:
        origin = (ev.time, ev.step)
    elif ev.time > origin[0]:
        rate = (ev.step - origin[1]) / (ev.time - origin[0])
    return replace(p, epoch=ev.epoch, step=ev.step, train_loss=ev.loss, samples_per_s=ev.samples_per_s,
                   rate_origin=origin, step_rate=rate)


def _epoch_end(p: PipelineProgress, ev: m.EpochEnd) -> PipelineProgress:
    # EpochEnd names the epoch that finished; the one in progress is the next.
    return replace(p, epoch=ev.epoch + 1, step=ev.step, train_loss=ev.train_loss, samples_per_s=ev.samples_per_s,
                   epochs_total=ev.epochs_total, steps_per_epoch=ev.steps_per_epoch)


def _resumed(p: PipelineProgress, ev: m.Resumed | m.CheckpointSaved) -> PipelineProgress:
    return replace(p, epoch=ev.epoch, step=ev.step)  # where the saved state stands


def _val(p: PipelineProgress, ev: m.ValResult) -> PipelineProgress:
    if ev.error:
        return p  # validation raised: no figures, training goes on
    value = metric_value(ev.metrics, p.metric)
    loss = ev.metrics.get("val_loss", value)
    best = value if value is not None and better(value, p.best, p.metric_mode) else p.best
    return replace(p, val_loss=loss, val_value=value, best=best)


def _error(p: PipelineProgress, ev: m.WorkerError) -> PipelineProgress:
    return replace(p, last_error=ev.error, traceback=ev.traceback)


def _exited(p: PipelineProgress, ev: m.WorkerExited) -> PipelineProgress:
    return replace(p, pid=None, stalled_since=None, last_error=ev.error or p.last_error,
                   traceback=ev.traceback or p.traceback)


def _restarting(p: PipelineProgress, ev: m.WorkerRestarting) -> PipelineProgress:
    restarts = p.restarts + 1
    return replace(p, restarts=restarts, restart_budget=restarts + ev.restarts_left)


def _finished(p: PipelineProgress, ev: m.PipelineFinished) -> PipelineProgress:
    return replace(p, state=WorkerState(ev.status), finished_at=ev.time, pid=None, finish_reason=ev.reason,
                   rung=ev.rung, never_ran=ev.never_ran)


_FOLDS: dict[type[m.Event], Callable[[PipelineProgress, Any], PipelineProgress]] = {
    m.PipelineQueued: _queued,
    m.PipelineWaiting: _waiting,
    m.WorkerStarted: _started,
    m.WorkerStateChanged: _state,
    m.TrainingStarted: _training_started,
    m.StepMetrics: _step,
    m.EpochEnd: _epoch_end,
    m.Resumed: _resumed,
    m.CheckpointSaved: _resumed,
    m.ValResult: _val,
    m.WorkerError: _error,
    m.WorkerExited: _exited,
    m.WorkerRestarting: _restarting,
    m.GangResized: _resized,
    m.PipelineFinished: _finished,
    m.Stalled: _stalled,
    h.RankPace: _pace,
    h.Straggler: _straggler,
    h.Triage: lambda p, ev: replace(p, verdict=ev.verdict, rank_places=ev.ranks),
}
