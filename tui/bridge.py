"""The one module of the app that holds live engine objects: the session's Supervisor and its telemetry
sampler, plus the blocking loaders for configs and past runs (call those from thread workers).

Screens read `Bridge.state` (plain data) and send typed commands (`tui.commands`); nothing else in
`tui/` calls the engine.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .sessions import ServiceSession, Session

if TYPE_CHECKING:  # the config's schema (pydantic) loads when a config is launched, not with the first screen
    from ..engine import EventStream, RunConfig, Supervisor
    from .commands import PipelineCommand
    from .runstate import RunState

SupervisorFactory = Callable[["RunConfig", "Path | None"], "Session | Supervisor"]  # a Supervisor runs in-process


def service_session(config: RunConfig, runs_dir: Path | None) -> Session:
    """The default: the run in a torchherd service of its own, which outlives the app."""
    return ServiceSession(Path(config.source), runs_dir)


# ------------------------------------------------------------ blocking loaders


@dataclass(frozen=True)
class ConfigCheck:
    """A config file's text and the verdict of `torchherd check` on it."""

    path: Path
    text: str
    ok: bool
    lines: list[str] = field(default_factory=list)  # what would launch where
    problems: list[str] = field(default_factory=list)


def check_config_file(path: Path, runs_dir: Path | None = None) -> ConfigCheck:
    """Read and validate a config the way `torchherd check` does, its runs going to `runs_dir` (None: the
    config's runs_dir) (blocking: use a thread)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return ConfigCheck(path, "", False, problems=[f"{path}: cannot read: {exc.strerror}"])
    from ..engine import check_config

    report = check_config(path, runs_dir=runs_dir)
    return ConfigCheck(path, text, report.ok, list(report.lines), [str(p) for p in report.problems])


def failed_check(path: Path, exc: BaseException) -> ConfigCheck:
    """The verdict on a config whose check itself failed (a fault in torchherd, not in the config): nothing
    launches, and the pane says where the traceback is to be had."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        text = ""
    return ConfigCheck(path, text, False, problems=[
        f"{path}: torchherd could not check it: {type(exc).__name__}: {exc} (a fault in torchherd, not in the "
        f"config; `torchherd check {path}` prints its traceback)"])


FOLD_AT_ONCE = 50_000  # history events folded before the dashboard first draws (an attach's history in short
# is a few thousand); a longer one goes on in the consumer, in bursts that leave keys and redraws their turn
NOT_CONFIGS = {"pyproject.toml", "Cargo.toml", "poetry.toml", "ruff.toml", ".ruff.toml"}  # a project's own tools


def list_configs(directory: Path) -> list[Path]:
    """The TOML configs in a directory, by name (a project's pyproject.toml and friends are not configs; nor are a
    run directory's saved copies, whose relative paths point into the run directory: they fail to launch)."""
    if (directory / "events.jsonl").is_file():
        return []
    try:
        return sorted(p for p in directory.iterdir() if p.suffix == ".toml" and p.is_file()
                      and p.name not in NOT_CONFIGS)
    except OSError:
        return []


@dataclass(frozen=True)
class PastRun:
    """A past run as the picker lists it."""

    run_id: str
    path: Path
    started: float  # seconds since the epoch
    status: str
    pipelines: tuple[str, ...]
    resumable: bool = False  # some pipeline did not complete, and nobody runs it
    to_resume: tuple[str, ...] = ()  # the pipelines resuming would carry on
    live: bool = False  # its supervisor runs now: enter attaches


def list_past_runs(runs_dir: Path) -> list[PastRun]:
    """Past runs under `runs_dir`, newest first (blocking: use a thread)."""
    from ..engine import list_runs

    try:
        return [PastRun(r.run_id, r.path, r.started, r.status, tuple(r.pipelines), r.resumable, r.to_resume, r.live)
                for r in list_runs(runs_dir)]
    except OSError:
        return []


def with_saved_metric(state: RunState, run_dir: Path) -> RunState:
    """`state` judging validation by the metric the run's config names (its config.json), not the default."""
    try:
        configs = json.loads((run_dir / "config.json").read_text())
        validation = (configs[0] if isinstance(configs, list) else configs).get("validation", {})
        state.metric = validation.get("metric", state.metric)
        state.metric_mode = validation.get("metric_mode", state.metric_mode)
    except (OSError, ValueError, AttributeError, IndexError):
        pass
    return state


