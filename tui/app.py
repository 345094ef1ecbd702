"""The torchherd Textual app: picker first, then the dashboard of one session; `run_app` is the entry point.

The app owns a `Bridge` (the only holder of engine objects) and routes screen requests to it; quitting
while workers are alive asks whether to leave them running in their service, or stop them. Once the
terminal is back, `run_app` prints where each run lies and how to attach to it or carry it on.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from textual import work
from textual.app import App
from textual.binding import Binding

from ..engine.protocol.states import WorkerState
from .bridge import Bridge, SupervisorFactory, list_configs, replay_run, run_end
from .formats import shown_path
from .messages import CommandRequested, RunChanged
from .screens.dialogs import HelpScreen, QuitScreen
from .screens.picker import PickerScreen
from .start import STARTS_A_RUN, Attach, Open, Pick, Picked, Resume, Start
from .steering import script_steering

if TYPE_CHECKING:
    from .runstate import RunState
    from .screens.dashboard import DashboardScreen

# The first screen is drawn before the rest loads: the config schema (pydantic) and the check load in the
# picker's thread workers, the dashboard when a run is shown, the supervisor's side only in its service.


def default_folder() -> Path:
    """Where `torchherd` with no argument looks for configs: ./sample_configs when there is one (a checkout of
    torchherd), else this folder when it holds configs (a project with its own)."""
    bundled = Path("sample_configs")
    return bundled if bundled.is_dir() or not list_configs(Path(".")) else Path(".")


class AppOptions(TypedDict, total=False):
    """`TorchherdApp`'s keywords, for what builds one and passes them on."""

    factory: SupervisorFactory | None
    refresh_hz: float
    clock: Callable[[], float]
    start: Start


