"""A braille loss chart drawn from binned series: work per redraw is O(bins + cells), never O(points).

Only lines whose content changed are repainted, so a redraw that moves the tail of a curve
writes a few lines to the terminal, not the whole chart.
"""
from __future__ import annotations

import math

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from torchherd.tui.series import LossSeries, reduce_columns

PALETTE = ("cyan", "magenta", "green", "yellow", "bright_blue", "bright_red", "bright_white", "bright_magenta")
GUTTER = 9  # cells for the y labels and the axis
# Braille dot bits by (row in cell 0-3, column in cell 0-1).
DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
MARKER = "◆"


NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


TICKS = (1.0, 2.0, 2.5, 5.0, 10.0)


def nice_ceil(value: float, steps: tuple[float, ...] = NICE) -> float:
    """The smallest 'round' number >= value: the axes snap to these so they rarely move."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(n * scale for n in steps if n * scale >= value * (1 - 1e-9))


def nice_range(lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened to multiples of a round step (about a quarter of the span)."""
    step = nice_ceil((hi - lo) / 4, TICKS) if hi > lo else 1.0
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def _fmt_y(v: float, log: bool) -> str:
    value = 10 ** v if log else v
    return f"{value:.3g}"[:GUTTER - 2]


def _fmt_x(v: float, x_mode: str, origin: float) -> str:
    if x_mode == "step":
        return f"{int(round(v)):,}"
    s = max(0.0, v - origin)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


