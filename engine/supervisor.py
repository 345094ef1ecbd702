"""The supervisor: an asyncio object that owns every worker process of a run and reports on them.

It places pipelines on device slots, starts workers through a launcher, reads
their events without blocking the event loop, applies the restart policy, writes
the run directory and hands every event to its subscribers (the app, the
headless CLI). All its methods run on one event loop; none of them blocks.
"""
from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from torchherd.engine.channel import EXIT_COMPLETED, EXIT_FATAL, EXIT_RESTART, EXIT_STOPPED
from torchherd.engine.config import ConfigError, Pipeline, RunConfig
from torchherd.engine.devices import Inventory, discover_devices
from torchherd.engine.launcher import LaunchSpec, ProcessLauncher, WorkerHandle, WorkerSpec
from torchherd.engine.messages import (CheckpointNow, EarlyStop, EpochEnd, Event, Heartbeat, Notice, SnapshotSkipped,
                             SnapshotTaken, ValidatorStarted, Pause, PipelineFinished, PipelineQueued,
                             Resume, RunFinished, RunStarted, StepMetrics, Stop, TrainingStarted, ValResult,
                             TelemetrySnapshot, WorkerError, WorkerExited, WorkerRestarting, WorkerStarted,
                             WorkerStateChanged)
from torchherd.engine.placement import Slot, ValidationPlan, plan_slots, plan_validation
from torchherd.engine.policy import RestartPolicy
from torchherd.engine.rundir import (RunDirectory, claim_root, load_resolved_configs, new_run_id, read_events, remove_root,
                           snapshot_root)
from torchherd.engine.states import WorkerState, check_transition
from torchherd.engine.telemetry import TelemetrySampler

S = WorkerState
TICK = 0.1  # seconds between supervision passes
VALIDATOR_BACKOFF = (1.0, 30.0)  # seconds: first and longest delay before restarting the validator
VALIDATION_DRAIN = 120.0  # seconds the run waits, all training done, for results that make no progress
HANG_DUMP_WAIT = 1.0  # seconds between asking a hung worker for its stack and killing it
HISTORY = 100_000  # events kept in memory for late subscribers


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


@dataclass
class _Run:
    """One pipeline: its plan (config, policy) and the state of its current worker."""

    config: Pipeline
    run_config: RunConfig
    policy: RestartPolicy
    order: int
    state: WorkerState = S.QUEUED
    slot: Slot | None = None
    handle: WorkerHandle | None = None
    attempt: int = 0
    restarts: int = 0  # restarts spent from the budget
    failed_starts: int = 0  # consecutive
    started_mono: float = 0.0
    started_at: float | None = None
    deadline: float | None = None  # monotonic time to escalate (KILLING / STOPPING)
    restart_at: float | None = None  # monotonic time to leave BACKOFF
    intent: str | None = None  # "stop", "kill" or "restart": why we asked it to end
    stop_reason: str = ""
    escalated: bool = False
    last_progress: float = 0.0  # monotonic time of the worker's last sign of training
    epoch: int = 0
    step: int = 0
    epochs_total: int = 0
    steps_per_epoch: int = 0
    train_loss: float | None = None
    val_loss: float | None = None
    best_val: float | None = None
    samples_per_s: float | None = None
    last_error: str = ""
    last_traceback: str = ""
    finish_reason: str = ""
    validation: ValidationPlan | None = None
    handed: dict[int, tuple[int, int]] = field(default_factory=dict)  # snapshot seq -> (epoch, step), unscored
    validation_broken: bool = False  # the validator cannot score this pipeline at all
    scored: set[int] = field(default_factory=set)  # snapshot seqs with a result
    scored_max: int = 0
    seq_max: int = 0  # highest snapshot seq any attempt handed off


@dataclass
class _Validator:
    """The one background validation process of a session."""

    plan: ValidationPlan
    handle: WorkerHandle | None = None
    attempt: int = 0
    restart_at: float | None = None
    failures: int = 0  # consecutive deaths; sets the backoff
    started_mono: float = 0.0


