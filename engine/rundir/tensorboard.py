"""TensorBoard event files of a run, written in the supervisor from its events (never in a worker) by
`tfrecord.py`: per pipeline its training loss, lr, every reported metric, validation results, samples/s, and
its GPUs' utilisation and memory; a sweep's trials also get one HParams session each, with the values they end
with, once the run has ended (tensorboardX builds that one).

`TensorBoardTap` writes a live session's on a thread of its own; `export_run` writes a past run's from its files.
Both thin the training curves (`StepThinning`: at most one point every STEP_EVERY seconds of the worker's clock,
the first and the newest before an epoch, attempt or run ends always kept); everything else is written whole.
"""
from __future__ import annotations

import asyncio
import math
import queue
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TypeGuard

from ..config.schema import RunConfig
from ..protocol.health import Alert
from ..protocol.messages import (
    EpochEnd,
    Event,
    PipelineFinished,
    RunFinished,
    RunStarted,
    SourceCommit,
    StepMetrics,
    TrainingStarted,
    TrialDecision,
    ValResult,
    WorkerStarted,
)
from ..protocol.progress import better, metric_value
from ..protocol.records import RecordError, from_record
from ..protocol.telemetry import TelemetrySnapshot
from .directory import load_resolved_configs, read_events, read_records
from .lines import Unreadable
from .tfrecord import EventFile

FOLDER = "tensorboard"  # under the run directory: `tensorboard --logdir runs/` shows every run
DRAIN_WAIT = 10.0  # seconds run_finished may wait for the files to be written and closed
FLUSH_SECS = 5.0  # seconds an event may wait in the file's buffer
HAND_OVER = 0.5  # seconds the loop collects events before it wakes the writer thread (it takes the GIL each time)
WRITTEN = (StepMetrics, EpochEnd, ValResult, WorkerStarted, TelemetrySnapshot, PipelineFinished, TrialDecision,
           TrainingStarted, Alert, RunFinished)
SESSION_WRITTEN = ".hparams-written"  # in a trial's folder: its HParams session is there (TensorBoard shows a
# run's first session only, so a resumed run writes none again)
RESUMABLE = ("stopped", "killed")  # a trial that ended so is resumed later: its session waits for its real end
# Seconds of a worker's own clock between two training points of a pipeline in the files (20 a second at most).
# TensorBoard shows 1,000 points of a chart, sampled evenly from all written, so a steady rate keeps the sample
# even along the run; a run shorter than 50 s that reports faster than this shows fewer, 20 a second.
STEP_EVERY = 0.05
ENDS = (EpochEnd, WorkerStarted, PipelineFinished, RunFinished)  # the newest step report held back goes first


class StepThinning:
    """Which step reports become TensorBoard points: a pipeline's first, then one at most every `every` seconds of
    the worker's clock (the time each report carries), and the newest held back whenever its epoch, its attempt
    or the run ends, so the curve ends where training did. A report whose extra metrics have other names than the
    last written one's is always kept, so a metric reported now and then loses no point."""

    def __init__(self, every: float = STEP_EVERY):
        self.every = every
        # Per pipeline: the worker's time of the last report written, when the next is due, and its metric names.
        self._written: dict[str, tuple[float, float, tuple[str, ...]]] = {}
        self._held: dict[str, StepMetrics] = {}  # per pipeline: the newest report not written

    def keep(self, event: StepMetrics) -> bool:
        """Whether `event` is written now; if not, it is held back as its pipeline's newest."""
        last = self._written.get(event.pipeline)
        metrics = event.metrics
        if last is not None and last[0] <= event.time < last[1] and (tuple(metrics) == last[2] if metrics
                                                                      else not last[2]):
            self._held[event.pipeline] = event
            return False
        # The first, one due, one with other metrics, or one from a clock that went back (the interval starts over).
        self._written[event.pipeline] = (event.time, event.time + self.every, tuple(metrics))
        self._held.pop(event.pipeline, None)
        return True

    def release(self, event: Event) -> list[StepMetrics]:
        """The reports held back that go before `event`: its pipeline's when an epoch, an attempt or the pipeline
        ends, every pipeline's when the run does (none for anything else)."""
        if not isinstance(event, ENDS):
            return []
        if isinstance(event, RunFinished):
            out = list(self._held.values())
            self._held.clear()
            return out
        if isinstance(event, WorkerStarted):
            self._written.pop(event.pipeline, None)  # a new attempt: its first report is kept
        held = self._held.pop(event.pipeline, None)
        return [] if held is None else [held]