class LossChart(Widget):
    """Train loss of one pipeline or all, validation results as markers; set attributes, call `redraw`."""

    DEFAULT_CSS = """
    LossChart { height: 1fr; min-height: 5; border: round $panel-lighten-2; border-title-color: $text-muted; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.series: dict[str, LossSeries] = {}
        self.selected: str | None = None
        self.overlay = False  # all pipelines at once
        self.log_y = False
        self.smooth = False
        self.x_mode = "step"  # or "time"
        self._lines: list[Strip] = []
        self._keys: list[tuple] = []
        self._drawn_size = (0, 0)

    # ------------------------------------------------------------ API
    def redraw(self) -> None:
        """Recompute from the series and repaint the lines that changed."""
        width, height = self.size.width, self.size.height
        if width <= GUTTER + 2 or height < 2:
            return
        keys, lines = self._draw(width, height)
        title = self._title()
        if title != self.border_title:
            self.border_title = title
        if (width, height) != self._drawn_size or len(keys) != len(self._keys):
            self._keys, self._lines, self._drawn_size = keys, lines, (width, height)
            self.refresh()
            return
        for y, key in enumerate(keys):
            if key != self._keys[y]:
                self._keys[y], self._lines[y] = key, lines[y]
                self.refresh(Region(0, y, width, 1))

    def on_resize(self) -> None:
        self.redraw()

    def render_line(self, y: int) -> Strip:
        if y < len(self._lines) and self._lines[y].cell_length == self.size.width:
            return self._lines[y]
        return Strip.blank(self.size.width, self.rich_style)

    # ------------------------------------------------------------ drawing
    def _title(self) -> str:
        who = "all pipelines" if self.overlay else (self.selected or "no pipeline")
        return (f"loss: {who} | x {self.x_mode} | {'log' if self.log_y else 'linear'} | "
                f"{'EMA' if self.smooth else 'raw'}")

    def _visible(self) -> list[tuple[str, LossSeries, int]]:
        names = list(self.series)
        chosen = names if self.overlay else [n for n in names if n == self.selected]
        return [(n, self.series[n], names.index(n) % len(PALETTE)) for n in chosen]

    def _draw(self, width: int, height: int) -> tuple[list[tuple], list[Strip]]:
        pw, ph = width - GUTTER, height - 1  # plot area in cells
        cols, rows = pw * 2, ph * 4  # in braille dots
        visible = self._visible()
        x_lo, x_hi, origin = math.inf, -math.inf, math.inf
        for _, s, _ in visible:
            s.configure(self.x_mode, self.smooth)
            if s.bins.x0 is not None:
                x_lo, x_hi = min(x_lo, s.bins.x0), max(x_hi, s.bins.x_max)
            for x, _ in s.val_points():
                x_lo, x_hi = min(x_lo, x), max(x_hi, x)
            if self.x_mode == "time" and len(s.times):
                origin = min(origin, s.times[0])
        if x_lo > x_hi:
            return self._empty(width, height, "waiting for data" if visible else "no pipeline selected")
        x_hi = x_lo + nice_ceil(x_hi - x_lo) if x_hi > x_lo else x_lo + 1.0
        tf = (lambda v: math.log10(v) if v > 0 else math.nan) if self.log_y else (lambda v: v)
        reduced = []
        y_lo, y_hi = math.inf, -math.inf
        for name, s, colour in visible:
            columns = [(c.index, tf(c.lo), tf(c.hi), tf(c.last)) for c in reduce_columns(s.bins, x_lo, x_hi, cols)]
            marks = [(x, tf(v)) for x, v in s.val_points()]
            for _, lo, hi, _ in columns:
                if lo == lo:
                    y_lo, y_hi = min(y_lo, lo), max(y_hi, hi)
            for _, v in marks:
                if v == v:
                    y_lo, y_hi = min(y_lo, v), max(y_hi, v)
            reduced.append((columns, marks, colour))
        if y_lo > y_hi:
            return self._empty(width, height, "no finite values")
        if y_hi - y_lo < 1e-12:
            y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
        # Snap both axes to round numbers: new points then change only the lines they touch,
        # instead of rescaling (and repainting) the whole chart on every redraw.
        y_lo, y_hi = nice_range(y_lo, y_hi)
        y_scale = (rows - 1) / (y_hi - y_lo)
        x_scale = (cols - 1) / ((x_hi - x_lo) or 1.0)
        masks = [0] * (pw * ph)
        colours = [-1] * (pw * ph)
        markers: dict[int, int] = {}

        def dot(px: int, py: int, colour: int) -> None:
            cell = (py >> 2) * pw + (px >> 1)
            masks[cell] |= DOTS[py & 3][px & 1]
            colours[cell] = colour

        for columns, marks, colour in reduced:
            prev: tuple[int, int] | None = None  # (column, row of its last value)
            for c, lo, hi, last in columns:
                if lo != lo:
                    continue
                top, bottom = int((y_hi - hi) * y_scale + 0.5), int((y_hi - lo) * y_scale + 0.5)
                if prev is not None:  # a straight line across empty columns, so sparse data is a curve
                    pc, y0 = prev
                    target, y_prev, span = min(max(y0, top), bottom), y0, c - pc
                    for k in range(1, span):
                        yk = y0 + ((target - y0) * k) // span
                        for py in range(min(y_prev, yk), max(y_prev, yk) + 1):
                            dot(pc + k, py, colour)
                        y_prev = yk
                    top, bottom = min(top, y_prev), max(bottom, y_prev)
                for py in range(top, bottom + 1):
                    dot(c, py, colour)
                prev = (c, int((y_hi - last) * y_scale + 0.5))
            for x, v in marks:
                if v == v:
                    px, py = int((x - x_lo) * x_scale + 0.5), int((y_hi - v) * y_scale + 0.5)
                    markers[(py >> 2) * pw + (px >> 1)] = colour
        return self._assemble(width, ph, pw, masks, colours, markers,
                             (y_lo, y_hi), (x_lo, x_hi, origin), len(visible) > 1)

    def _assemble(self, width, ph, pw, masks, colours, markers, y_range, x_range, overlay):
        base = self.rich_style
        styles = [base + Style(color=c) for c in PALETTE]
        mark_single = base + Style(color="yellow", bold=True)
        axis = base + Style(dim=True)
        keys, lines = [], []
        y_lo, y_hi = y_range
        label_rows = {0: y_hi, ph - 1: y_lo}
        if ph >= 5:
            label_rows[(ph - 1) // 2] = (y_hi + y_lo) / 2
        for row in range(ph):
            label = _fmt_y(label_rows[row], self.log_y) if row in label_rows else ""
            runs: list[tuple[str, Style]] = [(f"{label:>{GUTTER - 2}} ", axis), ("┤" if label else "│", axis)]
            text, style = [], None
            for i in range(row * pw, row * pw + pw):
                if i in markers:
                    ch = MARKER
                    st = (styles[markers[i]] + Style(bold=True)) if overlay else mark_single
                else:
                    ch = chr(0x2800 + masks[i])
                    st = styles[colours[i]] if colours[i] >= 0 else base
                if st is not style and text:
                    runs.append(("".join(text), style))
                    text = []
                style = st
                text.append(ch)
            if text:
                runs.append(("".join(text), style))
            keys.append(tuple((t, str(s)) for t, s in runs))
            lines.append(Strip([Segment(t, s) for t, s in runs], width))
        x_lo, x_hi, origin = x_range
        left, right = _fmt_x(x_lo, self.x_mode, origin), _fmt_x(x_hi, self.x_mode, origin)
        gap = max(1, pw - len(left) - len(right))
        bottom = " " * (GUTTER - 1) + "└" + left + " " * gap + right
        bottom = bottom[:width].ljust(width)
        keys.append(((bottom,),))
        lines.append(Strip([Segment(bottom, axis)], width))
        return keys, lines

    def _empty(self, width: int, height: int, why: str) -> tuple[list[tuple], list[Strip]]:
        keys, lines = [], []
        for row in range(height):
            text = why.center(width) if row == height // 2 else " " * width
            keys.append((text,))
            lines.append(Strip([Segment(text[:width], self.rich_style + Style(dim=True))], width))
        return keys, lines
