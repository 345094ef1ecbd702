"""Plain-data state of a run as the app shows it, folded from the engine's event stream.

`RunState.apply(event)` is O(1) per event; screens read its rows, series, log and latest
telemetry when they redraw. It holds no live engine object: a replayed run fills it the same way.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from torchherd.engine import messages as m

from torchherd.tui.series import LossSeries

LOG_KEEP = 1000  # event-log entries kept in memory


@dataclass
class PipelineRow:
    """What the table shows of one pipeline."""

    name: str
    device: str = ""
    state: str = "queued"
    pid: int | None = None
    attempt: int = 0
    restarts: int = 0
    epoch: int = 0
    step: int = 0
    epochs_total: int = 0
    steps_per_epoch: int = 0
    train_loss: float = math.nan
    val_loss: float = math.nan
    best_val: float = math.nan
    samples_per_s: float = 0.0
    started_at: float | None = None  # seconds since the epoch, first start
    finished_at: float | None = None
    log_path: Path | None = None
    last_error: str = ""
    traceback: str = ""
    rate_origin: tuple[float, int] | None = None  # (time, step) at this attempt's first report
    step_rate: float = 0.0  # steps per second over this attempt

    @property
    def total_steps(self) -> int:
        return self.epochs_total * self.steps_per_epoch

    @property
    def progress(self) -> float | None:
        total = self.total_steps
        return min(1.0, self.step / total) if total else None

    def elapsed(self, now: float) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at or now) - self.started_at

    def eta(self) -> float | None:
        """Seconds to the last step at this attempt's step rate; None when unknown or done."""
        if self.finished_at is not None or not self.total_steps or self.step_rate <= 0:
            return None
        return max(0.0, (self.total_steps - self.step) / self.step_rate)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One line of the event log, with a traceback when a failure carried one."""

    seq: int
    time: float
    level: str  # "info", "warning", "error"
    pipeline: str
    text: str
    traceback: str = ""


@dataclass
class RunState:
    """Everything the dashboard draws; mutate only through `apply`."""

    metric: str = "val_loss"
    metric_mode: str = "min"
    run_id: str = ""
    run_dir: Path | None = None
    read_only: bool = False
    finished: bool = False
    rows: dict[str, PipelineRow] = field(default_factory=dict)
    series: dict[str, LossSeries] = field(default_factory=dict)
    log: deque[LogEntry] = field(default_factory=lambda: deque(maxlen=LOG_KEEP))
    telemetry: m.TelemetrySnapshot | None = None
    rows_version: int = 0
    series_version: int = 0
    telemetry_version: int = 0
    _seq: int = 0

    # ------------------------------------------------------------ helpers
    def row(self, name: str) -> PipelineRow:
        row = self.rows.get(name)
        if row is None:
            row = self.rows[name] = PipelineRow(name)
            self.series[name] = LossSeries()
            if self.run_dir is not None:
                row.log_path = self.run_dir / name / "log.txt"
        return row

    def note(self, level: str, pipeline: str, text: str, tb: str = "", at: float | None = None) -> None:
        self._seq += 1
        self.log.append(LogEntry(self._seq, at if at is not None else time.time(), level, pipeline, text, tb))

    @property
    def log_seq(self) -> int:
        return self._seq

    @property
    def alive_count(self) -> int:
        return sum(1 for r in self.rows.values() if r.finished_at is None)

    def val_value(self, metrics: dict[str, float]) -> float:
        for key in (self.metric, "val_loss", "loss"):
            if key in metrics and metrics[key] is not None:
                return float(metrics[key])
        return next((float(v) for v in metrics.values() if isinstance(v, (int, float))), math.nan)

    # ------------------------------------------------------------ reducer
    def apply(self, ev: m.Event) -> None:
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev)

    def _run_started(self, ev: m.RunStarted) -> None:
        self.run_id, self.run_dir = ev.run_id, Path(ev.run_dir)
        for name in ev.pipelines:
            self.row(name).log_path = self.run_dir / name / "log.txt"
        self.finished = False
        self.rows_version += 1
        self.note("info", "", f"run {ev.run_id} started: {', '.join(ev.pipelines)}", at=ev.time)

    def _queued(self, ev: m.PipelineQueued) -> None:
        row = self.row(ev.pipeline)
        row.state, row.finished_at = "queued", None
        self.finished = False  # a pipeline added to, or restarted in, a finished session
        self.rows_version += 1
        self.note("info", ev.pipeline, f"queued (position {ev.position})", at=ev.time)

    def _worker_started(self, ev: m.WorkerStarted) -> None:
        row = self.row(ev.pipeline)
        row.device, row.pid, row.attempt = ev.device, ev.pid, ev.attempt
        row.started_at = row.started_at or ev.time
        row.finished_at, row.rate_origin, row.step_rate = None, None, 0.0
        self.rows_version += 1
        self.note("info", ev.pipeline, f"started on {ev.device} (pid {ev.pid}, attempt {ev.attempt})", at=ev.time)

    def _state(self, ev: m.WorkerStateChanged) -> None:
        row = self.row(ev.pipeline)
        row.state = ev.state
        self.rows_version += 1
        if ev.state in ("paused", "stopping", "killing") or ev.previous == "paused":
            self.note("info", ev.pipeline, f"{ev.previous} -> {ev.state}", at=ev.time)

    def _training_started(self, ev: m.TrainingStarted) -> None:
        row = self.row(ev.pipeline)
        row.epoch, row.step = ev.epoch, ev.step
        row.epochs_total, row.steps_per_epoch = ev.epochs_total, ev.steps_per_epoch
        row.device = row.device or ev.device  # the slot's name ("gpu1") says more than "cuda"
        self.rows_version += 1
        self.note("info", ev.pipeline, f"training from epoch {ev.epoch} step {ev.step} "
                                       f"({ev.parameters:,} parameters)", at=ev.time)

    def _step(self, ev: m.StepMetrics) -> None:
        row = self.row(ev.pipeline)
        row.epoch, row.step, row.train_loss, row.samples_per_s = ev.epoch, ev.step, ev.loss, ev.samples_per_s
        if row.rate_origin is None:
            row.rate_origin = (ev.time, ev.step)
        elif ev.time > row.rate_origin[0]:
            row.step_rate = (ev.step - row.rate_origin[1]) / (ev.time - row.rate_origin[0])
        self.series[ev.pipeline].append(ev.step, ev.time, ev.loss)
        self.rows_version += 1
        self.series_version += 1

    def _epoch_end(self, ev: m.EpochEnd) -> None:
        row = self.row(ev.pipeline)
        row.epochs_total, row.steps_per_epoch = ev.epochs_total, ev.steps_per_epoch
        row.step, row.samples_per_s = ev.step, ev.samples_per_s
        self.rows_version += 1
        self.note("info", ev.pipeline, f"epoch {ev.epoch + 1}/{ev.epochs_total}: train loss "
                                       f"{ev.train_loss:.4g} in {ev.duration:.1f} s", at=ev.time)

    def _checkpoint(self, ev: m.CheckpointSaved) -> None:
        self.note("info", ev.pipeline, f"checkpoint ({ev.reason}) at epoch {ev.epoch} step {ev.step}", at=ev.time)

    def _resumed(self, ev: m.Resumed) -> None:
        row = self.row(ev.pipeline)
        row.epoch, row.step = ev.epoch, ev.step
        self.rows_version += 1
        self.note("info", ev.pipeline, f"resumed from epoch {ev.epoch} step {ev.step} {ev.note}".rstrip(),
                  at=ev.time)

    def _val(self, ev: m.ValResult) -> None:
        row = self.row(ev.pipeline)
        value = self.val_value(ev.metrics)
        row.val_loss = value
        better = (lambda a, b: a < b) if self.metric_mode == "min" else (lambda a, b: a > b)
        if math.isfinite(value) and (row.best_val != row.best_val or better(value, row.best_val)):
            row.best_val = value
        self.series[ev.pipeline].add_val(ev.step, ev.time, value)
        self.rows_version += 1
        self.series_version += 1
        shown = ", ".join(f"{k}={v:.4g}" for k, v in ev.metrics.items() if isinstance(v, (int, float)))
        self.note("info", ev.pipeline, f"val_result epoch {ev.epoch} step {ev.step}: {shown} "
                                       f"({ev.latency:.2f} s)", at=ev.time)

    def _error(self, ev: m.WorkerError) -> None:
        row = self.row(ev.pipeline)
        row.last_error, row.traceback = ev.error, ev.traceback
        self.rows_version += 1
        self.note("error", ev.pipeline, f"error in {ev.where}: {ev.error}", ev.traceback, at=ev.time)

    def _exited(self, ev: m.WorkerExited) -> None:
        row = self.row(ev.pipeline)
        row.pid = None
        how = f"signal {ev.signal}" if ev.signal else f"exit code {ev.exit_code}"
        bad = ev.reason not in ("completed", "stopped", "killed", "")
        tb = ev.traceback if ev.traceback and ev.traceback != row.traceback else ""
        if ev.error:
            row.last_error = ev.error
        if ev.traceback:
            row.traceback = ev.traceback
        self.rows_version += 1
        text = f"exited ({how}, {ev.reason or 'unknown'})" + (f": {ev.error}" if ev.error else "")
        self.note("error" if bad else "info", ev.pipeline, text, tb, at=ev.time)

    def _restarting(self, ev: m.WorkerRestarting) -> None:
        row = self.row(ev.pipeline)
        row.restarts += 1
        self.rows_version += 1
        self.note("warning", ev.pipeline, f"restarting in {ev.delay:.1f} s ({ev.restarts_left} restarts left)"
                                          + (f": {ev.reason}" if ev.reason else ""), at=ev.time)

    def _finished(self, ev: m.PipelineFinished) -> None:
        row = self.row(ev.pipeline)
        row.state, row.finished_at, row.pid = ev.status, ev.time, None
        self.rows_version += 1
        level = "error" if ev.status == "failed" else "info"
        self.note(level, ev.pipeline, f"finished: {ev.status}" + (f" ({ev.reason})" if ev.reason else ""),
                  at=ev.time)

    def _notice(self, ev: m.Notice) -> None:
        self.note(ev.level, ev.pipeline, ev.text, at=ev.time)

    def _run_finished(self, ev: m.RunFinished) -> None:
        self.finished = True
        self.rows_version += 1
        self.note("info" if ev.ok else "error", "", "run finished: " +
                  ", ".join(f"{k} {v}" for k, v in ev.statuses.items()), at=ev.time)

    def _telemetry(self, ev: m.TelemetrySnapshot) -> None:
        self.telemetry = ev
        self.telemetry_version += 1


_HANDLERS = {
    m.RunStarted: RunState._run_started,
    m.PipelineQueued: RunState._queued,
    m.WorkerStarted: RunState._worker_started,
    m.WorkerStateChanged: RunState._state,
    m.TrainingStarted: RunState._training_started,
    m.StepMetrics: RunState._step,
    m.EpochEnd: RunState._epoch_end,
    m.CheckpointSaved: RunState._checkpoint,
    m.Resumed: RunState._resumed,
    m.ValResult: RunState._val,
    m.WorkerError: RunState._error,
    m.WorkerExited: RunState._exited,
    m.WorkerRestarting: RunState._restarting,
    m.PipelineFinished: RunState._finished,
    m.Notice: RunState._notice,
    m.RunFinished: RunState._run_finished,
    m.TelemetrySnapshot: RunState._telemetry,
}