def replay_run(run_dir: Path) -> RunState:
    """A read-only RunState rebuilt from a run directory's events (blocking: use a thread)."""
    from ..engine import read_events, run_held
    from .ranking import saved_sweeps
    from .runstate import RunState

    state = with_saved_metric(RunState(read_only=True, run_dir=run_dir, run_id=run_dir.name), run_dir)
    for sweep in saved_sweeps(run_dir):
        state.add_sweep(sweep)
    last = 0.0  # the time of its newest event
    for event in read_events(run_dir):
        state.apply(event)
        last = getattr(event, "time", last)
    state.run_dir = run_dir  # the directory as found now, whatever the run called it then
    if state.run_id and not state.finished and not run_held(run_dir):  # its supervisor died under it
        state.supervisor_gone(last)
    state.read_only = True
    return state


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, as printed once the app has exited."""

    completed: bool  # every pipeline trained to its limits
    lines: list[str]  # outcome, run directory, and how to carry it on when it can be
    status: int = 1  # the exit status headless gives a run that ended so (tui/headless.py exit_status)


def _saved(checkpoints: Path) -> bool:
    """Whether a pipeline's checkpoints/ holds a file to carry it on from."""
    try:
        return any(p.is_file() for p in checkpoints.iterdir())
    except OSError:
        return False


def run_end(run_dir: Path) -> RunEnd:
    """How the run in `run_dir` ended, where it is, how to carry it on (blocking: reads events.jsonl)."""
    from ..engine import summarize
    from .formats import shown_path
    from .headless import EXIT_FAILED, exit_status

    where = shown_path(run_dir)
    summary = summarize(run_dir) if (run_dir / "events.jsonl").exists() else None
    if summary is None:
        return RunEnd(False, [f"torchherd: run directory {where}"], EXIT_FAILED)
    lines = [f"torchherd: run {summary.run_id} {summary.status}"]
    from .ranking import sweep_ranking

    ranking = sweep_ranking(run_dir, summary.labels)  # a sweep's trials, best first, as headless ends it
    if ranking:
        lines += ["  " + line for line in ranking]  # each trial's state in it: no line of states as well
    elif summary.statuses:
        lines.append("  " + ", ".join(f"{name} {label}" for name, label in summary.labels.items()))
    lines.append(f"  run directory: {where}")
    if summary.resumable:
        left = summary.to_resume
        fix = "once what failed is fixed, " if any(summary.statuses.get(n) == "failed" for n in left) else ""
        saved = any(_saved(run_dir / name / "checkpoints") for name in left)
        how = "from its checkpoints" if saved else "from the start (nothing was saved)"
        lines.append(f"  carry it on {fix}{how}: torchherd resume {where}")
    return RunEnd(summary.status == "completed", lines,
                  exit_status(summary.statuses) if summary.statuses else EXIT_FAILED)


# ------------------------------------------------------------ the live session


