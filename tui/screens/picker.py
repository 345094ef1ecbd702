"""The config picker: configs from a directory and past runs, the selected config highlighted and checked.

It dismisses with what was picked (tui/start.py): `Launch` for a config that passed the check, `Open` for a
past run, `Attach` for a live one, `Resume` for an unfinished one, or None. The check is the one `torchherd
run` makes: the config, then every task built once in a fresh process (cached until a file changes), so a
config `torchherd run` would refuse cannot be launched here either: enter says why.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Group
from rich.padding import Padding
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, get_current_worker

from ..bridge import ConfigCheck, PastRun, check_config_file, failed_check, list_configs, list_past_runs
from ..start import Attach, Launch, Open, Picked, Resume


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def build_tasks(path: Path, check: ConfigCheck, worker: Worker[None],
                progress: Callable[[int, int], object]) -> ConfigCheck | None:
    """`check` with the verdict of building `path`'s tasks in a fresh process; None if cancelled.

    Blocking: call it from a thread worker. `progress(built, total)` is called as tasks finish.
    """
    from ...engine import ConfigError, ProbeCancelled, load_config, pending_jobs, probe_tasks

    try:
        config = load_config(path)
    except ConfigError as exc:  # changed on disk since the fast check
        return ConfigCheck(path, check.text, False, problems=[str(p) for p in exc.problems])
    total = len(pending_jobs(config))
    if total:
        progress(0, total)
    try:
        problems = probe_tasks(config, on_progress=progress, cancelled=lambda: worker.is_cancelled)
    except ProbeCancelled:
        return None
    except OSError as exc:  # could not start the probe process at all
        return ConfigCheck(path, check.text, False, problems=[f"{path}: cannot build the tasks: {exc}"])
    if problems:
        return ConfigCheck(path, check.text, False, problems=[str(p) for p in problems])
    return check



class Indented:
    """`head`, then each line indented two cells with its wrapped rest indented too; `str()` is the plain text."""

    def __init__(self, head: Text, lines: list[str], style: str = ""):
        self.head, self.lines, self.style = head, lines, style

    def __rich__(self) -> Group:
        return Group(self.head, *(Padding(Text(line, style=self.style), (0, 0, 0, 2)) for line in self.lines))

    def __str__(self) -> str:
        return "\n".join([self.head.plain, *("  " + line for line in self.lines)])

EDITS_EVERY = 1.0  # seconds between looks at whether the highlighted config was saved again


def _stamp(path: Path) -> tuple[int, int]:
    """What changes when a file is saved: its modification time and size ((0, 0) once it is gone)."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


