"""The table of pipelines: one line each, drawn with the line API and repainted row by row.

Only rows whose text changed are repainted (a DataTable re-renders every cell on any update, which
cost most of the app's CPU under a stream of step events). Below 118 columns it shows fewer columns.
A `node` column appears only when some pipeline runs on a cluster node other than this machine
(then the full set needs 11 more columns), so local runs look as they always did.
Every value is written to fit its column (numbers give up digits, never characters); the `val`
header names the validation metric (`best` is the best of it so far).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Unpack

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from ...engine.protocol.progress import PipelineProgress
from ...engine.protocol.states import WorkerState, ended_label
from ..formats import fmt_count, fmt_device, fmt_duration, fmt_num, fmt_quiet, gang_size, metric_label
from . import WidgetOptions

S = WorkerState
WIDE = 118  # terminal columns from which every column is shown
STALLED_STYLE = "bold yellow"
STATE_STYLE = {
    S.RUNNING: "green", S.STARTING: "cyan", S.QUEUED: "dim", S.PAUSED: "yellow", S.STOPPING: "yellow",
    S.KILLING: "red", S.HUNG: "bold red", S.BACKOFF: "yellow", S.COMPLETED: "bold green", S.STOPPED: "blue",
    S.EARLY_STOPPED: "green", S.PRUNED: "dim green",
    S.WAITING_AT_RUNG: "dim cyan", S.EXPLOITING: "dim cyan", S.YIELDING: "dim",  # resting: a sweep's, between tries
    S.FAILED: "bold red", S.KILLED: "red",
}


def fmt_progress(row: PipelineProgress, width: int) -> str:
    frac = row.fraction
    if frac is None:
        return "-"
    bar = width - 5  # cells for the bar; the rest is " 42%"
    filled = int(frac * bar + 0.5)
    return "█" * filled + "░" * (bar - filled) + f"{frac * 100:4.0f}%"


def fmt_epoch_step(row: PipelineProgress, width: int) -> str:
    """'2/8 1,234': the epoch in progress counted from 1, of all, then the optimizer steps so far; '11 1,234'
    when the total is unknown (a script without max_epochs)."""
    if not row.epochs_total and not (row.step or row.epoch):
        return "-"
    epochs = f"{row.epoch_number}/{row.epochs_total}" if row.epochs_total else str(row.epoch_number)
    return f"{epochs} {fmt_count(row.step, width - len(epochs) - 1)}"


def fmt_try(row: PipelineProgress, width: int) -> str:
    """'2' for the second start; '4 ↻3/3' once crashes cost restarts: 3 of a budget of 3 spent."""
    if not row.attempt:
        return "-"
    if not row.restarts:
        return str(row.attempt)
    short = f"{row.attempt} ↻{row.restarts}"
    full = f"{short}/{row.restart_budget}" if row.restart_budget is not None else short
    return full if len(full) <= width else short


def state_text(row: PipelineProgress, now: float, width: int = 0) -> str:
    """Its state as people read it: 'early stop' and 'never ran' once ended, 'stall 6m' while it makes no step,
    'r1 1.6x' while a straggler slows its gang, 'waiting at rung 2' ('waits r2' within `width` cells) for a
    sweep's trial waiting to be promoted; 'cut short' once its supervisor has died under it."""
    if row.cut_short:
        return "cut short"
    if row.stalled_since is not None and row.state in (WorkerState.STARTING, WorkerState.RUNNING):
        return f"stall {fmt_quiet(now - row.stalled_since)}"
    if row.straggler and row.state == WorkerState.RUNNING:  # a gang's rank behind the others: "r1 1.6x"
        return row.straggler
    text = ended_label(row.state, row.rung, row.never_ran)
    if width and len(text) > width and row.state == WorkerState.WAITING_AT_RUNG and row.rung is not None:
        return f"waits r{row.rung:g}"
    return text


