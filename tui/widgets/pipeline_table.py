"""The table of pipelines: one line each, drawn with the line API and repainted row by row.

Only rows whose text changed are repainted (a DataTable re-renders every cell on any update, which
cost most of the app's CPU under a stream of step events). Below 118 columns it shows fewer columns.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from torchherd.tui.runstate import PipelineRow

WIDE = 118  # terminal columns from which every column is shown
STATE_STYLE = {
    "running": "green", "starting": "cyan", "queued": "dim", "paused": "yellow", "stopping": "yellow",
    "killing": "red", "backoff": "yellow", "completed": "bold green", "stopped": "blue",
    "failed": "bold red", "killed": "red",
}


def fmt_loss(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g}"[:7]


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}:{s % 60:02d}"


def fmt_progress(row: PipelineRow, width: int = 5) -> str:
    frac = row.progress
    if frac is None:
        return "-"
    filled = int(frac * width + 0.5)
    return "█" * filled + "░" * (width - filled) + f"{frac * 100:4.0f}%"


def fmt_count(n: int) -> str:
    if n < 100_000:
        return f"{n:,}"
    return f"{n / 1000:.0f}k" if n < 10_000_000 else f"{n / 1e6:.1f}M"


def fmt_epoch_step(row: PipelineRow) -> str:
    if not row.epochs_total:
        return f"- {fmt_count(row.step)}" if row.step else "-"
    return f"{min(row.epoch + 1, row.epochs_total)}/{row.epochs_total} {fmt_count(row.step)}"


# (key, label, width, formatter, shown below WIDE); the widths plus a space each fit 118 columns
COLUMNS = (
    ("name", "pipeline", 14, lambda r, now: r.name, True),
    ("device", "device", 7, lambda r, now: r.device or "-", False),
    ("state", "state", 9, lambda r, now: r.state, True),
    ("attempt", "try", 5, lambda r, now: f"{r.attempt}/{r.restarts}", False),
    ("step", "epoch step", 12, lambda r, now: fmt_epoch_step(r), True),
    ("progress", "progress", 10, lambda r, now: fmt_progress(r), True),
    ("loss", "loss", 7, lambda r, now: fmt_loss(r.train_loss), True),
    ("val", "val", 7, lambda r, now: fmt_loss(r.val_loss), True),
    ("best", "best", 7, lambda r, now: fmt_loss(r.best_val), False),
    ("rate", "smp/s", 6, lambda r, now: fmt_count(int(r.samples_per_s)) if r.samples_per_s else "-", False),
    ("elapsed", "elapsed", 7, lambda r, now: fmt_duration(r.elapsed(now)), False),
    ("eta", "eta", 6, lambda r, now: fmt_duration(r.eta()), True),
)


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

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "pipelines"
        self.names: list[str] = []
        self.cells: dict[str, dict[str, str]] = {}
        self.cursor = 0
        self.top = 0  # first row shown
        self.compact = False

    # ------------------------------------------------------------ API
    @property
    def row_count(self) -> int:
        return len(self.names)

    @property
    def selected(self) -> str | None:
        return self.names[self.cursor] if self.names else None

    def cell(self, name: str, key: str) -> str:
        return self.cells[name][key]

    def update_rows(self, rows: list[PipelineRow], now: float, terminal_width: int) -> None:
        """Take new values; repaint only the rows whose text changed."""
        compact = terminal_width < WIDE
        relayout = compact != self.compact or len(rows) != len(self.names)
        self.compact = compact
        first = not self.names
        for row in rows:
            values = {key: fmt(row, now) for key, _, _, fmt, _ in COLUMNS}
            old = self.cells.get(row.name)
            if old is None:
                self.names.append(row.name)
            elif old == values:
                continue
            self.cells[row.name] = values
            if not relayout and old is not None:
                self._refresh_cells(self.names.index(row.name), [k for k in values if values[k] != old[k]])
        if relayout:
            self.refresh(layout=True)
        if first and self.names:
            self.post_message(self.Selected(self.names[0]))

    # ------------------------------------------------------------ drawing
    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.names) + 1

    def _visible_rows(self) -> int:
        return max(1, self.size.height - 1)

    def _refresh_cells(self, index: int, keys: list[str]) -> None:
        """Repaint just these cells of a row: the terminal then gets a few short spans, not the line."""
        y = index - self.top + 1
        if not 1 <= y < self.size.height:
            return
        x = 0
        for key, _, w, _, _ in self._columns():
            if key in keys:
                self.refresh(Region(x, y, w + 1, 1))
            x += w + 1

    def _refresh_row(self, index: int) -> None:
        y = index - self.top + 1
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def _columns(self):
        return [c for c in COLUMNS if c[4] or not self.compact]

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            text = "".join(f"{label:<{w}} " for _, label, w, _, _ in self._columns())
            return Strip([Segment(text[:width].ljust(width), base + Style(bold=True, dim=True))], width)
        index = self.top + y - 1
        if index >= len(self.names):
            return Strip.blank(width, base)
        name = self.names[index]
        values = self.cells[name]
        selected = index == self.cursor
        row_style = base + Style(reverse=True) if selected and self.has_focus else \
            base + Style(bold=True) if selected else base
        segments = []
        for key, _, w, _, _ in self._columns():
            text = values[key]
            text = (text if len(text) <= w else text[:w - 1] + "…").ljust(w) + " "
            style = row_style + Style.parse(STATE_STYLE.get(text.strip(), "")) if key == "state" else row_style
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
        else:
            self._refresh_row(old)
            self._refresh_row(self.cursor)
        self.post_message(self.Selected(self.names[self.cursor]))

    def on_focus(self) -> None:
        self._refresh_row(self.cursor)

    def on_blur(self) -> None:
        self._refresh_row(self.cursor)