def _finite(value: object) -> TypeGuard[float]:
    if type(value) is float:
        return value - value == 0.0  # not for inf or nan: the common case, without the calls below
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TensorBoardExport:
    """One event file per pipeline under `logdir`, fed the run's events in order."""

    def __init__(self, logdir: Path, config: RunConfig, live: bool = True):
        self.logdir = Path(logdir)
        self.live = live  # a live session writes the HParams at its run_finished; an export once it has read all
        self.metric, self.mode = config.validation.metric, config.validation.metric_mode
        self.trials = {p.name: dict(p.trial) for p in config.pipelines} if config.sweep is not None else {}
        self._ended: dict[str, PipelineFinished] = {}  # each trial's newest attempt end
        self._taking_over: set[str] = set()  # PBT trials exploited, not training from the copy yet
        self._writers: dict[str, EventFile] = {}
        self._steps: dict[str, int] = {}  # each pipeline's newest step: where telemetry is plotted
        self._gpus: dict[str, set[int]] = {}  # NVML indices of each pipeline's GPUs (from its device names)
        self._best: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.written: set[str] = set()  # pipelines with files
        self.commit = ""  # the code's commit, in each trial's HParams ("-dirty" after it when its tree was)

    def writer(self, pipeline: str) -> EventFile:
        w = self._writers.get(pipeline)
        if w is None:
            w = self._writers[pipeline] = EventFile(self.logdir / pipeline)
            self.written.add(pipeline)
        return w

    def _scalars(self, pipeline: str, values: Iterable[tuple[str, float | None]], step: int, wall: float) -> None:
        """One event of every finite value among `values` ((tag, value) pairs); nothing when none is."""
        finite = [(tag, float(v)) for tag, v in values if _finite(v)]
        if finite:
            self.writer(pipeline).scalars(finite, step, wall)

    def flush_due(self) -> None:
        """Hand every file's buffer to the OS that has held it FLUSH_SECS or more."""
        for w in self._writers.values():
            if w.due(FLUSH_SECS):
                w.flush()

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        """Write what `event` says (a bus tap: `kept` is unused; telemetry comes as a transient event)."""
        if isinstance(event, StepMetrics):
            self._steps[event.pipeline] = event.step
            values = [("train/loss", event.loss), ("train/lr", event.lr), ("train/samples_per_s", event.samples_per_s)]
            if event.metrics:
                values += [(f"train/{k}", v) for k, v in event.metrics.items()]
            self._scalars(event.pipeline, values, event.step, event.time)
        elif isinstance(event, EpochEnd):
            self._scalars(event.pipeline, (("epoch/train_loss", event.train_loss), ("epoch/duration_s", event.duration),
                                           ("epoch/samples_per_s", event.samples_per_s),
                                           *((f"epoch/{k}", v) for k, v in event.metrics.items())),
                          event.step, event.time)
        elif isinstance(event, ValResult) and not event.error:
            self._scalars(event.pipeline, ((f"val/{k}", v) for k, v in event.metrics.items()), event.step, event.time)
            value = metric_value(event.metrics, self.metric)
            if value is not None and event.pipeline not in self._taking_over:  # (else the old weights' result)
                self._last[event.pipeline] = value
                if better(value, self._best.get(event.pipeline), self.mode):
                    self._best[event.pipeline] = value
        elif isinstance(event, WorkerStarted):
            self._gpus[event.pipeline] = {int(i) for i in re.findall(r"gpu(\d+)", event.device)}
        elif isinstance(event, TelemetrySnapshot):
            self._telemetry(event)
        elif isinstance(event, PipelineFinished):
            self._ended[event.pipeline] = event
            if event.pipeline in self._writers:
                self._writers[event.pipeline].flush()
        elif isinstance(event, TrialDecision) and event.action == "exploit" and event.pipeline in self.trials:
            # It trains on from another trial's checkpoint with new values: its best is of its own weights since
            trial = self.trials[event.pipeline]
            trial.update({k: v for k, v in event.exploit.get("values", {}).items() if k in trial})
            self._best.pop(event.pipeline, None)
            self._taking_over.add(event.pipeline)
        elif isinstance(event, TrainingStarted):
            self._taking_over.discard(event.pipeline)
        elif isinstance(event, Alert):
            self._alert(event)
        elif isinstance(event, RunStarted):
            self.commit = commit_value(event.code)
        elif isinstance(event, RunFinished) and self.live:  # (an export writes on, into the same files, to its end)
            self.sessions(event.statuses)
            self.close()

    def _telemetry(self, snap: TelemetrySnapshot) -> None:
        for name, indices in self._gpus.items():
            step = self._steps.get(name, 0)
            self._scalars(name, [pair for g in snap.gpus if g.index in indices
                                 for pair in ((f"gpu{g.index}/util_percent", g.util_gpu),
                                              (f"gpu{g.index}/memory_used_bytes", g.mem_used))], step, snap.time)
        for p in snap.processes:
            if p.pipeline in self._steps:
                self._scalars(p.pipeline, (("process/cpu_percent", p.cpu_percent), ("process/rss_bytes", p.rss)),
                              self._steps[p.pipeline], snap.time)

    def _alert(self, alert: Alert) -> None:
        """An alert as text (TensorBoard's Text tab, tag alerts/RULE) at its pipeline's newest step; one of no
        pipeline (the disk's) in the file of every pipeline written so far."""
        from tensorboardX.summary import text

        for name in [alert.pipeline] if alert.pipeline else list(self._writers):
            w = self.writer(name)
            w.summary(text(f"alerts/{alert.rule}", f"{alert.title}: {alert.message}"), self._steps.get(name, 0),
                      alert.time)
            w.flush()

    def sessions(self, statuses: dict[str, str] | None = None) -> None:
        """Each trial's one HParams session (TensorBoard's HParams tab): the values it ended with, its status, its
        best and last metric. `statuses`: how the run ended each (a trial stopped or killed is resumed later, and
        written then); none: as its newest attempt ended, every trial (an export). A trial whose folder holds its
        session already gets none again."""
        for name, values in self.trials.items():
            ended = self._ended.get(name)
            status = (statuses or {}).get(name) or (ended.status if ended else "")
            folder = self.logdir / name
            if not status or (statuses is not None and status in RESUMABLE) or (folder / SESSION_WRITTEN).exists():
                continue
            self._session(name, values, status, ended)
            (folder / SESSION_WRITTEN).touch()

    def _session(self, name: str, values: dict, status: str, ended: PipelineFinished | None) -> None:
        from tensorboardX.summary import hparams

        metrics = {f"hparams/best_{self.metric}": self._best.get(name, math.nan),
                   f"hparams/last_{self.metric}": self._last.get(name, math.nan)}
        plain = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()}
        plain["status"] = status
        if self.commit:
            plain["commit"] = self.commit
        step, wall = (ended.step, ended.time) if ended else (self._steps.get(name, 0), time.time())
        w = self.writer(name)
        for summary in hparams(plain, metrics):
            w.summary(summary, step, wall)
        self._scalars(name, metrics.items(), step, wall)
        w.flush()

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()