@dataclass(frozen=True)
class Column:
    """One column: its key, header, width in cells, how a row's value is written, and whether narrow
    terminals keep it."""

    key: str
    label: str
    width: int
    text: Callable[[PipelineProgress, float, int], str]
    compact: bool


# The widths plus a space each fit WIDE - 2 (the border); the compact ones fit 78 (80 columns): what people act
# on stays (which device, how many restarts spent, the state, where it is, its losses, when it ends); the
# progress bar, best, samples/s and elapsed go.
COLUMNS = (
    Column("name", "pipeline", 14, lambda r, now, w: r.name, True),
    Column("device", "device", 6, lambda r, now, w: gang_size(r, w) or fmt_device(r.device, w), True),
    Column("state", "state", 10, lambda r, now, w: state_text(r, now, w), True),
    Column("attempt", "try", 7, lambda r, now, w: fmt_try(r, w), True),
    Column("step", "epoch step", 12, lambda r, now, w: fmt_epoch_step(r, w), True),
    Column("progress", "progress", 10, lambda r, now, w: fmt_progress(r, w), False),
    Column("loss", "loss", 7, lambda r, now, w: fmt_num(r.train_loss, w), True),
    Column("val", "val", 8, lambda r, now, w: fmt_num(r.val_value, w), True),
    Column("best", "best", 8, lambda r, now, w: fmt_num(r.best, w), False),
    Column("rate", "smp/s", 6, lambda r, now, w: fmt_count(r.samples_per_s, w) if r.samples_per_s else "-", False),
    Column("elapsed", "elapsed", 7, lambda r, now, w: fmt_duration(r.elapsed(now)), False),
    Column("eta", "eta", 6, lambda r, now, w: fmt_duration(r.eta()), True),
)
# Only while some pipeline runs on another cluster node; placed after the device column.
NODE = Column("node", "node", 10, lambda r, now, w: r.node or "-", False)
# What a table narrower than every column keeps besides the compact ones, first kept first, while it fits.
OPTIONAL = ("node", "progress", "elapsed", "best", "rate")
NAME_MAX = 32  # cells the name column may widen to, before those
WAITING = "waiting"  # a row's value (no column): what a queued pipeline waits for, drawn from its epoch column on
# An elastic gang's device cell gives its size, current of MAX: "2/4" in the device column's 6 cells, and
# "2/4 ranks" where it widens to RANKS_WIDTH (only with an elastic gang in the table, so others look as they did).
RANKS = "ranks"  # a row's value (no column): an elastic gang's size as a widened device column says it
RANKS_WIDTH = 9  # "2/4 ranks": the device column's width, while some gang is elastic and the cells allow


def _fit(text: str, width: int) -> str:
    """`text` in exactly `width` cells and a space; a name too long ends in '…'."""
    if cell_len(text) > width:
        text = set_cell_size(text, width - 1) + "…"
    return set_cell_size(text, width) + " "


