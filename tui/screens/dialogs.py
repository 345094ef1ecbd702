"""Modal questions and help: confirm an action, decide what quitting does to live runs, list the keys.

Each is a `ModalScreen[T]` that dismisses with its answer; every choice has a key.
"""
from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

PICKER_HELP = """\
[b]Picker keys[/b]
  ↑/↓     select a config or a past run
  enter   launch the config / open the run read-only
  r       resume a past run that did not finish, from
          its checkpoints (offered on a past run)
  escape  launch more only: back to the run
  ?       this help
  q       quit
"""

HELP = """\
[b]Dashboard keys[/b]
  ↑/↓     select a pipeline
  k       kill it (asks first)
  r       restart it from its last checkpoint
  p       pause / unpause it
  s       stop it gracefully: checkpoint, then exit
  c       write a checkpoint now
  l       its full log (escape comes back)
  d       its processes write their Python stacks to
          its log, nothing stops (for one that makes no
          step); the triage under the table and in the
          event log says where each rank is, the odd
          one first (a stall does this by itself)
  w       a gang's ranks: each one's time per batch
          against its peers' median, and where each
          was at the last triage
  n       launch more: add a config to this session
  t       a sweep: its trials best first, with their
          values, state, best metric and rung, and why
          the selected one stands there; the chart
          overlays the best 4 (1●, 2▲, ...); t again
          shows the pipelines
  u       promote the selected trial of a sweep: a
          pruned one trains on from its checkpoint; it
          is never pruned again while the run lives
  a       chart: selected pipeline / all overlaid
  g       chart: log scale on / off
  e       chart: EMA smoothing on / off
  x       chart: x axis step / wall time
  o       chart: clip outliers (drawn ↑ on the top row,
          "↑ clipped" in the legend) / show every point
  m       chart: the next value the pipeline reports
          (its loss, then its own: my_loss, train_acc)
  tab     move focus; ↑/↓ and page keys scroll the
          focused pane (devices, logs); the wheel too
  escape  back to the picker; a live run keeps going
          (escape there returns), a finished one closes
  ?       this help
  q       quit; with runs alive it asks: leave them
          running (detach), stop them, or cancel

[b]Table columns[/b]
  try     which start of the worker this is: 1 first,
          2 after a restart (r or a crash); "4 ↻3/3"
          means 3 restarts after crashes so far, of a
          budget of 3 (restart.max_restarts)
  epoch   epoch in progress / all (from 1), then steps
  val     the newest validation score of the metric
          named in the header; best: the best so far
  state   "stall 6m": no step for that long; "r1 1.6x":
          rank 1 of a gang is 1.6x slower than its
          peers ([alerts] straggler). A gang's ranks'
          spread is under the table; an alert is a
          banner above it (and the terminal bell)

[b]Chart[/b]
  ⠤⠒ train loss; ◆ validation results. A metric that
  is not a loss (accuracy, ...) gets a strip of its
  own under the loss plot. Overlaid (a), each
  pipeline has a glyph (● ▲ ■ …) at its curve's end
  and on its results, listed in the legend below.
  Points far above most of the curve (the first
  steps' loss, a spike) go off the top of the y axis
  unless o is pressed: ↑ marks where, and the legend
  says "↑ clipped".
"""


class ConfirmScreen(ModalScreen[bool]):
    """Yes or no about one action; `y`/enter confirm, `n`/escape cancel."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS = [Binding("y,enter", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str, yes: str = "Yes") -> None:
        super().__init__()
        self.question, self.yes = question, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="question")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="error")
                yield Button("Cancel (n)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


# What a graceful stop keeps, truthfully for every kind: a script without torchherd.client saves only if it
# catches its stop signal or waits for its own save (stop_mode); the event log says which, per pipeline.
GRACEFUL = "a task checkpoints; a script gets its stop signal and keeps what it saves"


class QuitScreen(ModalScreen[str]):
    """Live runs are still going: leave them running ("detach", where their service allows), stop them
    gracefully and quit ("stop"), or not ("cancel")."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS = [Binding("d", "answer('detach')", "detach"),
                Binding("s,enter", "answer('stop')", "stop and quit"),
                Binding("c,n,escape", "answer('cancel')", "cancel")]

    def __init__(self, running: list[str], can_detach: bool = False, queued: Sequence[str] = ()) -> None:
        super().__init__()
        self.running, self.queued = running, list(queued)
        self.can_detach = can_detach

    def action_answer(self, value: str) -> None:
        if value == "detach" and not self.can_detach:
            return  # this run lives in the app's process
        self.dismiss(value)

    def compose(self) -> ComposeResult:
        both = self.running + self.queued
        names = ", ".join(both[:6]) + (" …" if len(both) > 6 else "")
        count = len(self.running)
        head = f"{count} pipeline{'s are' if count != 1 else ' is'} still running" if count else "Nothing runs"
        head += f", {len(self.queued)} queued" if self.queued else ""  # a queued one has nothing to lose
        with Vertical(classes="dialog"):
            yield Static(f"[b]{head}[/b]\n{names}\n\n"
                         + ("Leave them running (attach again with `torchherd attach`), or stop them "
                            f"gracefully ({GRACEFUL}) and quit?" if self.can_detach else
                            f"Stop them gracefully ({GRACEFUL}) and quit?"), classes="question")
            with Horizontal(classes="buttons"):
                if self.can_detach:
                    yield Button("Detach (d)", id="detach", variant="primary")
                yield Button("Stop & quit (s)", id="stop", variant="warning")
                yield Button("Cancel (c)", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")


class HelpScreen(ModalScreen[None]):
    """Every key and column, in one place; scrolls with ↑/↓ and page keys when the terminal is short."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS = [Binding("escape,question_mark,q,enter", "close", "close")]

    def __init__(self, picker: bool = False) -> None:
        super().__init__()
        self.picker = picker  # opened from the picker: its keys first

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help", id="help-text"):
            yield Static(f"{PICKER_HELP}\n{HELP}" if self.picker else f"{HELP}\n{PICKER_HELP}")

    def on_mount(self) -> None:
        text = self.query_one("#help-text", VerticalScroll)
        text.border_subtitle = "↑/↓ pgup pgdn scroll · escape closes"
        text.focus()  # so the arrow and page keys scroll it

    def action_close(self) -> None:
        self.dismiss(None)