class TensorBoardTap:
    """A live session's TensorBoard files, written on a thread of their own: the supervisor's loop only collects
    the events they take and hands them over every HAND_OVER seconds, a batch at a time (a sweep's HParams
    import tensorboardX, and torch with it: seconds the loop must not wait). At run_finished the loop waits
    (at most DRAIN_WAIT) until every file is written and closed, so readers find them whole."""

    def __init__(self, logdir: Path, config: RunConfig, code: tuple[SourceCommit, ...] = ()):
        """`code`: the session's commits (its run_started came before this tap was added)."""
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._batch: list[Event] = []  # collected on the loop, not handed over yet
        self.thinning = StepThinning()
        self.export = TensorBoardExport(logdir, config)
        self.export.commit = commit_value(code)
        self.errors = 0  # events that could not be written (a full disk, ...); the run goes on regardless
        threading.Thread(target=self._run, name="torchherd-tensorboard", daemon=True).start()

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        if type(event) is StepMetrics:
            if not self.thinning.keep(event):
                return  # a point TensorBoard would not show
            first = not self._batch
        elif isinstance(event, WRITTEN):
            first = not self._batch
            self._batch += self.thinning.release(event)
        else:
            return  # nothing in the files: not worth the thread's time
        self._batch.append(event)
        if isinstance(event, RunFinished):
            self._hand_over()
            done = threading.Event()
            self._queue.put(done)
            done.wait(DRAIN_WAIT)
        elif first:
            self._hand_over_soon()

    def on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        """A run of step reports at once (the bulk of a worker's batch): `on_event` of each, in one call."""
        keep = self.thinning.keep
        kept = [event for event in steps if keep(event)]
        if kept:
            first = not self._batch
            self._batch += kept
            if first:
                self._hand_over_soon()

    def _hand_over_soon(self) -> None:
        try:
            asyncio.get_running_loop().call_later(HAND_OVER, self._hand_over)
        except RuntimeError:  # no loop (a caller of its own): at once
            self._hand_over()

    def _hand_over(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._queue.put(batch)

    def _run(self) -> None:
        if self.export.trials:  # a sweep's HParams need tensorboardX, and torch with it: import it before
            try:                # the first trial ends rather than hold the files' writes up then
                import tensorboardX.summary  # noqa: F401
            except Exception:  # noqa: BLE001 (its HParams will say why, when written)
                pass
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            for event in item:
                try:
                    self.export.on_event(event)
                except Exception:  # noqa: BLE001 (the files are a copy of events.jsonl: never worth a run)
                    self.errors += 1
            try:
                self.export.flush_due()
            except OSError:
                self.errors += 1


def commit_value(code: tuple[SourceCommit, ...]) -> str:
    """The first repository's commit as an HParams value: its hash, "-dirty" after it when its tree was."""
    return f"{code[0].commit}{'-dirty' if code[0].dirty else ''}" if code else ""


def export_run(run_dir: Path, logdir: Path, unreadable: Unreadable | None = None) -> int:
    """Write a past run's TensorBoard files into `logdir` from its events.jsonl and telemetry.jsonl
    (the telemetry in its time order among the events); returns the pipelines written. Lines that are no
    record, or whose fields do not fit, are skipped and counted in `unreadable`."""
    run_dir = Path(run_dir)
    configs = load_resolved_configs(run_dir)
    for name in (p.name for config in configs for p in config.pipelines):
        if any((Path(logdir) / name).glob("events.out.tfevents.*")):  # TensorBoard would draw each curve twice
            raise ValueError(f"{Path(logdir) / name} already holds TensorBoard files (an earlier export, or the "
                             "run's own): export to another folder, or remove them first")
    export = TensorBoardExport(logdir, configs[0], live=False)
    events: list[Event] = read_events(run_dir, unreadable)
    telemetry, bad = run_dir / "telemetry.jsonl", 0
    for record in read_records(telemetry, unreadable):
        try:
            found = from_record(record)
        except RecordError:
            bad += 1
            continue
        if isinstance(found, Event):  # telemetry.jsonl holds nothing else
            events.append(found)
    if unreadable is not None:
        unreadable.add(telemetry, bad)
    events.sort(key=lambda e: e.time)
    thinning = StepThinning()  # the same points a live run's files have
    for event in events:
        if type(event) is StepMetrics:
            if thinning.keep(event):
                export.on_event(event)
            continue
        for held in thinning.release(event):
            export.on_event(held)
        export.on_event(event)
    export.sessions()
    export.close()
    return len(export.written)