class PipelineTable(Widget, can_focus=True):
    """Pipelines as rows; the cursor row is the selection, reported with `Selected`."""

    DEFAULT_CSS = """
    PipelineTable { height: auto; max-height: 12; border: round $panel-lighten-2; }
    PipelineTable:focus { border: round $accent; }
    """
    BINDINGS = [Binding("up", "move(-1)", show=False), Binding("down", "move(1)", show=False),
                Binding("home", "move(-1000000)", show=False), Binding("end", "move(1000000)", show=False)]

    @dataclass
    class Selected(Message):
        """The cursor moved to another pipeline."""

        name: str

    def __init__(self, **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(**kwargs)
        self.border_title = "pipelines"
        self.names: list[str] = []
        self.cells: dict[str, dict[str, str]] = {}
        self.states: dict[str, WorkerState] = {}
        self.stalled: dict[str, bool] = {}  # flagged for making no step
        self.metric = "val_loss"  # named in the val column's header
        self.cursor = 0
        self.top = 0  # first row shown
        self.compact = False  # the terminal is narrower than WIDE: not every column fits
        self.nodes = False  # some pipeline runs on another node: the node column is shown
        self.elastic = False  # some gang is elastic: the device column widens to say its size where it fits
        self.longest = 0  # cells of the longest pipeline name
        # (width, nodes, longest, compact, elastic), columns
        self._layout: tuple[tuple[object, ...], list[Column]] = ((), [])

    # ------------------------------------------------------------ API
    @property
    def row_count(self) -> int:
        return len(self.names)

    @property
    def selected(self) -> str | None:
        return self.names[self.cursor] if self.names else None

    def cell(self, name: str, key: str) -> str:
        return self.cells[name][key]

    def label(self, column: Column) -> str:
        """A column's header; `val` names the metric: `val acc` for "accuracy", `val loss` for "val_loss"."""
        if column.key == "val":
            return f"{column.label} {metric_label(self.metric)}"
        return column.label

    def update_rows(self, rows: list[PipelineProgress], now: float, terminal_width: int,
                    metric: str = "val_loss") -> None:
        """Take new values; repaint only the rows whose text changed."""
        nodes = self.nodes or any(r.node for r in rows)  # once shown it stays: no column jumping about
        elastic = self.elastic or any(r.elastic for r in rows)
        compact = terminal_width < WIDE + (NODE.width + 1 if nodes else 0)
        relayout = compact != self.compact or len(rows) != len(self.names) or metric != self.metric or \
            nodes != self.nodes or elastic != self.elastic
        self.compact, self.metric, self.nodes, self.elastic = compact, metric, nodes, elastic
        first = not self.names
        for row in rows:
            values = {c.key: c.text(row, now, c.width) for c in (*COLUMNS, NODE)}
            values[WAITING] = row.waiting if row.state == WorkerState.QUEUED else ""
            values[RANKS] = gang_size(row, RANKS_WIDTH)
            self.states[row.name] = row.state
            # flagged: no step for a while, or a straggler in its gang ("r1 1.6x")
            self.stalled[row.name] = values["state"].startswith("stall ") or values["state"] == (row.straggler or None)
            old = self.cells.get(row.name)
            if old is None:
                self.names.append(row.name)
                if cell_len(row.name) > self.longest:
                    self.longest, relayout = cell_len(row.name), True
            elif old == values:
                continue
            self.cells[row.name] = values
            if not relayout and old is not None and values[WAITING] != old.get(WAITING):
                self._refresh_row(self.names.index(row.name))
            elif not relayout and old is not None:
                self._refresh_cells(self.names.index(row.name), [k for k in values if values[k] != old[k]])
        if relayout:
            self.refresh(layout=True)
        self._say_rows()
        if first and self.names:
            self.post_message(self.Selected(self.names[0]))

    # ------------------------------------------------------------ drawing
    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.names) + 1

    def _visible_rows(self) -> int:
        return max(1, self.size.height - 1)

    def _say_rows(self) -> None:
        """'rows 5-8 of 12' under the table while some rows do not fit; nothing when all do."""
        n, visible = len(self.names), self._visible_rows()
        self.border_subtitle = f"rows {self.top + 1}-{min(n, self.top + visible)} of {n} ↑↓" \
            if self.size.height and n > visible else ""

    def on_resize(self) -> None:
        visible = self._visible_rows()
        self.top = max(0, min(self.top, len(self.names) - visible, self.cursor))  # keep the cursor in view
        if self.cursor >= self.top + visible:
            self.top = self.cursor - visible + 1
        self._say_rows()

    def _refresh_cells(self, index: int, keys: list[str]) -> None:
        """Repaint just these cells of a row: the terminal then gets a few short spans, not the line."""
        y = index - self.top + 1
        if not 1 <= y < self.size.height:
            return
        x = 0
        for column in self.visible_columns():
            if column.key in keys:
                self.refresh(Region(x, y, column.width + 1, 1))
            x += column.width + 1

    def _refresh_row(self, index: int) -> None:
        y = index - self.top + 1
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def visible_columns(self) -> list[Column]:
        """The columns shown at the current width, left to right: every one people act on, then those of
        OPTIONAL that fit; the name column widened into the cells left over, up to the longest name."""
        key = (self.size.width, self.nodes, self.longest, self.compact, self.elastic)
        if key != self._layout[0]:
            self._layout = (key, self._lay_out(*key))
        return self._layout[1]

    def _lay_out(self, width: int, nodes: bool, longest: int, compact: bool, elastic: bool) -> list[Column]:
        if not width:  # not laid out yet: as the terminal's width says
            return [c for c in (*COLUMNS[:2], *([NODE] if nodes else []), *COLUMNS[2:]) if c.compact or not compact]
        shown = {c.key for c in COLUMNS if c.compact}
        used = sum(c.width + 1 for c in COLUMNS if c.compact)
        name = COLUMNS[0]
        # Names first (rows people cannot tell apart help nobody: a sweep's trials differ at their ends).
        grow = min(name.width + width - used, longest, NAME_MAX) - name.width
        if grow > 0:
            name, used = replace(name, width=name.width + grow), used + grow
        by_key = {c.key: c for c in (*COLUMNS, NODE)}
        for key in OPTIONAL:
            if (key != "node" or nodes) and used + by_key[key].width + 1 <= width:
                shown.add(key)
                used += by_key[key].width + 1
        columns = [name, *(c for c in COLUMNS[1:] if c.key in shown)]
        widen = RANKS_WIDTH - by_key["device"].width  # the last of the spare cells: every other column comes first
        if elastic and used + widen <= width:
            columns = [replace(c, width=RANKS_WIDTH) if c.key == "device" else c for c in columns]
        if "node" in shown:
            columns.insert(2, NODE)  # after pipeline and device
        return columns

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            text = "".join(_fit(self.label(c), c.width) for c in self.visible_columns())
            return Strip([Segment(text[:width].ljust(width), base + Style(bold=True, dim=True))], width)
        index = self.top + y - 1
        if index >= len(self.names):
            return Strip.blank(width, base)
        name = self.names[index]
        values = self.cells[name]
        selected = index == self.cursor
        row_style = base + Style(reverse=True) if selected and self.has_focus else \
            base + Style(bold=True) if selected else base
        segments, x = [], 0
        for column in self.visible_columns():
            if values.get(WAITING) and column.key == "step":  # a queued row says what it waits for, over the rest
                segments.append(Segment(_fit(values[WAITING], max(1, width - x - 1)), row_style + Style(dim=True)))
                break
            x += column.width + 1
            wide = column.key == "device" and values.get(RANKS) and cell_len(values[RANKS]) <= column.width
            text = _fit(values[RANKS] if wide else values[column.key], column.width)
            state_style = STALLED_STYLE if self.stalled.get(name) else STATE_STYLE.get(self.states[name], "")
            style = row_style + Style.parse(state_style) if column.key == "state" else row_style
            segments.append(Segment(text, style))
        return Strip(segments).crop_extend(0, width, base)

    # ------------------------------------------------------------ cursor
    def action_move(self, delta: int) -> None:
        if not self.names:
            return
        old = self.cursor
        self.cursor = max(0, min(len(self.names) - 1, self.cursor + delta))
        if self.cursor == old:
            return
        visible = self._visible_rows()
        if self.cursor < self.top or self.cursor >= self.top + visible:
            self.top = max(0, min(self.cursor, self.cursor - visible + 1))
            self.refresh()
            self._say_rows()
        else:
            self._refresh_row(old)
            self._refresh_row(self.cursor)
        self.post_message(self.Selected(self.names[self.cursor]))

    def on_focus(self) -> None:
        self._refresh_row(self.cursor)

    def on_blur(self) -> None:
        self._refresh_row(self.cursor)
