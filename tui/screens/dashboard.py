"""The dashboard: pipeline table, loss chart, device pane, log tail and event log of one run; for a sweep,
`t` swaps the pipeline table for the sweep's trials best first, the chart overlaying the best of them.

It reads a `RunState` (plain data) the app hands it and redraws at most `refresh_hz` times a second,
however many events arrive; keys become typed commands (`tui.commands`) posted as `CommandRequested`
for the app to carry out, after a check that the pipeline's state lets the command do something.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from ...engine.protocol.states import WorkerState
from ..commands import Checkpoint, Kill, Pause, PipelineCommand, Promote, Restart, Stacks, Stop, Unpause, refusal
from ..formats import gang_text, shown_path
from ..messages import CommandRequested
from ..runstate import RunState
from ..widgets.alert_banner import AlertBanner
from ..widgets.device_pane import DevicePane
from ..widgets.log_views import EventLog, LogTail
from ..widgets.loss_chart import GLYPHS, LossChart
from ..widgets.pipeline_table import PipelineTable
from ..widgets.sweep_table import SweepTable
from .dialogs import ConfirmScreen
from .log_view import LogScreen
from .ranks import RanksScreen


class DashboardScreen(Screen[None]):
    """One run, live or read-only; set `state` and call `data_changed()` when it moves on."""

    CSS_PATH = "dashboard.tcss"
    BINDINGS = [
        Binding("k", "kill", "kill"), Binding("r", "restart", "restart"),
        Binding("p", "pause", "pause"), Binding("s", "stop", "stop"),
        Binding("c", "checkpoint", "ckpt"), Binding("l", "full_log", "log"),
        Binding("d", "stacks", "stacks", show=False), Binding("w", "ranks", "ranks", show=False),
        Binding("t", "sweep", "sweep"), Binding("u", "promote", "promote", show=False),
        Binding("n", "app.launch_more", "more"),
        Binding("a", "chart('overlay')", "all", show=False), Binding("g", "chart('log_y')", "log y", show=False),
        Binding("e", "chart('smooth')", "ema", show=False), Binding("x", "chart('x_mode')", "x axis", show=False),
        Binding("o", "chart('clip')", "outliers", show=False), Binding("m", "chart_metric", "metric", show=False),
        Binding("escape", "app.back_to_picker", "back", show=False),
        Binding("question_mark", "app.help", "help"), Binding("q", "app.request_quit", "quit"),
    ]

    def __init__(self, state: RunState, refresh_hz: float = 2.0, clock: Callable[[], float] = time.time):
        super().__init__()
        self.state = state
        self.interval = 1.0 / refresh_hz  # seconds between redraws at most
        self.clock = clock
        self.selected: str | None = None
        self._pending = False  # a redraw is scheduled
        self._status_text = ""
        self._last = 0.0  # monotonic time of the last redraw
        self._seen = (-1, -1, -1)  # versions of rows, series, telemetry last drawn
        self.sweep_view = False  # the sweep's trials in place of the pipeline table (t)
        self._seen_trials = (-1, -1)  # versions of rows and trials the sweep view last drew
        self._mounted = False  # every widget it composed is mounted

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield AlertBanner(id="alert")
        yield PipelineTable(id="table")
        yield SweepTable(id="sweep")
        yield Static(id="reason")
        with Horizontal(id="middle"):
            yield LossChart(id="chart")
            yield DevicePane(id="devices")
        with Horizontal(id="bottom"):
            yield LogTail(id="logtail")
            yield EventLog(id="events")
        yield Footer()

    @property
    def redraw_pending(self) -> bool:
        """A redraw is scheduled and has not run yet."""
        return self._pending

    @property
    def drawn_versions(self) -> tuple[int, int, int]:
        """The state's rows, series and telemetry versions as of the last redraw (-1: to be redrawn)."""
        return self._seen

    def on_mount(self) -> None:
        self.query_one(PipelineTable).focus()
        self.set_interval(1.0, self._tick)  # elapsed and ETA move even when no event arrives
        self.redraw()

    def on_resize(self) -> None:
        self.set_class(self.size.width < 100, "-narrow")
        self.set_class(self.size.height < 30, "-short")
        self.query_one(Footer).compact = self.size.width < 100 and bool(self.state.trials)  # t and u fit too
        self._seen = (-1, self._seen[1], self._seen[2])  # the table picks its columns for the new width
        self.data_changed()

    # ------------------------------------------------------------ redraws
    def data_changed(self) -> None:
        """Schedule a redraw, coalescing everything that arrives before it."""
        if self._pending:
            return
        self._pending = True
        delay = self._last + self.interval - time.monotonic()
        if delay > 0:
            self.set_timer(delay, self.redraw)
        else:  # not set_timer(0): Textual's timer divides by its interval when it runs late
            self.call_later(self.redraw)

    def _tick(self) -> None:
        if self.state.alive_count and self.state.live:  # a read-only attach ticks too; a past run does not
            self._seen = (-1, self._seen[1], self._seen[2])
            self.data_changed()

    def redraw(self) -> None:
        self._pending = False
        if not self._mounted:
            # An attach's history is folded before the screen mounts, so the first redraw may select a row and
            # draw its chart, which its own container may not have mounted yet: then after the next refresh.
            self._mounted = bool(self.query(LossChart))
            if not self._mounted:
                self._pending = True
                self.call_after_refresh(self.redraw)
                return
        self._last = time.monotonic()
        state = self.state
        try:
            table = self.query_one(PipelineTable)
        except NoMatches:  # a redraw scheduled before the app began to close: its widgets are gone
            return
        if state.rows_version != self._seen[0]:
            table.update_rows(list(state.rows.values()), self.clock(), self.size.width, state.metric)
            if self.selected is None and table.selected is not None:
                self._select(table.selected)
            self._status()
            self.query_one(AlertBanner).show(state.alerts)
            self._say_reason()
        if state.series_version != self._seen[1]:
            chart = self.query_one(LossChart)
            chart.metric, chart.metric_is_loss = state.metric, state.metric_is_loss
            chart.redraw()
        if self.sweep_view and (state.rows_version, state.trials_version) != self._seen_trials:
            self._draw_sweep()
        if state.telemetry_version != self._seen[2]:
            self.query_one(DevicePane).show(state.telemetry, ended=state.finished)
        events = self.query_one(EventLog)
        if state.log_seq != events.last_seq:
            events.add(e for e in state.log if e.seq > events.last_seq)
        self._seen = (state.rows_version, state.series_version, state.telemetry_version)

    def _draw_sweep(self) -> None:
        """The selected trial's sweep (the session's first, for a pipeline of none) best first, the chart on the
        best `[sweep] overlay` of those with a result, and why the selected trial stands where it does."""
        state = self.state
        self._seen_trials = (state.rows_version, state.trials_version)
        sweep = state.sweep_for(self.selected)
        if sweep is None:
            return
        ranked = state.ranked(self.selected)
        top = [r.name for r in ranked if r.best is not None][:min(sweep.overlay, len(GLYPHS))]
        marks = {name: GLYPHS[i] for i, name in enumerate(top)}
        self.query_one(SweepTable).scheduler = sweep.scheduler
        self.query_one(SweepTable).update_trials(ranked, state.rows, self.clock(), self.size.width, sweep.ranks_by,
                                                 marks)
        chart = self.query_one(LossChart)
        if chart.only != top:
            chart.only, chart.series = top, state.charted()
            chart.redraw()
        self._say_reason()

    def _say_reason(self) -> None:
        trial = self.state.trials.get(self.selected or "")
        row = self.state.rows.get(self.selected or "")
        if not self.sweep_view:  # a gang's ranks, while it has something to say of them
            text = gang_text(row) if row is not None else ""
            self.set_class(bool(text), "-gang")
            text = f"[b]{escape(row.name)}[/b] {escape(text)}" if text and row is not None else ""
        elif trial is None:
            text = ""
        else:
            sweep = self.state.sweep_for(trial.name)
            promotes = sweep is not None and sweep.promotes
            pruned = self._state_of(trial.name) in (WorkerState.PRUNED, WorkerState.WAITING_AT_RUNG)
            # A pruned trial: the decision that pruned it (a later result may have been judged as it stopped).
            undecided = sweep.undecided if sweep is not None else ""
            why = next((r for r in reversed(trial.reasons) if not pruned or ": pruned: " in r),
                       trial.reasons[-1] if trial.reasons else undecided)
            hint = "  [dim](u promotes it)[/dim]" if pruned and promotes else ""
            text = f"[b]{escape(trial.name)}[/b] {escape(why)}{hint}"
        self.query_one("#reason", Static).update(text)

    def _status(self) -> None:
        state = self.state
        counts: dict[str, int] = {}
        for row in state.rows.values():
            key = ("cut short" if row.cut_short else "waiting at a rung" if row.state == WorkerState.WAITING_AT_RUNG
                   else row.state.value)
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no pipelines yet"
        tag = "  [reverse] read-only [/reverse]" if state.read_only else ""
        done = ("  [b]finished[/b]" if state.finished else
                "  [b]cut short, resumable[/b]" if state.cut_short else "")
        added = f" + {', '.join(state.added)}" if state.added else ""  # the run keeps its first config's name
        commit = f" [dim]{state.commit}[/dim]" if state.commit else ""  # the code's commit, "*" when dirty
        text = f"[b]{state.run_id or 'starting…'}{added}[/b]{commit}  {summary}{tag}{done}"
        if text != self._status_text:  # one line either way: no layout pass
            self._status_text = text
            self.query_one("#status", Static).update(text, layout=False)

    def _select(self, name: str) -> None:
        self.selected = name
        self._say_reason()
        chart = self.query_one(LossChart)
        if self.state.chart_metric not in self.state.chart_metrics(name):  # it reports no such value: its loss
            self.state.chart_metric, chart.quantity = "", "loss"
        chart.series, chart.selected = self.state.charted(), name
        chart.metric, chart.metric_is_loss = self.state.metric, self.state.metric_is_loss
        chart.redraw()
        self.query_one(LogTail).follow(self.state.log_path(name), f"log: {name}")

    def on_pipeline_table_selected(self, message: PipelineTable.Selected) -> None:
        if message.name != self.selected:
            self._select(message.name)

    # ------------------------------------------------------------ actions
    def _target(self) -> str | None:
        if self.selected is None:
            self.notify("no pipeline selected", severity="warning")
        return self.selected

    def _state_of(self, name: str) -> WorkerState:
        row = self.state.rows.get(name)
        return row.state if row is not None else WorkerState.QUEUED

    def _request(self, command: PipelineCommand) -> None:
        """Post the command, or say why it would do nothing to the pipeline as it is."""
        if self.state.read_only:
            self.notify("this view is read-only (attach without --read-only to steer): nothing can be changed"
                        if self.state.live else "a past run is read-only: nothing can be changed",
                        severity="warning", timeout=4)
            return
        if not self.state.live:  # its supervisor has gone, with the run's end or cut short
            self.notify(f"the run has ended and its supervisor with it: nothing can act on {command.pipeline} "
                        f"now ({self._carry_on(command.pipeline)})", severity="warning", timeout=8)
            return
        why = refusal(command, self._state_of(command.pipeline))
        if why is not None:
            self.notify(why, severity="warning", timeout=5)
            return
        self.post_message(CommandRequested(command))

    def _carry_on(self, name: str) -> str:
        """How a pipeline of a run that has ended is carried on: resume takes what did not end well, and an
        early-stopped or pruned one only when named."""
        state = self._state_of(name)
        run = shown_path(self.state.run_dir) if self.state.run_dir is not None else "RUN"
        if state == WorkerState.COMPLETED:
            return f"{name} completed"
        if state in (WorkerState.PRUNED, WorkerState.EARLY_STOPPED):
            return f"`torchherd resume {run} --only {name}` carries it on"
        return f"`torchherd resume {run}` carries on what did not finish"

    def action_restart(self) -> None:
        if (name := self._target()) is not None:
            self._request(Restart(name))

    def action_stop(self) -> None:
        if (name := self._target()) is not None:
            self._request(Stop(name))

    def action_checkpoint(self) -> None:
        if (name := self._target()) is not None:
            self._request(Checkpoint(name))

    def action_stacks(self) -> None:
        if (name := self._target()) is not None:
            self._request(Stacks(name))

    def action_pause(self) -> None:
        if (name := self._target()) is not None:
            paused = self._state_of(name) == WorkerState.PAUSED
            self._request(Unpause(name) if paused else Pause(name))

    def action_kill(self) -> None:
        name = self._target()
        if name is None:
            return
        command = Kill(name)
        state = self._state_of(name)
        if self.state.read_only or not self.state.live or refusal(command, state) is not None:
            self._request(command)  # says why not
            return
        if state == WorkerState.QUEUED:
            what = ("It has not started: it leaves the queue and ends as killed, with nothing lost; "
                    "r queues it again.")
        elif state == WorkerState.BACKOFF:
            what = "It is waiting to restart after a crash: the restart is cancelled and it ends as killed."
        else:
            what = ("Its processes get SIGTERM, then SIGKILL after the grace period; "
                    "progress since its last checkpoint is lost.")

        def answered(yes: bool | None) -> None:
            if yes:
                self._request(command)

        self.app.push_screen(ConfirmScreen(f"Kill [b]{escape(name)}[/b] ({state.value})?\n{what}", yes="Kill"),
                             answered)

    def action_full_log(self) -> None:
        name = self._target()
        path = self.state.log_path(name) if name else None
        if name is None:
            return
        if path is None:
            self.notify(f"{name} has no log yet: its run directory is not known", severity="warning")
            return
        self.app.push_screen(LogScreen(path, name))

    def action_ranks(self) -> None:
        name = self._target()
        if name is not None and name in self.state.rows:
            self.app.push_screen(RanksScreen(self.state.rows[name]))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "promote":  # only a sweep that prunes or pauses trials has them to promote
            sweep = self.state.sweep_for(self.selected)
            return sweep is not None and sweep.promotes
        if action == "sweep":
            return bool(self.state.trials)  # only a sweep has them: shown in the footer only then
        return True

    def action_sweep(self) -> None:
        """Swap the pipeline table for the sweep's trials, best first (and back)."""
        if not self.state.trials:  # no sweep: check_action keeps the key away
            return
        self.sweep_view = not self.sweep_view
        table, sweep = self.query_one(PipelineTable), self.query_one(SweepTable)
        self.set_class(self.sweep_view, "-sweep")
        chart = self.query_one(LossChart)
        if self.sweep_view:
            self._seen_trials = (-1, -1)
            self._draw_sweep()
            if self.selected is not None:
                sweep.select(self.selected)
            sweep.focus()
        else:
            chart.only = None
            chart.redraw()
            if self.selected in table.names:
                table.cursor = table.names.index(self.selected)
                table.on_resize()
                table.refresh()
            table.focus()

    def action_promote(self) -> None:
        if self.state.trials and (name := self._target()) is not None:
            self._request(Promote(name))

    def action_chart(self, what: str) -> None:
        chart = self.query_one(LossChart)
        if what == "x_mode":
            chart.x_mode = "time" if chart.x_mode == "step" else "step"
        else:
            setattr(chart, what, not getattr(chart, what))
        chart.series = self.state.charted()
        chart.redraw()

    def action_chart_metric(self) -> None:
        """The chart plots the next of what the selected pipeline reports: its loss, then each of its own values."""
        choices = self.state.chart_metrics(self.selected or "")
        if len(choices) == 1:
            self.notify(f"{self.selected or 'this pipeline'} reports no value but its loss yet", timeout=3)
            return
        now = self.state.chart_metric
        self.state.chart_metric = choices[(choices.index(now) + 1) % len(choices)] if now in choices else choices[1]
        chart = self.query_one(LossChart)
        chart.quantity = self.state.chart_metric or "loss"
        chart.series = self.state.charted()
        chart.redraw()
