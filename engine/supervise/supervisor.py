"""The supervisor: the asyncio facade of a session, which owns every worker of a run and reports on them.

It composes an event bus (the run directory is its writer), a scheduler of device
slots, the lifecycle of attempts and the validation service, and runs one
supervision pass every tick; none of its methods blocks the event loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.problems import ConfigError
from ..config.schema import RunConfig
from ..hardware.devices import Inventory
from ..hardware.grants import request_of
from ..launch.backend import Backend, Handle
from ..launch.registry import backend_for
from ..preflight.plan import gang_problems
from ..protocol.messages import (
    ConfigAdded,
    EarlyStop,
    Event,
    Notice,
    PipelineFinished,
    PipelineQueued,
    PipelineWaiting,
    RunFinished,
    RunStarted,
)
from ..protocol.names import NoticeTopic
from ..protocol.states import SUCCESS_STATES, WorkerState
from ..protocol.telemetry import TelemetrySnapshot
from ..rundir import provenance
from ..rundir.directory import RunDirectory, load_resolved_configs, new_run_id
from ..rundir.snapshots import remove_root, snapshot_root
from ..runners.registry import runner_for
from ..sinks.feed import SinkFeed
from . import build_check, commands
from .attempts import AttemptLauncher
from .bus import EventStream, Publisher, StepsTap, Tap
from .decisions import Decision, DumpStacks, Outbox, Record, Requeue, Resize, Retune, SessionView, Stop, StopRun
from .disk_full import DiskWatch
from .growing import Gang, GrowWatch
from .intake import WorkerIntake
from .lifecycle import Lifecycle, States
from .nodes import NodeFollower
from .observers import HealthWatch, PbtController, SweepPruner, observers_of
from .pipeline import PipelineView, Plan, SupervisedPipeline, unique_name, view_of
from .policy import RestartPolicy
from .resuming import history_before, kept_on_resume, resume_line
from .scheduler import Scheduler
from .telemetry_feed import TelemetryFeed, gpu_note
from .validation_service import SESSION_ENDED, ValidationService
from .validator_gpu import start_validator
from .watched import WatchedClock

__all__ = ["EventStream", "PipelineView", "Supervisor"]
S = WorkerState
TICK = 0.1  # seconds between supervision passes


@dataclass(frozen=True)
class _Opened:
    """The run directory of a started session and what is made with it."""

    rundir: RunDirectory
    disk: DiskWatch
    attempts: AttemptLauncher


class Supervisor:
    """Runs the pipelines of one or more configs as supervised worker processes."""

    def __init__(self, config: RunConfig, *, runs_dir: str | Path | None = None,
                 launcher: Backend | None = None, inventory: Inventory | None = None,
                 run_id: str | None = None, tick: float = TICK, check_builds: bool = False):
        """`launcher`: the backend attempts run on (default: the one `[cluster] backend` names);
        `inventory`: the devices slots are planned on (default: the backend's); `check_builds`: build_check.py."""
        self.config = config
        base = Path(runs_dir if runs_dir is not None else config.runs_dir)
        self._backend = launcher if launcher is not None else backend_for(config.cluster, base, config.source)
        # A cluster's backend brings its nodes' devices and plans slots on them.
        inventory = inventory if inventory is not None else self._backend.inventory
        slots, problems = self._backend.plan_slots(config.devices, inventory, config.source)
        problems += gang_problems(config, slots) if slots else []
        if problems:
            raise ConfigError(problems)
        self._fresh = run_id is None  # a new run id: its folder must be made by this run, never adopted
        self.run_id = run_id or new_run_id(base, config.name)
        self.run_dir = base / self.run_id
        self.snapshot_root = snapshot_root(self.run_id, self.run_dir)
        self.telemetry: TelemetrySnapshot | None = None  # the newest sample
        self._tick_interval = tick
        self._watched = WatchedClock(tick)  # the silence of workers and validators is judged on it, not wall time
        # Built in dependency order; what needs the run directory is made as start() opens it (`_Opened`).
        self._pipelines: dict[str, SupervisedPipeline] = {}
        self._publish = Publisher(self._pipelines)  # the one door onto the session's bus
        self._scheduler = Scheduler.for_run(self._backend, slots, self.run_id, self.run_dir, config.devices)
        self._nodes = NodeFollower(self._backend, config, self._scheduler, inventory)  # a cluster's, as they change
        self._validation = ValidationService(backend=self._backend, publish=self._publish.validation,
                                             run_dir=self.run_dir, snapshot_root=self.snapshot_root,
                                             on_early_stop=self._on_early_stop, clock=self._watched)
        states = States(scheduler=self._scheduler, publish=self._publish.event, clock=self._watched)
        intake = WorkerIntake(states=states, publish=self._publish, validation=self._validation,
                              early_stop=self._on_early_stop)
        self._lifecycle = Lifecycle(start=self._start_attempt, scheduler=self._scheduler, states=states,
                                    intake=intake, publish=self._publish.event,
                                    gpu_note=lambda pipe: gpu_note(pipe, self.telemetry))
        self._order = itertools.count()  # each pipeline's place in the queue among those of its priority
        self._opened: _Opened | None = None  # the run directory and what needs it, from start()
        self._tick_task: asyncio.Task | None = None
        self._finished = asyncio.Event()
        self._finished_sent = False
        self._closing = False  # shutdown has begun: nothing more is launched, the validator not restarted
        self._closed = False
        self._feed = TelemetryFeed()  # the pids the sampler thread reads, and the sampler
        self._resume_configs: list[RunConfig] | None = None
        self._resume_only: set[str] | None = None
        self.task_check = build_check.BuildCheck(config, check_builds)  # the first wave's builds check every task
        self.sweep: SweepPruner | PbtController | None = None  # a [sweep]'s pruner or PBT, from start()
        self._health: HealthWatch | None = None  # the watch on alerts, from start(): it sums the run up at its end
        self._sinks: SinkFeed | None = None  # the [tracking] sinks' hosts, from start()
        self._grow: GrowWatch | None = None  # the policy that grows elastic gangs while they train, from start()

    # ------------------------------------------------------------ session

    @classmethod
    def resume_run(cls, run_dir: str | Path, only: list[str] | None = None, **kwargs: Any) -> Supervisor:
        """A supervisor that carries on a run that did not complete, in the same directory: every pipeline
        that did not complete (or those in `only`) from its checkpoint, with a fresh restart budget."""
        configs = load_resolved_configs(run_dir := Path(run_dir))
        sup = cls(configs[0], runs_dir=run_dir.parent, run_id=run_dir.name, **kwargs)
        sup._resume_configs = configs
        sup._resume_only = set(only) if only else None
        return sup

    async def start(self) -> None:
        """Create the run directory and start the pipelines that fit on the slots."""
        if self._opened is not None:
            raise RuntimeError("supervisor already started")
        resuming = self._resume_configs is not None
        done, attempts = history_before(self.run_dir) if resuming else ({}, {})  # before the directory reopens
        rundir = RunDirectory(self.run_dir, fresh=self._fresh)
        loop = asyncio.get_running_loop()
        outbox = Outbox(self._carry_out, lambda: self._publish.publishing, loop)
        self._opened = opened = _Opened(rundir, DiskWatch(rundir, outbox),
                                        AttemptLauncher(self._backend, rundir, self._validation, self.run_id))
        rundir.resuming = resuming
        rundir.save_config(self.config)
        self._publish.add_writer(rundir.write, rundir.write_steps)
        self._publish.tap(opened.disk.on_event, opened.disk.on_steps)
        self._sinks = SinkFeed.open(self.config.tracking, self.run_dir, resuming, self._tracking_notice)
        if self._sinks is not None:  # MLflow, W&B, the user's: a copy of every event, from run_started on
            self._publish.tap(self._sinks.on_event, self._sinks.on_steps)
        names = [n for config in [self.config, *(self._resume_configs or [])[1:]] for n in self._add(config)]
        kept = kept_on_resume({n: e.status for n, e in done.items()}, names, self._resume_only) if resuming else {}
        for name in names:
            self._pipelines[name].attempts = attempts.get(name, 0)  # attempt numbers count on across resumes
        if resuming:
            lines = ", ".join(resume_line(self.run_dir, self._pipelines[n].plan.config, kept) for n in names)
            self._publish.event(Notice(level="info", topic=NoticeTopic.RESUMING,
                                       text=f"resuming run {self.run_id}: {lines}"))
        configs = [self.config, *(self._resume_configs or [])[1:]]
        code = await asyncio.to_thread(provenance.record, configs, self.run_dir)  # git: a few short commands
        self._publish.event(RunStarted(run_id=self.run_id, run_dir=str(self.run_dir),
                                       config_path=self.config.source, pipelines=tuple(names), code=code.commits))
        if code.notice:
            self._publish.event(Notice(level="info", text=code.notice))
        for name, status in kept.items():  # nothing to train: they keep how they had ended
            ended = done.get(name) or PipelineFinished(pipeline=name, status=status)
            commands.keep_ended(self._lifecycle, self._pipelines[name], ended)
        self._announce_queued(names)
        self.task_check.open(resuming, self._pipelines[names[0]].plan.background, self._publish)
        observers = observers_of(SessionView(self.config, self.run_dir, self.view, self.views, code.commits), outbox)
        for tap, steps in observers.taps:  # TensorBoard files, the health and metric watches, the sweep's policy
            self._publish.tap(tap, steps)
        self.sweep = observers.sweep
        self._health = observers.health
        self._grow = GrowWatch(outbox, self._growable)
        gang_restarts = self.config.restart.max_restarts > 0 and any(p.max_ranks > 1 for p in self.config.pipelines)
        if gang_restarts or (self.sweep is not None and self.sweep.restarts_trials):  # restarts fork, warm
            self._backend.expect_restarts()
        self._schedule()
        self._tick_task = loop.create_task(self._tick_loop(), name="torchherd-supervisor")
        if self.config.telemetry.enabled:
            self._feed.start(self.config.telemetry, self._backend, self.run_dir / "telemetry.jsonl",
                             lambda snap: loop.call_soon_threadsafe(self.on_telemetry, snap))

    def add_config(self, config: RunConfig) -> list[str]:
        """Add another config's pipelines to this session; they queue for free slots. Returns their names."""
        if self._opened is None or self._closed:
            raise RuntimeError("supervisor is not running")
        self._opened.rundir.save_config(config)
        names = self._add(config)
        self._publish.event(ConfigAdded(name=config.name, config_path=config.source, pipelines=tuple(names)))
        self._announce_queued(names)
        self._reopen()
        self._schedule()
        return names

    def subscribe(self, replay: bool = True) -> EventStream:
        """A stream of every event from now on (and, with `replay`, those already emitted)."""
        return self._publish.subscribe(replay)

    def tap(self, fn: Tap, steps: StepsTap | None = None) -> None:  # fn(event, line, kept) on every event
        self._publish.tap(fn, steps)  # steps(reports, lines): a run of step reports at once, if given

    def record(self, event: Event) -> None:  # an event from outside the engine (a client's command)
        self._publish.event(event)

    def events_written(self) -> int:  # bytes of events.jsonl on disk, every event published so far in them
        return self._opened.rundir.written() if self._opened is not None else 0

    def views(self) -> list[PipelineView]:
        """Every pipeline, in the order they were added."""
        return [view_of(r, self.run_dir) for r in self._pipelines.values()]

    def view(self, name: str) -> PipelineView:
        return view_of(self._get(name), self.run_dir)

    @property
    def inventory(self) -> Inventory:  # the devices slots are planned on (a cluster's change as nodes come and go)
        return self._nodes.inventory

    @property
    def alive(self) -> bool:  # some worker process exists
        return any(r.handle is not None for r in self._pipelines.values())

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    async def wait(self) -> dict[str, str]:
        """Wait until every pipeline has a final status; returns them by name."""
        await self._finished.wait()
        return {n: r.state.value for n, r in self._pipelines.items()}

    # ------------------------------------------------------------ commands

    def stop(self, name: str | None = None, reason: str = "requested", ending: WorkerState = S.STOPPED) -> None:
        """Gracefully stop one pipeline (or all): finish the step, checkpoint, exit; it ends in `ending`. Stopping
        all leaves a sweep's resting trials as they are: a resumed run finds them waiting still."""
        for pipe in [r for r in self._pipelines.values() if not r.state.resting] if name is None else [self._get(name)]:
            commands.stop(self._lifecycle, pipe, reason, ending)
        self._check_finished()

    def pause(self, name: str) -> None:
        commands.pause(self._lifecycle, self._get(name))

    def unpause(self, name: str) -> None:
        commands.unpause(self._lifecycle, self._get(name))

    def checkpoint(self, name: str) -> None:
        commands.checkpoint(self._get(name))

    def stacks(self, name: str) -> None:  # every process of its attempt writes its Python stacks to its log
        commands.stacks(self._get(name), self._publish.event)

    def kill(self, name: str) -> None:
        """End the worker now: the polite signal to its process group, the hard one after the grace period."""
        commands.kill(self._lifecycle, self._get(name))
        self._check_finished()

    def restart(self, name: str) -> None:
        """Kill the worker and start it again from its last checkpoint (no restart budget spent)."""
        pipe = self._get(name)
        if commands.restart(self._lifecycle, pipe):  # an ended pipeline is queued again
            self._reopen()
            self._announce_queued([pipe.name])
            self._schedule()

    def promote(self, name: str) -> None:
        """A sweep's trial is never pruned again this session; a pruned one trains on from its checkpoint."""
        if self.sweep is None:
            raise ValueError("this run prunes nothing: its config has no [sweep] scheduler")
        self.sweep.promote(self._get(name).name)

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """End the session: stop (or kill) every worker, flush the run directory, end the streams."""
        if self._closed or self._opened is None:
            self._closed = True
            return
        opened = self._opened
        if graceful:
            self.stop(reason="shutdown")
            deadline = time.monotonic() + timeout
            while self.alive and time.monotonic() < deadline:
                await asyncio.sleep(self._tick_interval)
            await self._validation.drain(deadline, self._tick_interval)
        await self._validation.stop()  # its last results come before run_finished
        self._closing = True
        for pipe in self._pipelines.values():
            commands.end_at_shutdown(self._lifecycle, pipe)
        deadline = time.monotonic() + 5.0
        while self.alive and time.monotonic() < deadline:
            self._tick()
            await asyncio.sleep(0.02)
        for pipe in self._pipelines.values():
            commands.settle_unreaped(self._lifecycle, pipe)
        if self._sinks is not None:  # the trackers have taken what came before (while they make progress)
            await self._sinks.settle()
        self._check_finished()
        if self._health is not None:  # the summary's command and POST, before this process may end
            await asyncio.to_thread(self._health.settle)
        if self._sinks is not None:
            await asyncio.to_thread(self._sinks.close)
        await asyncio.to_thread(self._feed.stop)
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
        self._closed = True
        self._scheduler.close()  # every lease back to the ledger
        self._backend.close()  # a cluster's: its listening socket and the actors still ending
        remove_root(self.snapshot_root)
        await opened.disk.settle()
        opened.rundir.close()
        self._publish.close()

    # ------------------------------------------------------------ internals

    def _get(self, name: str) -> SupervisedPipeline:
        try:
            return self._pipelines[name]
        except KeyError:
            raise KeyError(f"no pipeline named {name!r}") from None

    def _add(self, config: RunConfig) -> list[str]:
        problems = gang_problems(config, self._scheduler.slots)
        if problems:
            raise ConfigError(problems)
        policy = RestartPolicy(config.restart)
        validation = self._backend.plan_validation(config, self._scheduler.slots, self._nodes.inventory)
        if any(runner_for(p.kind).scored_in_background(p) for p in config.pipelines):  # else a validator of nothing
            validation = start_validator(validation, config, self._scheduler, self._validation, self._nodes.inventory)
        names = []
        for pipe in config.pipelines:
            name = unique_name(pipe.name, self._pipelines)
            if name != pipe.name:
                pipe = pipe.model_copy(update={"name": name})
            plan = Plan(config=pipe, run_config=config, policy=policy, order=next(self._order), validation=validation,
                        request=request_of(pipe, self._scheduler.slots))
            self._pipelines[name] = SupervisedPipeline(plan=plan)
            self._validation.ledger(name)
            names.append(name)
            self._scheduler.enqueue(name, pipe.priority, plan.order, plan.request)  # born QUEUED
        return names

    def _announce_queued(self, names: list[str]) -> None:
        for name in names:
            pipe = self._pipelines[name]
            if pipe.state == S.QUEUED:
                self._publish.event(PipelineQueued(pipeline=name, priority=pipe.plan.config.priority,
                                          position=self._scheduler.position(name)))

    def _reopen(self) -> None:
        """More work arrived after every pipeline had ended: the run is not finished any more."""
        self._finished.clear()
        self._finished_sent = False
        self._publish.quiet = False  # the validator's news is kept again

    def _schedule(self) -> None:
        if self._closed or self._closing or self.task_check.holding or \
                self._backend.hold_launches(len(self._scheduler.queued()), len(self._scheduler.free)):
            return
        granted = self._scheduler.allocate()
        for name, why in self._scheduler.changed_waits():  # what holds up a queued pipeline, when that changed
            if self._pipelines[name].state == S.QUEUED:
                self._publish.event(PipelineWaiting(pipeline=name, why=why))
        for text in self._scheduler.ledger_notices():  # a ledger file no torchherd wrote, skipped: said once
            self._publish.event(Notice(level="warning", text=text))
        for name, slots in granted:
            pipe = self._pipelines[name]
            pipe.slots = slots
            if pipe.state != S.BACKOFF:  # an elastic gang granted again while it backs off: the tick starts it when due
                self._lifecycle.launch(pipe)

    def _start_attempt(self, pipe: SupervisedPipeline) -> Handle:
        """Launch the pipeline's next attempt: one process, or a gang of one per slot (raises OSError)."""
        if self._opened is None:
            raise RuntimeError("supervisor not started: no run directory to start attempts in")
        pipe.slots = self._nodes.refit(pipe.slots)  # a slot on a node that left: another, if one is free
        return self._opened.attempts.start(pipe, hold=self.task_check.admit(pipe))

    def _carry_out(self, decision: Decision) -> None:
        """Carry out a policy's decision (decisions.py says what each asks)."""
        if isinstance(decision, Record):
            self._publish.event(decision.event)
            return
        if isinstance(decision, StopRun):
            self.stop(reason=decision.reason)
            return
        pipe = self._get(decision.name)
        if isinstance(decision, Stop):
            commands.stop(self._lifecycle, pipe, decision.reason, decision.ending, decision.rung)
        elif isinstance(decision, Requeue) and pipe.state.ended:
            if decision.behind:
                commands.requeue(pipe, next(self._order))
            self.restart(pipe.name)  # final/resting -> QUEUED
        elif isinstance(decision, Retune):
            commands.retune(pipe, decision.values)
        elif isinstance(decision, DumpStacks) and pipe.handle is not None:
            commands.stacks(pipe, self._publish.event)
        elif isinstance(decision, Resize) and pipe.state == S.RUNNING and not self._closing:
            self._lifecycle.request_resize(pipe, decision.why)  # RUNNING -> STOPPING

    def _growable(self) -> list[Gang]:
        """The running elastic gangs below their MAX, and the ranks each could be granted now (the grow policy's
        view of the session)."""
        return [Gang(p.name, len(p.slots), self._scheduler.room(p.name, p.plan.request), p.plan.config.grow_after)
                for p in self._pipelines.values()
                if p.plan.config.elastic and p.state == S.RUNNING
                and 0 < len(p.slots) < p.plan.config.max_ranks]

    def _on_early_stop(self, name: str, event: EarlyStop) -> None:
        self._publish.validation(event)
        if self._pipelines[name].state in commands.LIVE:  # a completion: it ends early_stopped, not stopped
            self.stop(name, reason=event.reason, ending=S.EARLY_STOPPED)

    def _tracking_notice(self, text: str, level: str) -> None:
        if self._publish.publishing:  # said by a tap: after the event it taps has reached every other
            asyncio.get_running_loop().call_soon(self._tracking_notice, text, level)
        elif not self._finished_sent and not self._closed:  # (after run_finished, its log in tracking/ has it)
            self._publish.event(Notice(level=level, text=text))

    def on_telemetry(self, snapshot: TelemetrySnapshot) -> None:
        """Take a telemetry sample (the sampler thread hands each one over on the event loop)."""
        if self._closed:
            return
        self.telemetry = snapshot
        self._publish.transient(snapshot)  # not in events.jsonl: telemetry.jsonl keeps it

    async def _tick_loop(self) -> None:
        while True:
            try:
                self._tick()
            except Exception as exc:  # keep supervising; say what went wrong
                self._publish.event(Notice(level="error", text=f"supervisor error: {type(exc).__name__}: {exc}"))
            await asyncio.sleep(self._tick_interval)

    def _tick(self) -> None:
        now = time.monotonic()
        self._watched()  # looked at every tick: a look much later than that is a pause of this process
        for pipe in list(self._pipelines.values()):
            self._lifecycle.tick(pipe, now)
        self.task_check.settle(self._pipelines, self._lifecycle, self._publish.event)
        if not self._closing:
            self._validation.tick(now)
            if self._grow is not None:
                self._grow.tick(now)
        self._nodes.follow()
        self._schedule()
        self._feed.update(self._pipelines, self._validation.handle)
        if self._opened is not None:
            self._opened.rundir.flush()
            if not self._finished_sent:  # nothing is said after run_finished
                self._opened.disk.check()
        self._check_finished()

    def _check_finished(self) -> None:
        if self._finished_sent or not self._pipelines or self._opened is None or self._validation.stopping:
            return
        training_done = all(r.state.ended for r in self._pipelines.values())  # a resting trial waits for its sweep
        if training_done and (self._closing or not self._validation.pending(training_done=True)):
            if not self._closing and self._sinks is not None and not self._sinks.caught_up():
                return  # a tracker still takes the run's events (never longer than it makes progress)
            if not self._closing and self.sweep is not None and self.sweep.settle():
                return  # a trial paused at a rung was promoted: the sweep goes on
            if self._closing:
                self._validation.abandon(SESSION_ENDED)  # never scored: say so before the end
            statuses = {n: r.state.value for n, r in self._pipelines.items()}
            self._finished_sent = True
            ok = all(S(s) in SUCCESS_STATES for s in statuses.values())
            summary = self._health.finished(statuses) if self._health is not None else None
            if summary is not None:  # [alerts] on_finish: the run summed up, its command run and POST sent
                self._publish.event(summary)
            self._publish.event(RunFinished(ok=ok, statuses=statuses))
            self._publish.quiet = True  # readers take run_finished to be the last event
            self._opened.rundir.flush()
            self._finished.set()
            if not self._closing:  # the session stays open (an app, a service): no validator idles in it
                self._validation.rest_soon()
