"""Plain-data state of a run as the app shows it, folded from the engine's event stream.

Each pipeline's figures come from the engine's one fold (`engine.progress.apply`); on top of it
`RunState.apply(event)` keeps what only the screen needs: loss series for the chart, the event
log's lines (epochs counted from 1), the latest telemetry and, for a sweep, its trials' rows
(`tui.ranking`). O(1) per event; no live engine object, so a run replayed from its `events.jsonl` fills it
the same way.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..engine.protocol import health as h
from ..engine.protocol import messages as m
from ..engine.protocol import telemetry as t
from ..engine.protocol.names import ExitReason
from ..engine.protocol.progress import PipelineProgress
from ..engine.protocol.progress import apply as fold
from ..engine.protocol.states import WorkerState, ended_label
from .formats import (
    checkpoint_cost,
    epoch_label,
    finish_text,
    fmt_num,
    is_loss_metric,
    quiet_text,
    resized_text,
    straggler_text,
)
from .ranking import SavedSweep, TrialRow, fold_trial, rank
from .series import LossSeries

LOG_KEEP = 1000  # event-log entries kept in memory
# Worth a line of their own in the event log.
LOGGED_STATES = frozenset({WorkerState.PAUSED, WorkerState.STOPPING, WorkerState.KILLING, WorkerState.HUNG,
                           WorkerState.BACKOFF})
# Exits that are no failure (a worker not known to have ended well or badly: "").
QUIET_EXITS = frozenset({ExitReason.COMPLETED, ExitReason.STOPPED, ExitReason.KILLED, ExitReason.RESTARTED, ""})


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
    added: list[str] = field(default_factory=list)  # the run names of configs added to the session since it began
    commit: str = ""  # the session's code, short: "@ab12cd3" ("*": dirty; "+1": one more repository); "" unknown
    read_only: bool = False
    live: bool = False  # events still come from a supervisor (a replayed past run: False)
    finished: bool = False
    cut_short: bool = False  # its supervisor died before the run finished
    _rows: dict[str, PipelineProgress] = field(default_factory=dict)
    _steps: dict[str, m.StepMetrics] = field(default_factory=dict)  # the newest step reports, not folded yet
    series: dict[str, LossSeries] = field(default_factory=dict)
    metric_series: dict[str, dict[str, LossSeries]] = field(default_factory=dict)  # pipeline -> its step metrics
    chart_metric: str = ""  # what the chart plots: "" the training loss, else a value the step reports carry
    log: deque[LogEntry] = field(default_factory=lambda: deque(maxlen=LOG_KEEP))
    telemetry: t.TelemetrySnapshot | None = None
    trials: dict[str, TrialRow] = field(default_factory=dict)  # every sweep's trials by name; empty for no sweep
    sweeps: list[SavedSweep] = field(default_factory=list)  # the session's sweeps, in the order their configs came
    sweep_of: dict[str, int] = field(default_factory=dict)  # a trial's name -> its sweep's index in `sweeps`
    trials_version: int = 0
    rows_version: int = 0
    series_version: int = 0
    telemetry_version: int = 0
    alerts: list[h.Alert] = field(default_factory=list)  # every alert of the run, oldest first
    _seq: int = 0

    # ------------------------------------------------------------ queries
    @property
    def rows(self) -> dict[str, PipelineProgress]:
        """Each pipeline's figures. Step reports supersede one another, so only the newest of each pipeline's
        is folded, when the figures are read (a redraw), not every one as it arrives."""
        if self._steps:
            for name, ev in self._steps.items():
                self._rows[name] = fold(self._rows[name], ev)
            self._steps.clear()
        return self._rows

    def supervisor_gone(self, at: float) -> None:
        """Its supervisor died before the run finished: every pipeline it had not ended is cut short (nothing
        runs it; `torchherd resume` carries it on), its clocks stopped at `at` (seconds since the epoch)."""
        self.cut_short = True
        for name, row in self.rows.items():
            if not row.state.ended:
                self._rows[name] = replace(row, cut_short=True, stalled_since=None, straggler="",
                                           finished_at=row.finished_at or at)
        self.rows_version += 1
        self._telemetry(self.telemetry, None)  # its processes are gone with it
        self.telemetry_version += 1

    def row(self, name: str) -> PipelineProgress:
        row = self.rows.get(name)
        if row is None:
            row = self._rows[name] = PipelineProgress(name, metric=self.metric, metric_mode=self.metric_mode)
            self.series[name] = LossSeries()
        return row

    def charted(self) -> dict[str, LossSeries]:
        """The series the chart plots, by pipeline: the training loss, or `chart_metric` where it is reported."""
        if not self.chart_metric:
            return self.series
        return {n: by[self.chart_metric] for n, by in self.metric_series.items() if self.chart_metric in by}

    def chart_metrics(self, name: str) -> list[str]:
        """What the chart can plot for `name`: "" (its training loss), then each value its step reports carry."""
        return ["", *self.metric_series.get(name, {})]

    def log_path(self, name: str) -> Path | None:
        """Where the pipeline's worker log is (or will be)."""
        return self.run_dir / name / "log.txt" if self.run_dir is not None else None

    def add_sweep(self, sweep: SavedSweep | None) -> None:
        """A config of the session is a sweep of these trials (call before their results are applied; the first
        sweep's metric is the run's); None: that config is no sweep."""
        if sweep is None:
            return
        if not self.sweeps:
            self.metric, self.metric_mode = sweep.metric, sweep.metric_mode
        self.sweeps.append(sweep)
        for name, values in sweep.trials.items():
            self.trials[name], self.sweep_of[name] = TrialRow(name, values), len(self.sweeps) - 1
        self.trials_version += 1

    def sweep_for(self, name: str | None) -> SavedSweep | None:
        """The sweep `name` is a trial of; the session's first for a pipeline of none (None without a sweep)."""
        return self.sweeps[self.sweep_of.get(name or "", 0)] if self.sweeps else None

    def ranked(self, name: str | None = None) -> list[TrialRow]:
        """The trials of `name`'s sweep (see `sweep_for`) best first by its metric (those without a result last,
        in config order)."""
        sweep = self.sweep_for(name)
        if sweep is None:
            return []
        return rank([row for trial, row in self.trials.items() if self.sweeps[self.sweep_of[trial]] is sweep],
                    sweep.ranks_mode)

    @property
    def metric_is_loss(self) -> bool:
        return is_loss_metric(self.metric, self.metric_mode)

    @property
    def log_seq(self) -> int:
        return self._seq

    @property
    def alive_count(self) -> int:
        """Pipelines not yet in a final state."""
        return sum(1 for r in self.rows.values() if not r.state.final)

    def note(self, level: str, pipeline: str, text: str, tb: str = "", at: float | None = None) -> None:
        self._seq += 1
        self.log.append(LogEntry(self._seq, at if at is not None else time.time(), level, pipeline, text, tb))

    # ------------------------------------------------------------ reducer
    def apply(self, ev: m.Event) -> None:
        name = m.pipeline_of(ev)
        if type(ev) is m.StepMetrics:  # the stream's bulk: its fold waits for a read (`rows`)
            if name not in self._rows:
                self.row(name)
            self._steps[name] = ev
            self.rows_version += 1
            self._step(ev, None)
            self._fold_trial(name, ev)  # a sweep of trials with no validation metric ranks them by it
            return
        before = None
        if name:
            before = self.row(name)
            after = fold(before, ev)
            if after is not before:
                self._rows[name] = after
                self.rows_version += 1
            self._fold_trial(name, ev)
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev, before)

    def _fold_trial(self, name: str, ev: m.Event) -> None:
        trial = self.trials.get(name)
        if trial is not None:
            sweep = self.sweeps[self.sweep_of[name]]
            if fold_trial(trial, ev, sweep.ranks_by, sweep.ranks_mode):
                self.trials_version += 1

    def _epoch(self, name: str, epoch: int) -> str:
        return epoch_label(epoch, self.rows[name].epochs_total)

    def _run_started(self, ev: m.RunStarted, _: PipelineProgress | None) -> None:
        self.run_id = ev.run_id
        self.commit = commit_label(ev.code)
        if self.run_dir is None:  # a client's own path to the folder comes first (the run's may be relative)
            self.run_dir = Path(ev.run_dir)
        for name in ev.pipelines:
            row = self.row(name)
            if row.restarts or row.cut_short:  # a resumed run: its restart budget starts afresh, and the count shown
                self._rows[name] = replace(row, restarts=0, restart_budget=None, cut_short=False)
        self.finished = self.cut_short = False
        self.rows_version += 1
        self.note("info", "", f"run {ev.run_id} started: {', '.join(ev.pipelines)}", at=ev.time)

    def _config_added(self, ev: m.ConfigAdded, _: PipelineProgress | None) -> None:
        self.added.append(ev.name)
        self.rows_version += 1  # the status line names it
        self.note("info", "", f"config {ev.name} added: {', '.join(ev.pipelines)}", at=ev.time)

    def _queued(self, ev: m.PipelineQueued, _: PipelineProgress | None) -> None:
        if self.finished:  # a pipeline added to, or restarted in, a finished session
            self.finished = False
            self.telemetry_version += 1  # the pane waits for readings again
        where = f"position {ev.position}" if ev.position else "waiting for a free device"
        self.note("info", ev.pipeline, f"queued ({where})", at=ev.time)

    def _waiting(self, ev: m.PipelineWaiting, _: PipelineProgress | None) -> None:
        if ev.why:
            self.note("info", ev.pipeline, ev.why, at=ev.time)

    def _worker_started(self, ev: m.WorkerStarted, _: PipelineProgress | None) -> None:
        where = f"{ev.device} of node {ev.node}" if ev.node else ev.device
        self.note("info", ev.pipeline, f"started on {where} (pid {ev.pid}, attempt {ev.attempt})", at=ev.time)

    def _state(self, ev: m.WorkerStateChanged, _: PipelineProgress | None) -> None:
        if ev.state in LOGGED_STATES or ev.previous == WorkerState.PAUSED:
            self.note("info", ev.pipeline, f"{ev.previous} -> {ev.state}", at=ev.time)

    def _training_started(self, ev: m.TrainingStarted, _: PipelineProgress | None) -> None:
        # a script's own loop tells neither its steps nor its parameters: say only what is known
        parts = [f"{ev.epochs_total} epochs of {ev.steps_per_epoch:,} steps" if ev.steps_per_epoch else
                 f"{ev.epochs_total} epochs"] if ev.epochs_total else []
        parts += [f"{ev.parameters:,} parameters"] if ev.parameters else []
        size = ", ".join(parts) or "its own loop"
        where = f"from {self._epoch(ev.pipeline, ev.epoch)}, step {ev.step:,}" if ev.step else "training"
        self.note("info", ev.pipeline, f"{where} ({size})", at=ev.time)

    def _step(self, ev: m.StepMetrics, _: PipelineProgress | None) -> None:
        series = self.series[ev.pipeline]
        if len(series.steps) and ev.step < series.steps[-1]:
            self.note("info", ev.pipeline, f"went back from step {int(series.steps[-1]):,} to step {ev.step:,}: "
                      "trained again from there (↺ on the chart)", at=ev.time)
        series.append(ev.step, ev.time, ev.loss)
        for key, value in ev.metrics.items():  # a user's own values (my_loss, train_acc_step), for `m`
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.metric_series.setdefault(ev.pipeline, {}).setdefault(key, LossSeries()).append(
                    ev.step, ev.time, float(value))
        self.series_version += 1

    def _epoch_end(self, ev: m.EpochEnd, _: PipelineProgress | None) -> None:
        self.note("info", ev.pipeline, f"{epoch_label(ev.epoch, ev.epochs_total)} done: train loss "
                                       f"{fmt_num(ev.train_loss)} in {ev.duration:.1f} s", at=ev.time)

    def _checkpoint(self, ev: m.CheckpointSaved, _: PipelineProgress | None) -> None:
        row = self.rows[ev.pipeline]
        total, per_epoch = row.epochs_total, row.steps_per_epoch
        # A checkpoint's epoch is the one in progress; at an epoch's end that is the count of those done.
        done = ev.step == ev.epoch * per_epoch if per_epoch else ev.reason in ("epoch", "best", "final")
        if done and ev.epoch:
            where = f"after epoch {ev.epoch}" + (f"/{total}" if total else "")
        else:
            where = f"in {epoch_label(ev.epoch, total)}, step {ev.step:,}"
        self.note("info", ev.pipeline, f"checkpoint ({ev.reason}) {where}{checkpoint_cost(ev)}", at=ev.time)

    def _resumed(self, ev: m.Resumed, _: PipelineProgress | None) -> None:
        text = f"resumed from its checkpoint: {self._epoch(ev.pipeline, ev.epoch)}, step {ev.step:,}"
        self.note("info", ev.pipeline, f"{text} {ev.note}".rstrip(), at=ev.time)

    def _val(self, ev: m.ValResult, _: PipelineProgress | None) -> None:
        where = f"{self._epoch(ev.pipeline, ev.epoch)}, step {ev.step:,}"
        if ev.error:
            self.note("warning", ev.pipeline, f"validation of {where} failed: {ev.error} (training goes on)",
                      ev.traceback, at=ev.time)
            return
        value = self.rows[ev.pipeline].val_value
        self.series[ev.pipeline].add_val(ev.step, ev.time, math.nan if value is None else value)
        self.series_version += 1
        shown = ", ".join(f"{k} {fmt_num(v)}" for k, v in ev.metrics.items() if isinstance(v, (int, float))) or \
            "no metrics (nothing logged)"
        self.note("info", ev.pipeline, f"validated {where}: {shown} ({ev.latency:.2f} s)", at=ev.time)

    def _error(self, ev: m.WorkerError, _: PipelineProgress | None) -> None:
        self.note("error", ev.pipeline, f"error in {ev.where}: {ev.error}", ev.traceback, at=ev.time)

    def _exited(self, ev: m.WorkerExited, before: PipelineProgress | None) -> None:
        how = f"signal {ev.signal}" if ev.signal else f"exit code {ev.exit_code}"
        bad = ev.reason not in QUIET_EXITS
        # The traceback was shown with the worker's own error report; do not print it twice.
        tb = ev.traceback if ev.traceback and before is not None and ev.traceback != before.traceback else ""
        text = f"exited ({how}, {ev.reason or 'unknown'})" + (f": {ev.error}" if ev.error else "")
        self.note("error" if bad else "info", ev.pipeline, text, tb, at=ev.time)

    def _restarting(self, ev: m.WorkerRestarting, _: PipelineProgress | None) -> None:
        left = f"{ev.restarts_left} restart{'s' if ev.restarts_left != 1 else ''} left"
        self.note("warning", ev.pipeline, f"restarting in {ev.delay:.1f} s ({left})"
                                          + (f": {ev.reason}" if ev.reason else ""), at=ev.time)

    def _resized(self, ev: m.GangResized, _: PipelineProgress | None) -> None:
        self.note("warning" if ev.to_ranks < ev.from_ranks else "info", ev.pipeline, resized_text(ev), at=ev.time)

    def _finished(self, ev: m.PipelineFinished, _: PipelineProgress | None) -> None:
        level = "error" if ev.status == WorkerState.FAILED else "info"
        self.note(level, ev.pipeline, "finished " + finish_text(ev.status, ev.reason), at=ev.time)
        self._telemetry(self.telemetry, None)

    def _stalled(self, ev: m.Stalled, _: PipelineProgress | None) -> None:
        if ev.quiet:
            first = " since it started" if ev.first_step else ""
            self.note("warning", ev.pipeline, f"{quiet_text(ev.quiet)}{first}; d writes every process's Python "
                      "stack to its log (l shows it); nothing is killed", at=ev.time)
        else:
            self.note("info", ev.pipeline, "heard from again, no step yet" if ev.first_step else "stepping again",
                      at=ev.time)

    def _straggler(self, ev: h.Straggler, _: PipelineProgress | None) -> None:
        self.note("warning" if ev.ratio else "info", ev.pipeline, straggler_text(ev), at=ev.time)

    def _triage(self, ev: h.Triage, _: PipelineProgress | None) -> None:
        self.note("warning", ev.pipeline, f"triage: {ev.verdict} (stacks in {ev.folder})", at=ev.time)

    def _alert(self, ev: h.Alert, _: PipelineProgress | None) -> None:
        if ev.rule == h.FINISHED and not ev.bell:  # a completed run's summary (`[alerts] on_finish`): no banner
            self.note("info", "", f"{ev.title}: {ev.message}", at=ev.time)
            return
        self.alerts.append(ev)
        self.rows_version += 1  # the banner is redrawn with the rows
        self.note("error", ev.pipeline, f"ALERT {ev.title}: {ev.message}", at=ev.time)

    def _early_stop(self, ev: m.EarlyStop, _: PipelineProgress | None) -> None:
        self.note("info", ev.pipeline, f"early stop: {ev.reason}", at=ev.time)

    def _notice(self, ev: m.Notice, _: PipelineProgress | None) -> None:
        self.note(ev.level, ev.pipeline, ev.text, at=ev.time)

    def _run_finished(self, ev: m.RunFinished, _: PipelineProgress | None) -> None:
        self.finished = True
        self.rows_version += 1
        labels = {k: ended_label(v, *((self.rows[k].rung, self.rows[k].never_ran) if k in self.rows else ()))
                  for k, v in ev.statuses.items()}
        self.note("info" if ev.ok else "error", "", "run finished: " +
                  ", ".join(f"{k} {v}" for k, v in labels.items()), at=ev.time)
        self._telemetry(self.telemetry, None)
        self.telemetry_version += 1  # the pane says so when no reading ever came

    def _telemetry(self, ev: t.TelemetrySnapshot | None, _: PipelineProgress | None) -> None:
        """The newest readings, less those of pipelines that have finished and, once the run has, every
        process's (the validator's too): a process that is gone (the last pass before the end, or one that
        raced the finish, would show it as live)."""
        if ev is not None:
            rows = self._rows
            live = () if self.finished else tuple(
                p for p in ev.processes if p.pipeline not in rows or not rows[p.pipeline].state.final)
            ev = ev if len(live) == len(ev.processes) else replace(ev, processes=live)
        if ev is not self.telemetry:
            self.telemetry = ev
            self.telemetry_version += 1


_HANDLERS: dict[type[m.Event], Callable[[RunState, Any, PipelineProgress | None], None]] = {
    m.RunStarted: RunState._run_started,
    m.ConfigAdded: RunState._config_added,
    m.PipelineQueued: RunState._queued,
    m.PipelineWaiting: RunState._waiting,
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
    m.GangResized: RunState._resized,
    m.PipelineFinished: RunState._finished,
    m.EarlyStop: RunState._early_stop,
    m.Stalled: RunState._stalled,
    h.Straggler: RunState._straggler,
    h.Triage: RunState._triage,
    h.Alert: RunState._alert,
    m.Notice: RunState._notice,
    m.RunFinished: RunState._run_finished,
    t.TelemetrySnapshot: RunState._telemetry,
}


def commit_label(code: tuple[m.SourceCommit, ...]) -> str:
    """The first repository's commit, short, as the run header shows it: "@ab12cd3", "*" when its tree was dirty,
    "+N" for N more repositories; "" for none."""
    if not code:
        return ""
    first = code[0]
    return f"@{first.commit[:7]}{'*' if first.dirty else ''}{f'+{len(code) - 1}' if len(code) > 1 else ''}"
