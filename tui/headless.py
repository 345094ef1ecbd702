"""What a headless client prints: one line per event worth reading (`LinePrinter`), the clock in each line
starting when the command did, and the exit status a run's end gives (`exit_status`).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..engine.protocol.control import ClientCommand
from ..engine.protocol.health import Alert, Straggler, Triage
from ..engine.protocol.messages import (
    CheckpointSaved,
    ConfigAdded,
    EarlyStop,
    EpochEnd,
    Event,
    GangResized,
    Notice,
    PipelineFinished,
    PipelineWaiting,
    Resumed,
    RunFinished,
    RunStarted,
    SnapshotSkipped,
    Stalled,
    StepMetrics,
    TasksChecked,
    TrainingStarted,
    TrialDecision,
    ValidatorStarted,
    ValResult,
    WorkerError,
    WorkerExited,
    WorkerRestarting,
    WorkerStarted,
)
from ..engine.protocol.names import ExitReason, ValidationMode
from ..engine.protocol.states import SUCCESS_STATES, WorkerState, ended_label
from .formats import checkpoint_cost, quiet_text, resized_text, shown_path, straggler_text

EXIT_OK = 0
EXIT_FAILED = 1  # some pipeline failed or was killed
EXIT_CONFIG = 2  # the config is invalid; nothing launched
EXIT_STOPPED = 3  # stopped before every pipeline completed (Ctrl-C, SIGTERM, SIGHUP)
STEP_LINE_EVERY = 10.0  # seconds between the step lines of a pipeline that has not ended an epoch yet


def _fmt(value: float | None, spec: str = ".4f") -> str:
    """A loss or metric: four decimals as a rule, the table's short form for one too large or small for them
    (not 10075952236906147840.0000)."""
    if value is None:
        return "-"
    if value != 0 and math.isfinite(value) and not 1e-3 <= abs(value) < 1e5:
        from .formats import fmt_num
        return fmt_num(value, 9)
    return format(value, spec)


TRACEBACK = "Traceback (most recent call last)"


class LinePrinter:
    """Turns events into the lines a person watching a headless run wants to read."""

    def __init__(self, out: TextIO, metric: str = "val_loss", start: float | None = None):
        self.out = out
        self.metric = metric
        self.val: dict[str, tuple[int, dict[str, float]]] = {}
        self.skipped: dict[str, int] = {}
        self.gone = False
        self.start = time.monotonic() if start is None else start  # time.monotonic() seconds
        self.per_epoch: dict[str, int] = {}  # steps per epoch, once a pipeline has said
        self.tracebacks: set[str] = set()  # printed already: a crash loop prints its traceback once
        self.totals: dict[str, int] = {}  # steps in all, once a pipeline has said (0: unknown)
        self.epochs_seen: set[str] = set()  # pipelines that ended an epoch: their epoch lines say enough
        self.step_line_at: dict[str, float] = {}
        self.run_id = "RUN"  # named by run_started
        self.ended: dict[str, str] = {}  # each ended pipeline's state as people read it ('early stop', ...)
        self.refused: list[str] = []  # the problems of tasks that did not build: the run trained nothing
        self.run_dir: Path | None = None  # named by run_started
        self.results: list[Event] = []  # val_result and trial_decision events: a sweep's ranking at the end
        # Set (by_event_time): lines show seconds from the run's start by each event's own stamp, as a history
        # printed at once needs; None: seconds on this printer's clock from `start`.
        self.run_began: float | None = None
        self.by_events = False
        self.at = 0.0  # the stamp of the event being printed

    def where(self, pipeline: str, epoch: int, step: int) -> str:
        """A saved state's place as people count epochs: 'after epoch 2' or 'in epoch 3, step 2,600'."""
        per_epoch = self.per_epoch.get(pipeline, 0)
        if per_epoch and step == epoch * per_epoch and epoch:
            return f"after epoch {epoch}, step {step:,}"
        return f"in epoch {epoch + 1}, step {step:,}"

    def by_event_time(self) -> None:
        """Time lines by the events' stamps from the run's start (once its run_started is seen): for a history."""
        self.by_events = True

    def line(self, text: str) -> None:
        if self.run_began is not None:
            elapsed = self.at - self.run_began
        else:
            elapsed = time.monotonic() - self.start
        self.write(f"[{elapsed:7.1f}s] {text}\n")

    def write(self, text: str) -> None:
        """Print, unless the terminal is gone (SSH dropped): then the run carries on silently."""
        if self.gone:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):  # EIO, EPIPE, or a closed stream
            self.gone = True

    def end(self, text: str, code: int, **facts: Any) -> int:
        """The client's last words on how the run ended: `text` for a person (--json: one `end` object with its
        exit status, `facts` and `text`); returns `code`."""
        self.write(text)
        return code

    def close(self, code: int, why: str = "") -> int:
        """The exit status `code` of a command whose run never got to an end (a config refused, a start that
        failed): a person has read `why` on stderr already; --json says it in an `end` object."""
        return code

    def handle(self, ev: Event) -> None:
        """Print what `ev` is worth to a person watching (often nothing)."""
        method = _LINES.get(type(ev))
        if method is not None:
            self.at = ev.time
            method(self, ev)

    def _run_started(self, ev: RunStarted) -> None:
        self.run_id = ev.run_id
        if self.run_dir is None:  # a client's own path to the folder comes first (the run's may be relative)
            self.run_dir = Path(ev.run_dir)
        if self.by_events and self.run_began is None:
            self.run_began = ev.time
        self.line(f"run {ev.run_id}: {len(ev.pipelines)} pipeline(s), writing {shown_path(self.run_dir)}")

    def _config_added(self, ev: ConfigAdded) -> None:
        self.line(f"config {ev.name} added to run {self.run_id}: {', '.join(ev.pipelines)}")

    def _tasks_checked(self, ev: TasksChecked) -> None:
        noun = f"{ev.tasks} task{'s' if ev.tasks != 1 else ''}"
        if not ev.problems:
            self.line(f"{noun} built in {ev.seconds:.1f}s")
            return
        self.refused = list(ev.problems)
        self.line(f"checking failed after {ev.seconds:.1f}s: every pipeline stopped before its first step")

    def _worker_started(self, ev: WorkerStarted) -> None:
        where = f"{ev.device} of node {ev.node}" if ev.node else ev.device
        size = f"{len(ev.pids) or 1} of {ev.min_ranks}:{ev.max_ranks} ranks, " if ev.max_ranks else ""  # elastic
        if ev.pids:  # a gang: every rank
            size = size or f"{len(ev.pids)} ranks, "
            self.line(f"{ev.pipeline}: started {size}pids {', '.join(map(str, ev.pids))}, "
                      f"on {where} (attempt {ev.attempt})")
        else:
            self.line(f"{ev.pipeline}: started {size}pid {ev.pid} on {where} (attempt {ev.attempt})")

    def _resumed(self, ev: Resumed) -> None:
        note = f" ({ev.note})" if ev.note else ""
        self.line(f"{ev.pipeline}: resumed from its checkpoint {self.where(ev.pipeline, ev.epoch, ev.step)}{note}")

    def _training_started(self, ev: TrainingStarted) -> None:
        self.per_epoch[ev.pipeline] = ev.steps_per_epoch
        self.totals[ev.pipeline] = ev.epochs_total * ev.steps_per_epoch
        self.step_line_at[ev.pipeline] = time.monotonic()  # the first line 10 s in: short epochs print none

    def _step(self, ev: StepMetrics) -> None:
        """Before its first epoch ends (a script that counts iterations never ends one), a line now and then;
        only where the length in steps is known (a script that prints epochs reports a step with each)."""
        now = time.monotonic()
        total = self.totals.get(ev.pipeline, 0)
        if not total or ev.pipeline in self.epochs_seen or \
                now - self.step_line_at.get(ev.pipeline, -STEP_LINE_EVERY) < STEP_LINE_EVERY:
            return
        self.step_line_at[ev.pipeline] = now
        val = self.val.get(ev.pipeline)
        self.line(f"{ev.pipeline}: step {ev.step:,}/{total:,} train {_fmt(ev.loss)} "
                  f"val {_fmt(val[1].get('val_loss') if val else None)}")

    def _epoch_end(self, ev: EpochEnd) -> None:
        self.per_epoch[ev.pipeline] = ev.steps_per_epoch
        self.epochs_seen.add(ev.pipeline)
        val = self.val.get(ev.pipeline)
        val_text = "val -"
        if val is not None:
            epoch, metrics = val
            extra = " ".join(f"{k} {_fmt(v)}" for k, v in metrics.items() if k != "val_loss")
            val_text = f"val {_fmt(metrics.get('val_loss'))}" + (f" {extra}" if extra else "")
            if epoch != ev.epoch:
                val_text += f" (epoch {epoch + 1})"
        rate = f" {ev.samples_per_s:,.0f} samples/s" if ev.samples_per_s else ""  # a script may not say (None)
        of = f"/{ev.epochs_total}" if ev.epochs_total else ""  # a script's total is unknown without max_epochs
        self.line(f"{ev.pipeline}: epoch {ev.epoch + 1}{of} train {_fmt(ev.train_loss)} {val_text}{rate}")

    def _val_result(self, ev: ValResult) -> None:
        if ev.error:
            self.line(f"{ev.pipeline}: validation failed: {ev.error} (training goes on)")
            for line in ev.traceback.rstrip().splitlines()[-6:]:
                self.write(f"    {line}\n")
            return
        self.val[ev.pipeline] = (ev.epoch, ev.metrics)
        self.results.append(ev)
        if ev.mode != ValidationMode.INLINE:  # inline results show in the epoch's line
            skipped = self.skipped.pop(ev.pipeline, 0)
            said = " ".join(f"{k} {_fmt(v)}" for k, v in ev.metrics.items()) or "no metrics (nothing logged)"
            self.line(f"{ev.pipeline}: validated epoch {ev.epoch + 1} step {ev.step}: {said}" +
                      f" ({ev.latency:.1f}s after hand-off" +
                      (f"; {skipped} older snapshot(s) skipped)" if skipped else ")"))

    def _snapshot_skipped(self, ev: SnapshotSkipped) -> None:
        self.skipped[ev.pipeline] = self.skipped.get(ev.pipeline, 0) + 1

    def _validator_started(self, ev: ValidatorStarted) -> None:
        self.line(f"validator: started pid {ev.pid}, {ev.device} (attempt {ev.attempt})")

    def _early_stop(self, ev: EarlyStop) -> None:
        self.line(f"{ev.pipeline}: {ev.reason}")

    def _checkpoint(self, ev: CheckpointSaved) -> None:
        if ev.reason in ("stop", "request"):  # the others come every epoch: not worth a line
            self.line(f"{ev.pipeline}: checkpoint {ev.path} ({self.where(ev.pipeline, ev.epoch, ev.step)})"
                      f"{checkpoint_cost(ev)}")

    def _worker_error(self, ev: WorkerError) -> None:
        self.line(f"{ev.pipeline}: error during {ev.where}: {ev.error}")
        # the traceback itself decides "the same": the output lines a script's report shows before it vary
        key = ev.traceback[ev.traceback.find(TRACEBACK):] if TRACEBACK in ev.traceback else ev.traceback
        if ev.traceback and key in self.tracebacks:
            self.write("    (the same traceback as above)\n")
        elif ev.traceback:
            self.tracebacks.add(key)
            for line in ev.traceback.rstrip().splitlines():
                self.write(f"    {line}\n")

    def _worker_exited(self, ev: WorkerExited) -> None:
        if ev.reason in (ExitReason.CRASHED, ExitReason.FAILED):  # other exits: the lines around say why
            how = f"signal {ev.signal}" if ev.signal else f"exit code {ev.exit_code}"
            rank = f"rank {ev.rank} (worker pid {ev.pid})" if ev.rank else f"worker pid {ev.pid}"  # a gang's cause
            self.line(f"{ev.pipeline}: {rank} {ev.reason} ({how}) after {ev.uptime:.1f}s")

    def _restarting(self, ev: WorkerRestarting) -> None:
        self.line(f"{ev.pipeline}: restarting in {ev.delay:.1f}s (attempt {ev.attempt}, "
                  f"{ev.restarts_left} restart(s) left): {ev.reason}")

    def _resized(self, ev: GangResized) -> None:
        self.line(f"{ev.pipeline}: {resized_text(ev)}")

    def _waiting(self, ev: PipelineWaiting) -> None:
        if ev.why:  # "" : nothing outside the run holds it up any more
            self.line(f"{ev.pipeline}: {ev.why}")

    def _notice(self, ev: Notice) -> None:
        who = f"{ev.pipeline}: " if ev.pipeline else ""
        self.line(f"{who}{ev.level}: {ev.text}")

    def _pipeline_finished(self, ev: PipelineFinished) -> None:
        label = ended_label(ev.status, ev.rung, ev.never_ran)
        reason = f" ({ev.reason})" if ev.reason else ""
        self.ended[ev.pipeline] = label
        self.line(f"{ev.pipeline}: {self.ended[ev.pipeline]}{reason}")

    def _client_command(self, ev: ClientCommand) -> None:
        what = f"{ev.action} {ev.pipeline}" if ev.pipeline else f"{ev.action} every pipeline"
        self.line(f"client pid {ev.client_pid}: {what}" + ("" if ev.ok else f" refused: {ev.text}"))

    def _stalled(self, ev: Stalled) -> None:
        if not ev.quiet:
            self.line(f"{ev.pipeline}: {'heard from again, no step yet' if ev.first_step else 'stepping again'}")
            return
        first = " since it started" if ev.first_step else ""
        self.line(f"{ev.pipeline}: {quiet_text(ev.quiet)}{first}; nothing is killed. "
                  f"`torchherd stacks {self.run_id} {ev.pipeline}` writes every process's Python stack to its log")

    def _straggler(self, ev: Straggler) -> None:
        self.line(f"{ev.pipeline}: {straggler_text(ev)}")

    def _triage(self, ev: Triage) -> None:
        self.line(f"{ev.pipeline}: triage: {ev.verdict} (stacks in {ev.folder})")

    def _alert(self, ev: Alert) -> None:
        self.line(f"ALERT {ev.rule}: {ev.title}: {ev.message}")

    def _run_finished(self, ev: RunFinished) -> None:
        summary = ", ".join(f"{k} {self.ended.get(k, v)}" for k, v in ev.statuses.items())
        self.line(f"run finished: {summary}")
        for line in self.sweep_ranking(ev.statuses):
            self.write(line + "\n")

    def _trial_decision(self, ev: TrialDecision) -> None:
        self.results.append(ev)  # a prune shows as the pipeline's end, with this reason
        if ev.action == "exploit":  # PBT: it ends only to train on from the donor's checkpoint
            self.line(f"{ev.pipeline}: {ev.reason}")

    def sweep_ranking(self, statuses: dict[str, str]) -> list[str]:
        """A sweep's trials ranked by the metric (none for a run that is no sweep), those seen here too."""
        from .ranking import sweep_ranking

        if self.run_dir is None:
            return []
        return sweep_ranking(self.run_dir, {k: self.ended.get(k, v) for k, v in statuses.items()}, self.results)