class TorchherdApp(App[int]):
    """Pick a config, launch it, watch and steer it."""

    TITLE = "torchherd"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+q,ctrl+c", "request_quit", "quit", priority=True, show=False)]

    def __init__(self, target: Path | None = None, runs_dir: Path | None = None, *,
                 factory: SupervisorFactory | None = None, refresh_hz: float = 2.0,
                 clock: Callable[[], float] = time.time, start: Start = Pick()):
        super().__init__()
        self.start = start  # what to do at once: the picker, or a launch, resume or attach
        target = Path(target) if target is not None else default_folder()
        self.directory = target if not target.is_file() else target.parent
        self.initial = target if target.is_file() else None  # the picker's config, highlighted
        self.runs_dir = runs_dir
        self.refresh_hz, self.clock = refresh_hz, clock
        self.bridge = Bridge(lambda: self.post_message(RunChanged()), runs_dir, factory)
        self.dashboard: DashboardScreen | None = None
        self.stopping: Literal["", "graceful", "kill"] = ""  # how quitting goes, once it has begun
        self.hung_up = False  # SIGHUP: the terminal went away
        self.detached = False  # quit leaving the runs going
        self.attached = False  # watching a run another command started: SIGTERM ends only this client
        self.launched = False  # it started or resumed a run (from the picker too): its exit status is the run's

    # ------------------------------------------------------------ lifecycle
    def on_mount(self) -> None:
        self.install_signal_handlers()
        match self.start:
            case Pick():
                self.push_screen(self._picker(adding=False), self._picked)
            case Resume():
                self.directory = default_folder()  # `n` then picks configs from here
                self.call_later(self._picked, self.start)
            case _:
                self.call_later(self._picked, self.start)

    def install_signal_handlers(self) -> None:
        """SIGHUP (the SSH session went away) ends only this client of a run that has a service of its own;
        SIGTERM stops the runs this app started gracefully, then exits."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
                pass

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGHUP:
            self.hung_up = True
        if self.bridge.remote and (sig == signal.SIGHUP or self.attached):
            self.call_later(self._detach_and_exit)  # the run has a service of its own: only this client ends
            return
        self.call_later(self._stop_and_exit, True)

    def _leave(self, code: int) -> None:
        from .headless import EXIT_STOPPED

        if self.hung_up:
            # The terminal is gone: restoring it would block Textual's writer for ever. The
            # runs are stopped and the run directory closed, so nothing is lost by leaving now.
            os._exit(EXIT_STOPPED)
        self.exit(code)

    async def on_unmount(self) -> None:
        if self.bridge.remote:  # an exit we did not plan (an exception): the run's service goes on
            await self.bridge.detach()
        elif self.bridge.live:  # the run lives in this process: leave no worker behind
            await self.bridge.shutdown(graceful=False, timeout=5.0)

    def _picker(self, adding: bool) -> PickerScreen:
        runs = self.runs_dir if self.runs_dir is not None else Path("runs")
        return PickerScreen(self.directory, runs, self.initial, adding=adding, launch_runs_dir=self.runs_dir)

    async def _picked(self, picked: Picked | None) -> None:
        match picked:
            case None:
                return
            case Open(run_dir):
                self._replay(run_dir)
                return
            case Attach(run_dir, read_only):
                await self._attach_run(run_dir, read_only)
                return
        from ..engine import ConfigError

        adding = self.bridge.live
        try:
            if isinstance(picked, Resume):
                await self.bridge.resume(picked.run_dir, list(picked.only) or None)
                names = list(self.bridge.state.rows)
            else:
                names = await self.bridge.launch(picked.config)
        except ConfigError as exc:
            self.notify("\n".join(str(p) for p in exc.problems) or str(exc), title="cannot launch",
                        severity="error", timeout=10)
            if not adding:
                self.push_screen(self._picker(adding=False), self._picked)
            return
        except Exception as exc:  # the engine refused: say so and stay usable
            self.notify(f"{type(exc).__name__}: {exc}", title="cannot launch", severity="error", timeout=10)
            if not adding:
                self.push_screen(self._picker(adding=False), self._picked)
            return
        self.launched = True
        if adding:
            self.notify(f"added {', '.join(names)}", timeout=4)
        else:
            self._show_dashboard(self.bridge.state)

    async def _attach_run(self, run_dir: Path, read_only: bool = False) -> None:
        from ..engine import run_held

        self.attached = True
        try:
            await self.bridge.attach(run_dir, read_only=read_only)
        except Exception as exc:
            if not run_held(run_dir) and (run_dir / "events.jsonl").is_file():  # it has ended: show how
                self.attached = False
                self.notify(f"{run_dir.name} is no longer live: shown as it ended", title="past run", timeout=6)
                self._replay(run_dir)
                return
            # starting, refused us, or unreadable: say so, stay usable
            self.notify(f"{exc}", title="cannot attach", severity="error", timeout=10)
            self.push_screen(self._picker(adding=False), self._picked)
            return
        self._show_dashboard(self.bridge.state)

    def _show_dashboard(self, state: RunState) -> None:
        from .screens.dashboard import DashboardScreen

        self.dashboard = DashboardScreen(state, self.refresh_hz, self.clock)
        self.push_screen(self.dashboard)

    @work(thread=True, exclusive=True, exit_on_error=False, group="replay")
    def _replay(self, run_dir: Path) -> None:
        try:
            state = replay_run(run_dir)
        except Exception as exc:
            self.call_from_thread(self.notify, f"cannot read {run_dir}: {exc}", severity="error")
            self.call_from_thread(self.push_screen, self._picker(adding=False), self._picked)
            return
        self.call_from_thread(self._open_replay, state)

    def _open_replay(self, state: RunState) -> None:
        self.bridge.show(state)
        self._show_dashboard(state)

    # ------------------------------------------------------------ messages
    def on_run_changed(self, message: RunChanged) -> None:
        if self.dashboard is not None and self.dashboard.state is not self.bridge.state and self.bridge.live:
            self.dashboard.state = self.bridge.state
        if self.dashboard is not None and self.dashboard.is_attached:
            self.dashboard.data_changed()

    def on_command_requested(self, message: CommandRequested) -> None:
        try:
            self.bridge.command(message.command)
        except (KeyError, RuntimeError, ValueError) as exc:
            self.notify(str(exc).strip("'\""), severity="warning", timeout=4)
        else:
            run_dir = self.bridge.state.run_dir
            script = script_steering(run_dir, message.command.pipeline) if run_dir is not None else None
            promise = message.command.doing(script)
            # what a script cannot do is said long enough to be read (the events pane may scroll it away)
            self.notify(promise, timeout=8 if script is not None and not script.client else 3)

    # ------------------------------------------------------------ actions
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(picker=isinstance(self.screen, PickerScreen)))

    def action_launch_more(self) -> None:
        if not self.bridge.live:
            self.notify("a past run is read-only: quit and launch from the picker", severity="warning")
            return
        if self.bridge.state.read_only:
            self.notify("this view is read-only (attach without --read-only to add configs)", severity="warning")
            return
        self.push_screen(self._picker(adding=True), self._picked)

    async def action_back_to_picker(self) -> None:
        """From the dashboard: a run still going stays live under the picker (escape comes back, enter adds
        a config to it); a finished or past run is closed and the full picker, past runs too, comes back."""
        if self.dashboard is None or self.screen is not self.dashboard:
            return
        rows = self.bridge.state.rows.values()
        if self.bridge.live and any(not r.state.final for r in rows):
            self.push_screen(self._picker(adding=True), self._picked)
            return
        if self.bridge.live:
            await self.bridge.close()  # every pipeline is final: nothing is stopped by this
        self.pop_screen()
        self.dashboard = None
        self.push_screen(self._picker(adding=False), self._picked)

    async def action_request_quit(self) -> None:
        if self.stopping:
            self.notify("still stopping; press q again to kill now" if self.stopping == "graceful" else
                        "killing workers…", severity="warning")
            if self.stopping == "graceful":
                self.stopping = "kill"
                await self._stop_and_exit(False)
            return
        if not self.bridge.alive:
            await self._stop_and_exit(True)
            return
        if self.bridge.remote and self.bridge.state.read_only:  # it can stop nothing: it only leaves
            await self._detach_and_exit()
            return
        rows = self.bridge.state.rows.values()
        running = [r.name for r in rows if not r.state.final and r.state != WorkerState.QUEUED]
        queued = [r.name for r in rows if r.state == WorkerState.QUEUED]

        async def answered(choice: str | None) -> None:
            if choice == "stop":
                await self._stop_and_exit(True)
            elif choice == "detach":
                await self._detach_and_exit()

        self.push_screen(QuitScreen(running, can_detach=self.bridge.remote, queued=queued), answered)

    async def _detach_and_exit(self) -> None:
        """Leave the runs going in their service; say how to come back."""
        await self.bridge.detach()
        self.detached = True
        self._leave(0)

    async def _stop_and_exit(self, graceful: bool) -> None:
        if self.bridge.alive:
            self.stopping = "graceful" if graceful else "kill"
            self.notify("stopping every pipeline gracefully (checkpoints first)…" if graceful else
                        "killing every pipeline…", timeout=30)
            self._end_session(graceful)
        else:
            await self.bridge.shutdown(graceful=True, timeout=5.0)
            self._leave(0)

    @work(exclusive=True, exit_on_error=False, group="shutdown")
    async def _end_session(self, graceful: bool) -> None:
        await self.bridge.shutdown(graceful=graceful, timeout=30.0 if graceful else 5.0)
        self._leave(0)


def run_app(target: Path | None = None, runs_dir: Path | None = None, start: Start = Pick()) -> int:
    """Open the app on a config directory (or one config), doing `start` at once. Returns the exit status:
    for a launch or a resume (`start`'s or the picker's), 0 only if every pipeline completed."""
    app = TorchherdApp(target, runs_dir, start=start)
    app.run()
    return report_runs(app, isinstance(start, STARTS_A_RUN) or app.launched)


def report_runs(app: TorchherdApp, launch: bool) -> int:
    """After the app has exited: say how each run of its session ended and where it is. Returns the exit
    status: with `launch`, headless's for the same outcome (0 all completed, 1 failed or killed, 3 stopped)."""
    if app.detached:
        for run_dir in app.bridge.run_dirs:
            where = shown_path(run_dir)
            print(f"torchherd: left run {run_dir.name} going\n  run directory: {where}\n"
                  f"  watch it: torchherd attach {where}\n  stop it: torchherd stop {where}")
        return 0
    ends = [run_end(run_dir) for run_dir in app.bridge.run_dirs]
    for end in ends:  # the terminal is ours again
        print("\n".join(end.lines))
    if app.return_code:
        return app.return_code
    if launch:  # as headless would: 1 if any run failed or was killed, 3 if any was stopped, else 0
        codes = {end.status for end in ends} or {1}
        return 1 if 1 in codes else 3 if 3 in codes else 0
    return 0