class Bridge:
    """Owns the session: starts the supervisor, folds its events into `state`, forwards commands."""

    def __init__(self, on_change: Callable[[], object], runs_dir: Path | None = None,
                 factory: SupervisorFactory | None = None):
        self.on_change = on_change  # called on the event loop after each batch of events
        self.runs_dir = runs_dir
        self._state: RunState | None = None  # made on first use: the run state's modules load after the first frame
        self._factory = factory or service_session
        self._session: Session | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._closed = False
        self._signalled = False  # a change signal is scheduled
        self.run_dirs: list[Path] = []  # every session's run directory, for the exit message

    def remember(self, run_dir: Path) -> None:
        """Keep a session's run directory for the exit message: once, though it was stopped and carried on."""
        if run_dir.resolve() not in self.run_dirs:
            self.run_dirs.append(run_dir.resolve())

    @property
    def state(self) -> RunState:
        """What the screens show: the live session's, a replayed run's, or an empty one."""
        if self._state is None:
            from .runstate import RunState

            self._state = RunState()
        return self._state

    @state.setter
    def state(self, state: RunState) -> None:
        self._state = state

    @property
    def live(self) -> bool:
        """A supervisor session exists and has not been shut down."""
        return self._session is not None and not self._closed

    @property
    def alive(self) -> bool:
        """Some worker process exists."""
        return self.live and self._session is not None and self._session.alive

    @property
    def remote(self) -> bool:
        """The session's run lives in a service of its own: the app can leave it running."""
        return self.live and self._session is not None and self._session.remote

    async def launch(self, path: Path) -> list[str]:
        """Start a session with this config, or add it to the running one; raises ConfigError."""
        from ..engine import load_config
        from .ranking import SavedSweep
        from .runstate import RunState

        config = load_config(path)
        if self.live and self._session is not None:
            names = await self._session.add_config(config)
            self.state.add_sweep(SavedSweep.of(config, names))  # its sweep view too (t on one of its trials)
            return names
        if self._closed:
            raise RuntimeError("the session has ended")
        made = self._factory(config, self.runs_dir)
        session = made if isinstance(made, Session) else Session(made)
        state = RunState(metric=config.validation.metric, metric_mode=config.validation.metric_mode)
        state.add_sweep(SavedSweep.of(config))
        await self._start(session, state)
        return [p.name for p in config.pipelines]

    async def resume(self, run_dir: Path, only: list[str] | None = None) -> None:
        """Carry on a run's pipelines that did not complete (or those in `only`) from their checkpoints,
        in a service of its own; its history comes first, as an attach's does."""
        from .runstate import RunState

        if self.live or self._closed:
            raise RuntimeError("a session is already running")
        await self._start(ServiceSession(resume=run_dir, only=only), with_saved_metric(RunState(), run_dir))

    async def attach(self, run_dir: Path, read_only: bool = False) -> None:
        """Watch (and, unless `read_only`, steer) a run that is already live: its history, then live events."""
        from .runstate import RunState

        if self.live or self._closed:
            raise RuntimeError("a session is already running")
        await self._start(ServiceSession(attach=run_dir, read_only=read_only),
                          with_saved_metric(RunState(read_only=read_only), run_dir))

    async def detach(self) -> None:
        """Leave a remote session's run going and end this app's part in it."""
        if self.live and self._session is not None:
            await self._session.detach()
        self._closed = True
        if self._consumer is not None:
            self._consumer.cancel()

    async def _start(self, session: Session, state: RunState) -> None:
        state.live = True
        self.state = state
        await session.start()  # spawns processes: must run on this loop's thread
        state.run_dir = session.run_dir  # as this app finds it, which its events may not say
        if not state.trials:  # resumed or attached: its sweeps as its run directory saved them
            from .ranking import saved_sweeps

            for sweep in await asyncio.to_thread(saved_sweeps, session.run_dir):
                state.add_sweep(sweep)
        self._session = session
        self.remember(session.run_dir)
        stream = session.subscribe()
        for event in stream.waiting(FOLD_AT_ONCE):  # the history, folded before the first frame: it draws whole
            state.apply(event)
        self._consumer = asyncio.get_running_loop().create_task(self._consume(stream))

    def show(self, state: RunState) -> None:
        """Show a replayed run (only when no live session)."""
        if not self.live:
            self.state = state

    def command(self, command: PipelineCommand) -> None:
        """Carry out a command; raises KeyError for an unknown pipeline, RuntimeError when read-only, ValueError
        when the run refuses it at once (a promote in a run that prunes nothing)."""
        from .commands import Checkpoint, Kill, Pause, Promote, Restart, Stacks, Stop, Unpause

        if not self.live or self._session is None:
            raise RuntimeError("this run is read-only" if self.state.read_only else "no run is active")
        run, name = self._session.run, command.pipeline
        match command:
            case Kill():
                run.kill(name)
            case Restart():
                run.restart(name)
            case Pause():
                run.pause(name)
            case Unpause():
                run.unpause(name)
            case Stop():
                run.stop(name)
            case Checkpoint():
                run.checkpoint(name)
            case Stacks():
                run.stacks(name)
            case Promote():
                run.promote(name)
            case _:
                raise TypeError(f"not a pipeline command: {command!r}")

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """Stop (gracefully: checkpoint first) or kill every worker and end the session."""
        if self._session is None or self._closed:
            self._closed = True
            return
        await self._session.shutdown(graceful=graceful, timeout=timeout)
        self._closed = True
        if self._consumer is not None:
            try:
                await asyncio.wait_for(self._consumer, 5.0)  # the stream ends once the supervisor closes
            except (TimeoutError, asyncio.CancelledError):
                self._consumer.cancel()
        self.on_change()

    async def close(self) -> None:
        """End a session whose pipelines are all final, so that the next launch starts a new one."""
        await self.shutdown(graceful=True, timeout=5.0)
        self._session, self._consumer, self._closed = None, None, False
        self._state = None

    # ------------------------------------------------------------ internals
    async def _consume(self, stream: EventStream) -> None:
        # Queued events are taken without suspending, so one burst is applied before the
        # call_soon'd signal runs: a burst costs one RunChanged, not one per event.
        loop = asyncio.get_running_loop()
        burst = 0
        async for event in stream:
            self.state.apply(event)
            if not self._signalled:
                self._signalled = True
                loop.call_soon(self._signal)
            burst += 1
            if burst % 2000 == 0:
                await asyncio.sleep(0)  # a very long burst must not starve keys and redraws
        if self.remote and isinstance(self._session, ServiceSession):  # its service ended, or the connection dropped
            if not self.state.finished:
                from ..engine.protocol.messages import Notice

                outcome, why = await self._session.why_ended()
                if outcome == "cut short":  # no row may say it runs: nothing does
                    self.state.supervisor_gone(time.time())
                self.state.apply(Notice(level="error", text=why))
            self.state.live = False  # nothing will carry out a command now
        self._signal()

    def _signal(self) -> None:
        self._signalled = False
        self.on_change()
