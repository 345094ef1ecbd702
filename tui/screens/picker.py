"""The config picker: configs from a directory and past runs, the selected config highlighted and checked.

It dismisses with ("launch", path) for a config that passed the check, ("open", run_dir) for a past
run, or None. An invalid config cannot be launched: enter says why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from torchherd.tui.bridge import ConfigCheck, PastRun, check_config_file, list_configs, list_past_runs

PickerResult = tuple[str, Path] | None


class PickerScreen(Screen[PickerResult]):
    """Choose a config to launch (or add to the session), or a past run to open."""

    CSS_PATH = "picker.tcss"
    BINDINGS = [Binding("escape", "back", "back"), Binding("r", "resume", "resume run"),
                Binding("question_mark", "app.help", "help"), Binding("q", "app.request_quit", "quit")]

    @dataclass
    class Listed(Message):
        configs: list[Path]
        runs: list[PastRun]

    @dataclass
    class Checked(Message):
        check: ConfigCheck

    def __init__(self, directory: Path, runs_dir: Path, selected: Path | None = None, adding: bool = False):
        super().__init__()
        self.directory, self.runs_dir, self.initial, self.adding = directory, runs_dir, selected, adding
        self.configs: list[Path] = []
        self.runs: list[PastRun] = []
        self.checks: dict[Path, ConfigCheck] = {}
        self.launch_when_checked: Path | None = None

    def compose(self) -> ComposeResult:
        title = "launch more: add a config to this session" if self.adding else "torchherd: pick a config"
        yield Static(f"[b]{title}[/b]  [dim]{self.directory}[/dim]", id="title")
        with Horizontal():
            yield OptionList(Option("loading…", disabled=True), id="choices")
            with Vertical(id="detail"):
                yield VerticalScroll(Static(id="source"), id="source-scroll")
                yield VerticalScroll(Static(id="verdict"), id="verdict-scroll")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#source-scroll").border_title = "config"
        self.query_one("#verdict-scroll").border_title = "check"
        self._list()

    @work(thread=True, exclusive=True, exit_on_error=False, group="list")
    def _list(self) -> None:
        runs = [] if self.adding else list_past_runs(self.runs_dir)
        self.post_message(self.Listed(list_configs(self.directory), runs))

    def on_picker_screen_listed(self, message: Listed) -> None:
        self.configs, self.runs = message.configs, message.runs
        choices = self.query_one("#choices", OptionList)
        choices.clear_options()
        choices.add_option(Option(Text("configs", style="bold"), disabled=True))
        if not self.configs:
            choices.add_option(Option(Text(f"  no .toml files in {self.directory}", style="dim"), disabled=True))
        for i, path in enumerate(self.configs):
            choices.add_option(Option(f"  {path.name}", id=f"cfg:{i}"))
        if self.runs:
            choices.add_option(Option(Text("past runs", style="bold"), disabled=True))
            for i, run in enumerate(self.runs):
                when = time.strftime("%m-%d %H:%M", time.localtime(run.started))
                status = f"{run.status}: r resumes" if run.resumable else run.status
                choices.add_option(Option(f"  {run.run_id}\n    [dim]{when} {status}[/dim]", id=f"run:{i}"))
        first = 1
        if self.initial is not None and self.initial.resolve() in [p.resolve() for p in self.configs]:
            first = 1 + [p.resolve() for p in self.configs].index(self.initial.resolve())
        if self.configs or self.runs:
            choices.highlighted = first if self.configs else 2
        choices.focus()

    def _chosen(self, option_id: str | None) -> tuple[str, object] | None:
        if not option_id:
            return None
        kind, _, index = option_id.partition(":")
        return (kind, self.configs[int(index)] if kind == "cfg" else self.runs[int(index)])

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        chosen = self._chosen(event.option.id)
        if chosen is None:
            return
        kind, item = chosen
        if kind == "cfg":
            self.launch_when_checked = None
            self.query_one("#verdict", Static).update(Text("checking…", style="dim"))
            check = self.checks.get(item)
            if check is not None:
                self._show(check)
            self._check(item)
        else:
            self._show_run(item)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        chosen = self._chosen(event.option.id)
        if chosen is None:
            return
        kind, item = chosen
        if kind == "run":
            self.dismiss(("open", item.path))
            return
        check = self.checks.get(item)
        if check is None:
            self.launch_when_checked = item  # enter came before the check finished
            return
        self._launch(check)

    def _launch(self, check: ConfigCheck) -> None:
        if check.ok:
            self.dismiss(("launch", check.path))
        else:
            count = len(check.problems)
            self.notify(f"{check.path.name} cannot be launched: {count} problem{'s' if count != 1 else ''} "
                        "(see the check pane)", severity="error", timeout=6)

    @work(thread=True, exclusive=True, exit_on_error=False, group="check")
    def _check(self, path: Path) -> None:
        self.post_message(self.Checked(check_config_file(path)))

    def on_picker_screen_checked(self, message: Checked) -> None:
        check = message.check
        self.checks[check.path] = check
        highlighted = self.query_one("#choices", OptionList).highlighted_option
        chosen = self._chosen(highlighted.id if highlighted else None)
        if chosen and chosen[1] == check.path:
            self._show(check)
        if self.launch_when_checked == check.path:
            self.launch_when_checked = None
            self._launch(check)

    def _show(self, check: ConfigCheck) -> None:
        source = Syntax(check.text, "toml", theme="ansi_dark", line_numbers=True, background_color="default")
        self.query_one("#source", Static).update(source)
        self.query_one("#source-scroll").border_title = check.path.name
        if check.ok:
            verdict = Text("✓ ready: enter launches", style="bold green")
            for line in check.lines:
                verdict.append("\n  " + line)
        else:
            count = len(check.problems)
            verdict = Text(f"✗ cannot launch: {count} problem{'s' if count != 1 else ''}", style="bold red")
            for problem in check.problems:
                verdict.append("\n  " + problem, style="red")
        self.query_one("#verdict", Static).update(verdict)

    def _show_run(self, run: PastRun) -> None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        self.query_one("#source", Static).update(Text(
            f"run {run.run_id}\nstarted {when}\nstatus {run.status}\npipelines: {', '.join(run.pipelines)}"))
        self.query_one("#source-scroll").border_title = "past run"
        hint = "enter opens it read-only in the dashboard"
        if run.resumable and not self.adding:
            hint = (f"r resumes {', '.join(run.to_resume)} from their checkpoints (completed pipelines "
                    "stay as they are); enter opens it read-only")
        self.query_one("#verdict", Static).update(Text(hint, style="dim"))

    def action_resume(self) -> None:
        """Carry on the highlighted run's pipelines that did not complete, from their checkpoints."""
        choices = self.query_one(OptionList)
        option = choices.get_option_at_index(choices.highlighted) if choices.highlighted is not None else None
        chosen = self._chosen(option.id if option is not None else None)
        if chosen is None or chosen[0] != "run":
            return
        run = chosen[1]
        if not run.resumable or self.adding:
            self.notify(f"{run.run_id} is {run.status}: nothing to resume", timeout=4)
            return
        self.dismiss(("resume", run.path))

    def action_back(self) -> None:
        if self.adding:
            self.dismiss(None)
        else:
            self.app.action_request_quit()