class PickerScreen(Screen[Picked | None]):
    """Choose a config to launch (or add to the session), or a past run to open."""

    CSS_PATH = "picker.tcss"
    BINDINGS = [Binding("escape", "back", "back"), Binding("r", "resume", "resume run"),
                Binding("question_mark", "app.help", "help"), Binding("q", "app.request_quit", "quit")]

    @dataclass
    class Listed(Message):
        configs: list[Path]
        runs: list[PastRun]
        missing: bool = False  # the config folder does not exist

    @dataclass
    class Checked(Message):
        """The whole verdict on a config: the fast check and, if that passed, its tasks built."""

        check: ConfigCheck

    @dataclass
    class Building(Message):
        """The fast check passed; `built` of `total` tasks are built so far."""

        check: ConfigCheck
        built: int
        total: int

    def __init__(self, directory: Path, runs_dir: Path, selected: Path | None = None, adding: bool = False,
                 launch: bool = False, launch_runs_dir: Path | None = None):
        super().__init__()
        self.directory, self.runs_dir, self.initial, self.adding = directory, runs_dir, selected, adding
        self.launch_runs_dir = launch_runs_dir  # where a launch puts its run (None: the config's runs_dir)
        self.launch = launch  # `torchherd run CONFIG`: launch `selected` as soon as it passes the check
        self.configs: list[Path] = []
        self.listed = False  # the folder was listed once (looked at again for configs written meanwhile)
        self.runs: list[PastRun] = []
        self.checks: dict[Path, ConfigCheck] = {}  # final verdicts
        self.building: dict[Path, PickerScreen.Building] = {}  # configs whose tasks are being built now
        self.launch_when_checked: Path | None = None
        self.stamps: dict[Path, tuple[int, int]] = {}  # (mtime, size) of each config when last checked

    def compose(self) -> ComposeResult:
        if self.launch and self.initial is not None:
            title = f"torchherd run: checking {self.initial.name}, then launching it"
        else:
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
        # After the first frame: listing past runs and checking the first config load the engine, whose
        # imports in a thread would hold up the frame this screen draws first.
        self.call_after_refresh(self._list)
        self.set_interval(EDITS_EVERY, self._check_again_if_edited)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Only keys that do something are offered: escape goes back to the run that launch more came from
        (the first picker has nothing behind it; q quits), r resumes the highlighted past run, or says why
        it cannot (launch more adds configs to a live session: resuming another run is not on offer)."""
        if action == "back":
            return self.adding
        if action == "resume":
            return not self.adding and self._highlighted_run()
        return True

    def _highlighted_run(self) -> bool:
        try:
            choices = self.query_one(OptionList)
        except Exception:  # not composed yet
            return False
        option = choices.get_option_at_index(choices.highlighted) if choices.highlighted is not None else None
        chosen = self._chosen(option.id if option is not None else None)
        return chosen is not None and chosen[0] == "run"

    @work(thread=True, exclusive=True, exit_on_error=False, group="list")
    def _list(self) -> None:
        runs = [] if self.adding else list_past_runs(self.runs_dir)
        self.post_message(self.Listed(self._configs(), runs, missing=not self.directory.is_dir()))

    def _configs(self) -> list[Path]:
        """The folder's configs, and the one named on the command line (it may have no .toml suffix)."""
        configs = list_configs(self.directory)
        if self.initial is not None and self.initial.is_file() and \
                self.initial.resolve() not in [p.resolve() for p in configs]:
            configs.append(self.initial)
        return configs

    def on_picker_screen_listed(self, message: Listed) -> None:
        choices = self.query_one("#choices", OptionList)
        was = choices.highlighted_option
        kept = self._chosen(was.id if was is not None else None)  # listed again: the cursor stays on it
        self.configs, self.runs, self.listed = message.configs, message.runs, True
        choices.clear_options()
        choices.add_option(Option(Text("configs", style="bold"), disabled=True))
        if message.missing:
            choices.add_option(Option(Text(f"  {self.directory}/ does not exist", style="dim"), disabled=True))
            self.query_one("#verdict", Static).update(Text(
                f"There is no folder {self.directory} here. Name a folder of configs (torchherd DIR) "
                "or one config (torchherd CONFIG).", style="yellow"))
        elif not self.configs:
            choices.add_option(Option(Text(f"  no .toml files in {self.directory}", style="dim"), disabled=True))
        for i, path in enumerate(self.configs):
            choices.add_option(Option(f"  {path.name}", id=f"cfg:{i}"))
        if self.runs:
            heading = Text("past runs", style="bold")
            if any(run.resumable for run in self.runs):
                heading.append("  ↻ r resumes", style="dim")  # said once: on every line it wrapped
            choices.add_option(Option(heading, disabled=True))
            room = choices.content_region.width - 4  # its indent, and a column for a scroll bar yet to come
            for i, run in enumerate(self.runs):
                when = time.strftime("%m-%d %H:%M", time.localtime(run.started))
                status = f"{run.status} ↻" if run.resumable else run.status
                line = f"[dim]{when}[/dim] [b green]live[/]" if run.live else \
                    f"[dim]{when} {status}[/dim]"
                # A long id is cut with "…" (wrapped, its last letters stood alone on the next line).
                shown = run.run_id if room < 12 or len(run.run_id) <= room else run.run_id[:room - 1] + "…"
                choices.add_option(Option(f"  {shown}\n    {line}", id=f"run:{i}"))
        first = 1
        resolved = [p.resolve() for p in self.configs]
        if self.initial is not None and self.initial.resolve() in resolved:
            first = 1 + resolved.index(self.initial.resolve())
            if self.launch:
                self.launch_when_checked = self.configs[first - 1]
        if self.configs or self.runs:
            choices.highlighted = first if self.configs else 2
        if kept is not None and kept[1] in (self.configs if kept[0] == "cfg" else self.runs):
            items = list[Path | PastRun](self.configs if kept[0] == "cfg" else self.runs)
            choices.highlighted = choices.get_option_index(f"{kept[0]}:{items.index(kept[1])}")
        choices.focus()

    def _chosen(self, option_id: str | None) -> tuple[str, Path | PastRun] | None:
        if not option_id:
            return None
        kind, _, index = option_id.partition(":")
        return (kind, self.configs[int(index)] if kind == "cfg" else self.runs[int(index)])

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.refresh_bindings()  # r is offered on a past run only
        chosen = self._chosen(event.option.id)
        if chosen is None:
            return
        _, item = chosen
        if self.launch_when_checked != item:
            self.launch_when_checked = None  # enter was for another config
        if isinstance(item, Path):
            self.query_one("#verdict", Static).update(Text("checking…", style="dim"))
            check, building = self.checks.get(item), self.building.get(item)
            if check is not None:
                self._show(check)
            elif building is not None:
                self._show_building(building)
            self.stamps[item] = _stamp(item)
            self._check(item)
        else:
            self._show_run(item)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        chosen = self._chosen(event.option.id)
        if chosen is None:
            return
        _, item = chosen
        if isinstance(item, PastRun):
            self.dismiss(Attach(item.path) if item.live and not self.adding else Open(item.path))
            return
        check = self.checks.get(item)
        if check is None:
            self.launch_when_checked = item  # enter came before the check finished
            building = self.building.get(item)
            if building is not None:
                self.notify(f"{item.name} launches once its {_plural(building.total, 'task')} "
                            f"{'is' if building.total == 1 else 'are'} built", timeout=4)
            return
        self._launch(check)

    def _launch(self, check: ConfigCheck) -> None:
        if check.ok:
            self.dismiss(Launch(check.path))
        else:
            self.notify(f"{check.path.name} cannot be launched: {_plural(len(check.problems), 'problem')} "
                        "(see the check pane)", severity="error", timeout=6)

    @work(thread=True, exclusive=True, exit_on_error=False, group="check")
    def _check(self, path: Path) -> None:
        try:
            self._check_now(path)
        except Exception as exc:  # noqa: BLE001 (a fault in the check: said in its pane, never "checking…" for ever)
            self.post_message(self.Checked(failed_check(path, exc)))

    def _check_now(self, path: Path) -> None:
        worker = get_current_worker()
        fast = check_config_file(path, self.launch_runs_dir)
        if not fast.ok and self.launch and path == self.initial:
            # `torchherd run CONFIG` on an invalid config: launch nothing, and leave at once (the command
            # prints the problems once the terminal is back) rather than wait in a picker nobody asked for.
            self.app.call_from_thread(self.app.exit)
            return
        check = fast
        if fast.ok:  # the fast check passed: now what `torchherd run` does, build every task once
            built = build_tasks(path, fast, worker,
                                lambda done, total: self.post_message(self.Building(fast, done, total)))
            if built is None:  # cancelled: another config was highlighted
                return
            check = built
        self.post_message(self.Checked(check))

    def _check_again_if_edited(self) -> None:
        """The highlighted config was saved since its check: check it again, as moving onto it would. A config
        written into (or removed from) the folder meanwhile: list the folder again."""
        if self.listed and {p.resolve() for p in self._configs()} != {p.resolve() for p in self.configs}:
            self._list()
        path = self._highlighted_config()
        if path is None or self.stamps.get(path) in (None, stamp := _stamp(path)):
            return
        self.stamps[path] = stamp
        self.checks.pop(path, None)
        self.query_one("#verdict", Static).update(Text("checking… (the file changed)", style="dim"))
        self._check(path)

    def _highlighted_config(self) -> Path | None:
        option = self.query_one("#choices", OptionList).highlighted_option
        chosen = self._chosen(option.id if option else None)
        return chosen[1] if chosen and isinstance(chosen[1], Path) else None

    def on_picker_screen_building(self, message: PickerScreen.Building) -> None:
        self.building[message.check.path] = message
        self.checks.pop(message.check.path, None)  # a file changed: the old verdict no longer holds
        if self._highlighted_config() == message.check.path:
            self._show_building(message)

    def on_picker_screen_checked(self, message: Checked) -> None:
        check = message.check
        self.checks[check.path] = check
        self.building.pop(check.path, None)
        if self._highlighted_config() == check.path:
            self._show(check)
        if self.launch_when_checked == check.path:
            self.launch_when_checked = None
            self._launch(check)

    def _show_source(self, check: ConfigCheck) -> None:
        from rich.syntax import Syntax  # pygments: loaded once a config is shown, not before the first frame

        source = Syntax(check.text, "toml", theme="ansi_dark", line_numbers=True, background_color="default")
        self.query_one("#source", Static).update(source)
        self.query_one("#source-scroll").border_title = check.path.name

    def _show_building(self, building: PickerScreen.Building) -> None:
        self._show_source(building.check)
        head = Text(f"… checking {_plural(building.total, 'task')}: building each once in a fresh process "
                    f"({building.built} of {building.total} done)", style="bold yellow")
        self.query_one("#verdict", Static).update(Indented(head, building.check.lines))

    def _show(self, check: ConfigCheck) -> None:
        self._show_source(check)
        if check.ok and self.adding:  # where it would go alone is not where it goes in a session already busy
            verdict = Indented(Text("✓ ready: enter adds it to this session", style="bold green"), [
                "its pipelines queue for free devices; a name the session has already gets a number (a -> a-2)",
                *check.lines])
        elif check.ok:
            verdict = Indented(Text("✓ ready: enter launches", style="bold green"), check.lines)
        else:
            verdict = Indented(Text(f"✗ cannot launch: {_plural(len(check.problems), 'problem')}", style="bold red"),
                               [str(p) for p in check.problems], style="red")
        self.query_one("#verdict", Static).update(verdict)

    def _show_run(self, run: PastRun) -> None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started))
        self.query_one("#source", Static).update(Text(
            f"run {run.run_id}\nstarted {when}\nstatus {'live' if run.live else run.status}\n"
            f"pipelines: {', '.join(run.pipelines)}"))
        self.query_one("#source-scroll").border_title = "past run"
        hint = "enter opens it read-only in the dashboard"
        if run.live and not self.adding:
            hint = "live: enter attaches to it (its whole history, then live; quitting can leave it running)"
        elif run.resumable and not self.adding:
            hint = (f"r resumes {', '.join(run.to_resume)} from their checkpoints (completed pipelines "
                    "stay as they are); enter opens it read-only")
        self.query_one("#verdict", Static).update(Text(hint, style="dim"))

    def action_resume(self) -> None:
        """Carry on the highlighted run's pipelines that did not complete, from their checkpoints."""
        choices = self.query_one(OptionList)
        option = choices.get_option_at_index(choices.highlighted) if choices.highlighted is not None else None
        chosen = self._chosen(option.id if option is not None else None)
        run = chosen[1] if chosen is not None else None
        if not isinstance(run, PastRun):
            return
        if not run.resumable or self.adding:
            self.notify(f"{run.run_id} is {run.status}: nothing to resume", timeout=4)
            return
        self.dismiss(Resume(run.path))

    def action_back(self) -> None:
        self.dismiss(None)  # offered only over a live run (check_action)