class EventStream:
    """An async iterator of a supervisor's events; ends when the supervisor closes."""

    def __init__(self, queue: asyncio.Queue):
        self._queue = queue

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> Event:
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def get_nowait(self) -> Event | None:
        """The next event if one is waiting, else None (also None once closed)."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None


class Supervisor:
    """Runs the pipelines of one or more configs as supervised worker processes."""

    def __init__(self, config: RunConfig, *, runs_dir: str | Path | None = None,
                 launcher: object | None = None, inventory: Inventory | None = None,
                 run_id: str | None = None, tick: float = TICK):
        self.config = config
        self.inventory = inventory if inventory is not None else discover_devices()
        slots, problems = plan_slots(config.devices, self.inventory, config.source)
        if problems:
            raise ConfigError(problems)
        self._slots = slots
        self._free: list[Slot] = list(slots)
        self._launcher = launcher if launcher is not None else ProcessLauncher()
        base = Path(runs_dir if runs_dir is not None else config.runs_dir)
        self.run_id = run_id or new_run_id(base, config.name)
        self.run_dir = base / self.run_id
        self._tick_interval = tick
        self._runs: dict[str, _Run] = {}
        self._order = 0
        self._subscribers: list[asyncio.Queue] = []
        self._history: deque[Event] = deque(maxlen=HISTORY)
        self._rundir: RunDirectory | None = None
        self._tick_task: asyncio.Task | None = None
        self._finished = asyncio.Event()
        self._finished_sent = False
        self._closed = False
        self._closing = False  # shutdown has begun: no more restarts of the validator
        self._pids: dict[str, int] = {}  # replaced whole on change: the sampler thread reads it
        self._sampler: TelemetrySampler | None = None
        self._validator: _Validator | None = None
        self._resume_configs: list[RunConfig] | None = None
        self._last_result = time.monotonic()  # when the validator last reported
        self._drain_start: float | None = None  # when training ended with results still to come
        self.snapshot_root = snapshot_root(self.run_id, self.run_dir)
        self.telemetry: TelemetrySnapshot | None = None  # the newest sample

    # ------------------------------------------------------------ public

    @classmethod
    def resume_run(cls, run_dir: str | Path, **kwargs) -> "Supervisor":
        """A supervisor that carries on an unfinished run: same directory, each pipeline from its checkpoint."""
        run_dir = Path(run_dir)
        configs = load_resolved_configs(run_dir)
        sup = cls(configs[0], runs_dir=run_dir.parent, run_id=run_dir.name, **kwargs)
        sup._resume_configs = configs
        return sup

    async def start(self) -> None:
        """Create the run directory and start the pipelines that fit on the slots."""
        if self._rundir is not None:
            raise RuntimeError("supervisor already started")
        resuming = self._resume_configs is not None
        done: dict[str, str] = {}
        if resuming:
            done = {e.pipeline: e.status for e in read_events(self.run_dir) if isinstance(e, PipelineFinished)}
        self._rundir = RunDirectory(self.run_dir)
        self._rundir.resuming = resuming
        self._rundir.save_config(self.config)
        names = self._add(self.config)
        for config in (self._resume_configs or [])[1:]:
            names += self._add(config)
        for name in names:
            if done.get(name) == "completed":  # nothing left to train; keep it out of the queue
                self._runs[name].state = S.COMPLETED
                self._runs[name].finish_reason = "completed before the run was resumed"
        if resuming:
            self._emit(Notice(level="info", text=f"resuming run {self.run_id}: " + ", ".join(
                f"{n} {'done' if done.get(n) == 'completed' else 'from its last checkpoint'}" for n in names)))
        self._emit(RunStarted(run_id=self.run_id, run_dir=str(self.run_dir), config_path=self.config.source,
                              pipelines=tuple(names)))
        self._queue_events(names)
        self._schedule()
        loop = asyncio.get_running_loop()
        self._tick_task = loop.create_task(self._tick_loop(), name="torchherd-supervisor")
        t = self.config.telemetry
        if t.enabled:
            self._sampler = TelemetrySampler(
                interval=t.interval, pids=lambda: self._pids,
                on_snapshot=lambda snap: loop.call_soon_threadsafe(self._on_telemetry, snap),
                persist_path=self.run_dir / "telemetry.jsonl", persist_every=t.persist_every)
            self._sampler.start()

    def add_config(self, config: RunConfig) -> list[str]:
        """Add another config's pipelines to this session; they queue for free slots. Returns their names."""
        if self._rundir is None or self._closed:
            raise RuntimeError("supervisor is not running")
        self._rundir.save_config(config)
        names = self._add(config)
        self._queue_events(names)
        self._finished.clear()
        self._finished_sent = False
        self._schedule()
        return names

    def subscribe(self, replay: bool = True) -> EventStream:
        """A stream of every event from now on (and, with `replay`, those already emitted)."""
        queue: asyncio.Queue = asyncio.Queue()
        if replay:
            for event in self._history:
                queue.put_nowait(event)
        if self._closed:
            queue.put_nowait(None)
        self._subscribers.append(queue)
        return EventStream(queue)

    def views(self) -> list[PipelineView]:
        """Every pipeline, in the order they were added."""
        return [self._view(r) for r in self._runs.values()]

    def view(self, name: str) -> PipelineView:
        return self._view(self._get(name))

    @property
    def alive(self) -> bool:
        """Some worker process exists."""
        return any(r.handle is not None for r in self._runs.values())

    @property
    def validator_pid(self) -> int | None:
        """The background validator's pid while it runs."""
        v = self._validator
        return v.handle.pid if v is not None and v.handle is not None else None

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    async def wait(self) -> dict[str, str]:
        """Wait until every pipeline has a final status; returns them by name."""
        await self._finished.wait()
        return {n: r.state.value for n, r in self._runs.items()}

    def stop(self, name: str | None = None, reason: str = "requested") -> None:
        """Gracefully stop one pipeline (or all): finish the step, checkpoint, exit."""
        for run in self._select(name):
            if run.state in (S.QUEUED, S.BACKOFF):
                run.finish_reason = "stopped before it started" if run.state == S.QUEUED else "stopped"
                self._finish(run, S.STOPPED)  # QUEUED/BACKOFF -> STOPPED
            elif run.state in (S.STARTING, S.RUNNING, S.PAUSED):
                run.intent, run.stop_reason = "stop", reason
                run.deadline = time.monotonic() + run.run_config.restart.stop_timeout
                self._send(run, Stop(reason=reason))
                self._set_state(run, S.STOPPING)  # STARTING/RUNNING/PAUSED -> STOPPING
            elif run.state in (S.KILLING, S.HUNG) and run.intent in ("restart", "hung"):
                # Already on its way out to be started again: let it end there instead.
                run.intent, run.stop_reason = "stop", reason
        self._check_finished()

    def pause(self, name: str) -> None:
        run = self._get(name)
        if run.state in (S.STARTING, S.RUNNING):
            self._send(run, Pause())
            self._set_state(run, S.PAUSED)  # STARTING/RUNNING -> PAUSED

    def resume(self, name: str) -> None:
        run = self._get(name)
        if run.state == S.PAUSED:
            run.last_progress = time.monotonic()
            self._send(run, Resume())
            self._set_state(run, S.RUNNING)  # PAUSED -> RUNNING

    def checkpoint(self, name: str) -> None:
        run = self._get(name)
        if run.state in (S.STARTING, S.RUNNING, S.PAUSED):
            self._send(run, CheckpointNow())

    def kill(self, name: str) -> None:
        """SIGTERM to the worker's process group, SIGKILL after the grace period."""
        run = self._get(name)
        if run.state in (S.QUEUED, S.BACKOFF):
            run.finish_reason = "killed before it started"
            self._finish(run, S.KILLED)  # QUEUED/BACKOFF -> KILLED
        elif run.handle is not None and run.state != S.KILLING:
            run.intent = "kill"
            self._terminate(run)
        elif run.state == S.KILLING:
            run.intent = "kill"  # a restart in progress becomes a kill
        self._check_finished()

    def restart(self, name: str) -> None:
        """Kill the worker and start it again from its last checkpoint (no restart budget spent)."""
        run = self._get(name)
        if run.handle is not None:
            run.intent = "restart"
            if run.state != S.KILLING:
                self._terminate(run)
        elif run.state == S.BACKOFF:
            self._launch(run)
        elif run.state.final:
            run.failed_starts = 0
            run.finish_reason = ""
            self._set_state(run, S.QUEUED)  # final -> QUEUED: a person asked for another go
            self._finished.clear()
            self._finished_sent = False
            self._queue_events([run.config.name])
            self._schedule()

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """End the session: stop (or kill) every worker, flush the run directory, end the streams."""
        if self._closed:
            return
        if self._rundir is None:
            self._closed = True
            return
        if graceful:
            self.stop(reason="shutdown")
            deadline = time.monotonic() + timeout
            while self.alive and time.monotonic() < deadline:
                await asyncio.sleep(self._tick_interval)
            # Let the validator score what the stopped workers handed off last.
            while self._validation_pending() and time.monotonic() < deadline and \
                    self._validator is not None and self._validator.handle is not None:
                await asyncio.sleep(self._tick_interval)
        self._closing = True
        v = self._validator
        if v is not None and v.handle is not None:
            v.handle.send(Stop(reason="shutdown"))
            end = time.monotonic() + 5.0
            while v.handle.poll() is None and time.monotonic() < end:
                await asyncio.sleep(0.02)
            self._on_validator_events(v.handle, v.handle.drain())
            v.handle.close()
            v.handle = None
        for run in self._runs.values():
            if run.handle is not None:
                if run.intent != "stop":
                    run.intent = "kill"
                if run.state != S.KILLING:
                    self._set_state(run, S.KILLING)  # alive -> KILLING
                run.handle.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while self.alive and time.monotonic() < deadline:
            self._tick()
            await asyncio.sleep(0.02)
        for run in self._runs.values():
            if not run.state.final and run.handle is None:
                run.finish_reason = run.finish_reason or "session ended"
                self._finish(run, S.KILLED if run.state != S.STOPPING else S.STOPPED)
        self._check_finished()
        if self._sampler is not None:
            await asyncio.to_thread(self._sampler.stop)
        if self._tick_task is not None:
            self._tick_task.cancel()
            try:
                await self._tick_task
            except asyncio.CancelledError:
                pass
        self._closed = True
        remove_root(self.snapshot_root)
        self._rundir.close()
        for queue in self._subscribers:
            queue.put_nowait(None)

    # ---------------------------------------------------------- internals

    def _get(self, name: str) -> _Run:
        try:
            return self._runs[name]
        except KeyError:
            raise KeyError(f"no pipeline named {name!r}") from None

    def _select(self, name: str | None) -> list[_Run]:
        return list(self._runs.values()) if name is None else [self._get(name)]

    def _add(self, config: RunConfig) -> list[str]:
        policy = RestartPolicy(config.restart)
        plan = plan_validation(config, self._slots, self.inventory)
        if plan.mode == "background" and self._validator is None:
            self._validator = _Validator(plan)
            self._launch_validator()
        names = []
        for pipe in config.pipelines:
            name = pipe.name
            n = 2
            while name in self._runs:
                name = f"{pipe.name}-{n}"
                n += 1
            if name != pipe.name:
                pipe = pipe.model_copy(update={"name": name})
            self._runs[name] = _Run(config=pipe, run_config=config, policy=policy, order=self._order,
                                    epochs_total=pipe.max_epochs, validation=plan)
            self._order += 1
            names.append(name)
        return names

    def _queue_events(self, names: list[str]) -> None:
        queued = self._queued()
        for name in names:
            run = self._runs[name]
            if run.state != S.QUEUED:
                continue
            self._emit(PipelineQueued(pipeline=name, priority=run.config.priority,
                                      position=queued.index(run) + 1 if run in queued else 0))

    def _queued(self) -> list[_Run]:
        waiting = [r for r in self._runs.values() if r.state == S.QUEUED]
        waiting.sort(key=lambda r: (-r.config.priority, r.order))
        return waiting

    def _schedule(self) -> None:
        if self._closed:
            return
        for run in self._queued():
            if not self._free:
                break
            run.slot = self._free.pop(0)
            self._launch(run)

    def _launch(self, run: _Run) -> None:
        assert self._rundir is not None and run.slot is not None
        slot = run.slot
        run.attempt += 1
        name = run.config.name
        spec = LaunchSpec(
            worker=WorkerSpec(pipeline=run.config.model_dump(mode="json"),
                              validation={**run.run_config.validation.model_dump(mode="json"),
                                          "mode": run.validation.mode if run.validation else "inline"},
                              device=slot.device, threads=slot.threads,
                              pipeline_dir=str(self._rundir.pipeline_dir(name)), attempt=run.attempt,
                              snapshot_dir=str(self.snapshot_root / name)
                              if run.validation is not None and run.validation.mode == "background" else "",
                              snapshot_seq=run.seq_max),
            log_path=self._rundir.log_path(name),
            gpu_index=slot.gpu.index if slot.gpu is not None else None)
        run.intent, run.deadline, run.restart_at, run.escalated = None, None, None, False
        try:
            handle = self._launcher.launch(spec)
        except OSError as exc:
            run.last_error = f"could not start the worker: {exc}"
            self._set_state(run, S.STARTING)  # -> STARTING (it failed at once)
            self._after_crash(run, uptime=0.0, exit_desc=run.last_error)
            return
        run.handle = handle
        run.started_mono = time.monotonic()
        run.started_at = time.time()
        handle.attach(lambda events, run=run, handle=handle: self._on_events(run, handle, events))
        self._update_pids()
        self._set_state(run, S.STARTING)  # QUEUED/BACKOFF/KILLING -> STARTING
        self._emit(WorkerStarted(pipeline=name, pid=handle.pid, device=slot.name, attempt=run.attempt,
                                 gpu_uuid=slot.gpu.uuid if slot.gpu is not None else ""))

    def _on_telemetry(self, snapshot: TelemetrySnapshot) -> None:
        if self._closed:
            return
        self.telemetry = snapshot
        for queue in self._subscribers:  # not in events.jsonl: telemetry.jsonl keeps it
            queue.put_nowait(snapshot)

    def _update_pids(self) -> None:
        pids = {n: r.handle.pid for n, r in self._runs.items() if r.handle is not None}
        if self._validator is not None and self._validator.handle is not None:
            pids["(validator)"] = self._validator.handle.pid
        self._pids = pids

    def _send(self, run: _Run, command: object) -> None:
        if run.handle is not None:
            run.handle.send(command)

    def _terminate(self, run: _Run) -> None:
        assert run.handle is not None
        run.handle.signal_group(signal.SIGTERM)
        run.deadline = time.monotonic() + run.run_config.restart.kill_grace
        self._set_state(run, S.KILLING)  # alive -> KILLING

    def _on_events(self, run: _Run, handle: WorkerHandle, events: list[Event]) -> None:
        if run.handle is not handle:
            return  # a late batch from an attempt already reaped
        run.last_progress = time.monotonic()
        for event in events:
            if isinstance(event, Heartbeat):
                continue  # only proves progress; not worth a line anywhere
            if isinstance(event, StepMetrics):
                run.epoch, run.step, run.train_loss = event.epoch, event.step, event.loss
                run.samples_per_s = event.samples_per_s
            elif isinstance(event, EpochEnd):
                run.epoch, run.step, run.train_loss = event.epoch + 1, event.step, event.train_loss
                run.samples_per_s = event.samples_per_s
                run.steps_per_epoch = event.steps_per_epoch
            elif isinstance(event, SnapshotTaken):
                run.seq_max = max(run.seq_max, event.seq)
                # The validator's result can overtake the worker's report of the hand-off.
                if event.dropped or event.seq in run.scored:
                    pass
                elif event.seq < run.scored_max:
                    self._emit(event)
                    self._emit(SnapshotSkipped(pipeline=run.config.name, seq=event.seq, epoch=event.epoch,
                                               step=event.step, reason="a newer snapshot was validated first"))
                    continue
                else:
                    run.handed[event.seq] = (event.epoch, event.step)
            elif isinstance(event, ValResult):
                self._record_val(run, event)
                continue
            elif isinstance(event, TrainingStarted):
                run.epoch, run.step = event.epoch, event.step
                run.epochs_total, run.steps_per_epoch = event.epochs_total, event.steps_per_epoch
                if run.state == S.STARTING:
                    self._set_state(run, S.RUNNING)  # STARTING -> RUNNING
            elif isinstance(event, WorkerError):
                run.last_error, run.last_traceback = event.error, event.traceback
            self._emit(event)

    # -------------------------------------------------------- validator

    def _launch_validator(self) -> None:
        v = self._validator
        assert v is not None
        if v.attempt == 0:
            claim_root(self.snapshot_root)
        v.attempt += 1
        v.restart_at = None
        directory = self.run_dir / "validator"
        spec = LaunchSpec(
            worker=WorkerSpec(pipeline={"name": "validator", "snapshot_root": str(self.snapshot_root)},
                              validation={}, device=v.plan.device, threads=v.plan.threads,
                              pipeline_dir=str(directory), attempt=v.attempt),
            log_path=directory / "log.txt", gpu_index=v.plan.gpu.index if v.plan.gpu is not None else None,
            module="torchherd.engine.validator")
        try:
            v.handle = self._launcher.launch(spec)
        except OSError as exc:
            self._emit(Notice(level="error", text=f"could not start the validator: {exc}"))
            self._validator_died()
            return
        v.started_mono = time.monotonic()
        handle = v.handle
        self._emit(ValidatorStarted(pid=handle.pid, device=v.plan.label, attempt=v.attempt))
        handle.attach(lambda events, handle=handle: self._on_validator_events(handle, events))
        self._update_pids()

    def _validator_died(self, code: int | None = None) -> None:
        v = self._validator
        assert v is not None
        if v.handle is not None:
            self._on_validator_events(v.handle, v.handle.drain())
            v.handle.close()
            v.handle = None
            self._update_pids()
        healthy = time.monotonic() - v.started_mono > 60.0  # seconds: long enough to reset the backoff
        v.failures = 1 if healthy else v.failures + 1
        first, longest = VALIDATOR_BACKOFF
        delay = min(first * 2 ** (v.failures - 1), longest)
        v.restart_at = time.monotonic() + delay
        how = "" if code is None else (f" (killed by {signal.Signals(-code).name})" if code < 0 and
                                       -code in signal.Signals._value2member_map_ else f" (exit code {code})")
        self._emit(Notice(level="error", text=f"validator exited{how}; restarting in {delay:g}s; "
                                              "training goes on and the snapshots it misses are recorded as skipped"))

    def _on_validator_events(self, handle: WorkerHandle, events: list[Event]) -> None:
        v = self._validator
        if v is None or v.handle is not handle:
            return
        for event in events:
            run = self._runs.get(getattr(event, "pipeline", ""))
            if isinstance(event, ValResult):
                self._last_result = time.monotonic()
            if isinstance(event, ValResult) and run is not None:
                if event.seq == 0 and event.error:
                    run.validation_broken = True
                self._resolve_snapshots(run, event.seq)
                if event.error:
                    self._emit(event)
                    continue
                self._record_val(run, event)
                continue
            if isinstance(event, EarlyStop) and run is not None:
                self._emit(event)
                if run.state in (S.STARTING, S.RUNNING, S.PAUSED):
                    self.stop(run.config.name, reason=event.reason)
                continue
            self._emit(event)

    def _record_val(self, run: _Run, event: ValResult) -> None:
        """Note a validation result (inline or background) in the pipeline's figures and emit it."""
        metric = run.run_config.validation.metric
        value = event.metrics.get(metric, event.metrics.get("val_loss"))
        run.val_loss = event.metrics.get("val_loss", value)
        if value is not None:
            better_max = run.run_config.validation.metric_mode == "max"
            if run.best_val is None or (value > run.best_val if better_max else value < run.best_val):
                run.best_val = value
        self._emit(event)

    def _resolve_snapshots(self, run: _Run, seq: int) -> None:
        """Snapshots older than `seq` that were never scored are recorded as skipped."""
        for old in sorted(k for k in run.handed if k < seq):
            epoch, step = run.handed.pop(old)
            self._emit(SnapshotSkipped(pipeline=run.config.name, seq=old, epoch=epoch, step=step,
                                       reason="a newer snapshot was validated first"))
        run.handed.pop(seq, None)
        if seq:
            run.scored.add(seq)
            run.scored_max = max(run.scored_max, seq)

    def _validation_pending(self) -> bool:
        if self._validator is None or self._validator.failures >= 3:
            return False  # no validator, or one that keeps dying: the run must still end
        pending = [r for r in self._runs.values() if r.handed and not r.validation_broken]
        if not pending:
            return False
        now = time.monotonic()
        if not all(r.state.final for r in self._runs.values()):
            self._drain_start = None
            return True
        if self._drain_start is None:
            self._drain_start = now
        if now - max(self._last_result, self._drain_start) > VALIDATION_DRAIN:
            for run in pending:  # lost (say, /dev/shm cleared under us): say so rather than wait for ever
                for seq, (epoch, step) in sorted(run.handed.items()):
                    self._emit(SnapshotSkipped(pipeline=run.config.name, seq=seq, epoch=epoch, step=step,
                                               reason=f"no validation result within {VALIDATION_DRAIN:g}s"))
                run.handed.clear()
            return False
        return True

    async def _tick_loop(self) -> None:
        while True:
            try:
                self._tick()
            except Exception as exc:  # keep supervising; say what went wrong
                self._emit(Notice(level="error", text=f"supervisor error: {type(exc).__name__}: {exc}"))
            await asyncio.sleep(self._tick_interval)

    def _tick(self) -> None:
        now = time.monotonic()
        for run in list(self._runs.values()):
            handle = run.handle
            if handle is not None:
                code = handle.poll()
                if code is not None:
                    self._on_exit(run, handle, code)
                elif run.deadline is not None and now >= run.deadline:
                    if run.state == S.HUNG:
                        self._terminate(run)  # its stack had time to reach the log
                    elif run.state == S.KILLING and not run.escalated:
                        run.escalated = True
                        handle.signal_group(signal.SIGKILL)  # it ignored SIGTERM for kill_grace
                    elif run.state == S.STOPPING:
                        run.stop_reason = f"did not stop within {run.run_config.restart.stop_timeout:g}s; killed"
                        self._terminate(run)
                elif self._is_hung(run, now):
                    run.intent = "hung"
                    handle.signal_process(signal.SIGUSR1)  # faulthandler writes every thread's stack to the log
                    run.deadline = now + HANG_DUMP_WAIT
                    timeout = run.run_config.restart.hang_timeout
                    run.last_error = f"hung: no training step for {timeout:g}s (stack dumped to its log)" + \
                        self._gpu_note(run)
                    self._set_state(run, S.HUNG)  # STARTING/RUNNING -> HUNG
                    self._emit(Notice(pipeline=run.config.name, level="error", text=run.last_error))
            elif run.state == S.BACKOFF and run.restart_at is not None and now >= run.restart_at:
                self._launch(run)
        v = self._validator
        if v is not None and not self._closing:
            if v.handle is not None:
                code = v.handle.poll()
                if code is not None:
                    self._validator_died(code)
            elif v.restart_at is not None and now >= v.restart_at:
                self._launch_validator()
        self._schedule()
        if self._rundir is not None:
            self._rundir.flush()
        self._check_finished()

    def _is_hung(self, run: _Run, now: float) -> bool:
        timeout = run.run_config.restart.hang_timeout
        if timeout is None:
            return False
        if run.state == S.STARTING:  # building the task: data loading gets three times as long
            return now - max(run.last_progress, run.started_mono) > 3 * timeout
        return run.state == S.RUNNING and now - run.last_progress > timeout

    def _on_exit(self, run: _Run, handle: WorkerHandle, code: int) -> None:
        self._on_events(run, handle, handle.drain())
        handle.close()
        run.handle = None
        self._update_pids()
        uptime = time.monotonic() - run.started_mono
        sig = signal.Signals(-code).name if code < 0 and -code in signal.Signals._value2member_map_ else ""
        exit_desc = f"killed by {sig}" if sig else f"exit code {code}"
        intent = run.intent
        if intent == "restart":
            reason = "restarted"
        elif intent == "kill":
            reason = "killed"
        elif intent == "hung":
            reason = "hung"
        elif code == EXIT_STOPPED or (intent == "stop" and code != EXIT_COMPLETED):
            reason = "stopped"
        elif code == EXIT_COMPLETED:
            reason = "completed"
        elif code == EXIT_RESTART:
            reason = "restart requested"
        else:
            reason = "failed" if code == EXIT_FATAL else "crashed"
        error = run.last_error if reason in ("failed", "crashed", "hung", "restart requested") else ""
        self._emit(WorkerExited(pipeline=run.config.name, pid=handle.pid, attempt=run.attempt,
                                exit_code=code if code >= 0 else None, signal=sig, reason=reason,
                                error=error or ("" if reason not in ("failed", "crashed", "hung") else exit_desc),
                                traceback=run.last_traceback if error else "", uptime=uptime))
        if reason == "restarted":
            run.last_error = run.last_traceback = ""
            self._launch(run)  # KILLING -> STARTING, same slot, no budget spent
        elif reason == "killed":
            run.finish_reason = "killed on request"
            self._finish(run, S.KILLED)
        elif reason == "stopped":
            run.finish_reason = run.stop_reason or "stopped"
            self._finish(run, S.STOPPED)
        elif reason == "completed":
            run.finish_reason = "trained to its limits"
            self._finish(run, S.COMPLETED)
        elif reason == "failed":
            run.finish_reason = run.last_error or exit_desc
            self._finish(run, S.FAILED)
        elif reason == "restart requested":
            # nan_policy = "restart": back to the last checkpoint. It spends the budget, so a
            # loss that always diverges still ends, but it is no failed start however quick.
            self._after_crash(run, uptime=float("inf"), exit_desc="the worker asked to be restarted")
        else:
            self._after_crash(run, uptime, exit_desc)

    def _gpu_note(self, run: _Run) -> str:
        """The worker's GPU memory from the newest telemetry, when that GPU is nearly full."""
        gpu = run.slot.gpu if run.slot is not None else None
        snap = self.telemetry
        if gpu is None or snap is None:
            return ""
        for sample in snap.gpus:
            if sample.index == gpu.index and sample.mem_used is not None and sample.mem_total:
                if sample.mem_used / sample.mem_total >= 0.95:
                    return (f"; GPU {gpu.index} memory was full: {sample.mem_used / 2**30:.1f} of "
                            f"{sample.mem_total / 2**30:.1f} GiB used")
        return ""

    def _after_crash(self, run: _Run, uptime: float, exit_desc: str) -> None:
        decision = run.policy.decide(run.restarts, run.failed_starts, uptime)
        run.failed_starts = decision.failed_starts
        what = (run.last_error or exit_desc) + self._gpu_note(run)
        if not decision.restart:
            run.finish_reason = f"{what} ({decision.reason})"
            self._finish(run, S.FAILED)
            return
        run.restarts += 1
        run.restart_at = time.monotonic() + decision.delay
        run.last_error, run.last_traceback = what, run.last_traceback
        self._set_state(run, S.BACKOFF)  # STARTING/RUNNING/... -> BACKOFF
        self._emit(WorkerRestarting(pipeline=run.config.name, attempt=run.attempt + 1, delay=decision.delay,
                                    restarts_left=run.run_config.restart.max_restarts - run.restarts,
                                    reason=f"{decision.reason}: {what}"))

    def _finish(self, run: _Run, state: WorkerState) -> None:
        self._set_state(run, state)
        if run.slot is not None:
            self._free.append(run.slot)
            self._free.sort(key=self._slots.index)
            run.slot = None
        self._emit(PipelineFinished(pipeline=run.config.name, status=state.value, reason=run.finish_reason,
                                    epoch=run.epoch, step=run.step))

    def _set_state(self, run: _Run, state: WorkerState) -> None:
        check_transition(run.state, state)
        previous, run.state = run.state, state
        if previous != state:
            self._emit(WorkerStateChanged(pipeline=run.config.name, state=state.value, previous=previous.value))

    def _check_finished(self) -> None:
        if self._finished_sent or not self._runs or self._rundir is None:
            return
        if all(r.state.final for r in self._runs.values()) and (self._closing or not self._validation_pending()):
            statuses = {n: r.state.value for n, r in self._runs.items()}
            self._finished_sent = True
            self._emit(RunFinished(ok=all(s == "completed" for s in statuses.values()), statuses=statuses))
            self._rundir.flush()
            self._finished.set()

    def _emit(self, event: Event) -> None:
        self._history.append(event)
        if self._rundir is not None and not self._closed:
            self._rundir.write(event)
        for queue in self._subscribers:
            queue.put_nowait(event)

    def _view(self, r: _Run) -> PipelineView:
        return PipelineView(
            name=r.config.name, state=r.state,
            device=r.slot.name if r.slot is not None else "",
            pid=r.handle.pid if r.handle is not None else None, attempt=r.attempt, restarts=r.restarts,
            epoch=r.epoch, step=r.step, epochs_total=r.epochs_total, steps_per_epoch=r.steps_per_epoch,
            train_loss=r.train_loss, val_loss=r.val_loss, best_val=r.best_val, samples_per_s=r.samples_per_s,
            started_at=r.started_at, log_path=self.run_dir / r.config.name / "log.txt",
            last_error=r.finish_reason if r.state == S.FAILED else r.last_error,
            priority=r.config.priority)