_LINES: dict[type[Event], Callable[[LinePrinter, Any], None]] = {
    RunStarted: LinePrinter._run_started,
    ConfigAdded: LinePrinter._config_added,
    Stalled: LinePrinter._stalled,
    TasksChecked: LinePrinter._tasks_checked,
    WorkerStarted: LinePrinter._worker_started,
    Resumed: LinePrinter._resumed,
    TrainingStarted: LinePrinter._training_started,
    StepMetrics: LinePrinter._step,
    EpochEnd: LinePrinter._epoch_end,
    ValResult: LinePrinter._val_result,
    SnapshotSkipped: LinePrinter._snapshot_skipped,
    ValidatorStarted: LinePrinter._validator_started,
    EarlyStop: LinePrinter._early_stop,
    CheckpointSaved: LinePrinter._checkpoint,
    WorkerError: LinePrinter._worker_error,
    WorkerExited: LinePrinter._worker_exited,
    WorkerRestarting: LinePrinter._restarting,
    GangResized: LinePrinter._resized,
    Notice: LinePrinter._notice,
    PipelineWaiting: LinePrinter._waiting,
    PipelineFinished: LinePrinter._pipeline_finished,
    RunFinished: LinePrinter._run_finished,
    ClientCommand: LinePrinter._client_command,
    TrialDecision: LinePrinter._trial_decision,
    Straggler: LinePrinter._straggler,
    Triage: LinePrinter._triage,
    Alert: LinePrinter._alert,
}


def exit_status(statuses: dict[str, str]) -> int:
    """The command's exit status from every pipeline's final state."""
    values = set(statuses.values())
    if values <= SUCCESS_STATES:  # completed, early-stopped, pruned
        return EXIT_OK
    if values & {WorkerState.FAILED, WorkerState.KILLED}:
        return EXIT_FAILED
    return EXIT_STOPPED
