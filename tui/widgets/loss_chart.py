"""A braille loss chart drawn from binned series: work per redraw is O(bins + cells), never O(points).

Validation results are markers: on the loss axis when the metric is a loss, else in a strip of
their own under it (an accuracy of 0.9 has no place on an axis of losses near 0.01). With every
pipeline overlaid, each has a glyph as well as a colour, at the end of its curve, on its
validation markers and in the legend, so curves tell apart under NO_COLOR too. A sweep's view
overlays only its best trials (`only`), their glyphs in rank order, as its table marks them.

A loss far above most of the curve (the first steps' loss, a spike) would press the rest of it flat
on the bottom row, so by default the y axis ends above the bulk of the visible points and what lies
higher is clipped: drawn on the top row under an ARROW, and the legend says "↑ clipped" (`clip`).

Only lines whose content changed are repainted, so a redraw that moves the tail of a curve
writes a few lines to the terminal, not the whole chart.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Unpack

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from ..formats import fmt_count, fmt_num, metric_label
from ..series import LossSeries, reduce_columns
from . import WidgetOptions

PALETTE = ("cyan", "magenta", "green", "yellow", "bright_blue", "bright_red", "bright_white", "bright_magenta")
GLYPHS = ("●", "▲", "■", "◆", "★", "✚", "▼", "○")  # one per pipeline when overlaid, in PALETTE's order
GUTTER = 9  # cells for the y labels and the axis
# Braille dot bits by (row in cell 0-3, column in cell 0-1).
DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
MARKER = "◆"  # a validation result of the one pipeline shown
RESTART = "↺"  # on the x axis: where a restart of the one pipeline shown went back to an earlier step
ARROW = "↑"  # on the top row: the curve goes on above the clipped y axis here
FENCE = 3.0  # values more than this many interquartile ranges above the third quartile are outliers
MIN_COLUMNS = 8  # fewer columns than this are too few to call any of them an outlier
MIN_SPREAD = 0.5  # the interquartile range the fence assumes at least, as a share of the third quartile
NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
TICKS = (1.0, 2.0, 2.5, 5.0, 10.0)
Visible = list[tuple[str, LossSeries, int]]  # (name, series, colour index) of each pipeline drawn
Reduced = list[tuple[list[tuple[int, float, float, float]], list[tuple[float, float]], int]]  # see _reduce


def nice_ceil(value: float, steps: tuple[float, ...] = NICE) -> float:
    """The smallest 'round' number >= value: the axes snap to these so they rarely move."""
    if value <= 0:
        return 1.0
    scale: float = 10 ** math.floor(math.log10(value))
    return next(n * scale for n in steps if n * scale >= value * (1 - 1e-9))


def nice_range(lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened to multiples of a round step (about a quarter of the span)."""
    step = nice_ceil((hi - lo) / 4, TICKS) if hi > lo else 1.0
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def _fmt_y(v: float, log: bool) -> str:
    return fmt_num(10 ** v if log else v, GUTTER - 2)


def _fmt_x(v: float, x_mode: str, origin: float) -> str:
    if x_mode == "step":
        return fmt_count(round(v), 9)
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

    def __init__(self, **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(**kwargs)
        self.series: dict[str, LossSeries] = {}
        self.selected: str | None = None
        self.overlay = False  # all pipelines at once
        self.only: list[str] | None = None  # these pipelines overlaid, in this order (a sweep's best trials)
        self.log_y, self.smooth = False, False
        self.clip = True  # the y axis ends above the bulk of the points; outliers go off the top
        self.clipped = False  # as last drawn, some point lies above the top of the y axis
        self.x_mode = "step"  # or "time"
        self.quantity = "loss"  # what the series are: the training loss, or a value the step reports carry
        self.metric = "val_loss"  # the validation metric the markers show
        self.metric_is_loss = True  # markers on the loss axis; otherwise in a strip of their own
        self.legend = Text()
        self._lines: list[Strip] = []
        self._keys: list[tuple[object, ...]] = []
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
        legend = self._legend()
        if legend.plain != self.legend.plain:
            self.legend = legend
            self.border_subtitle = legend
        if (width, height) != self._drawn_size or len(keys) != len(self._keys):
            self._keys, self._lines, self._drawn_size = keys, lines, (width, height)
            self.refresh()
            return
        for y, key in enumerate(keys):
            if key != self._keys[y]:
                self._keys[y], self._lines[y] = key, lines[y]
                self.refresh(Region(0, y, width, 1))

    def drawn_text(self) -> list[str]:
        """The text of each line as last drawn, top to bottom."""
        return [strip.text for strip in self._lines]

    def on_resize(self) -> None:
        self.redraw()

    def render_line(self, y: int) -> Strip:
        if y < len(self._lines) and self._lines[y].cell_length == self.size.width:
            return self._lines[y]
        return Strip.blank(self.size.width, self.rich_style)

    @property
    def overlaid(self) -> bool:
        """Several pipelines are drawn at once, each with its glyph."""
        return self.overlay or self.only is not None

    # ------------------------------------------------------------ drawing
    def _title(self) -> str:
        if self.only is not None:
            who = f"top {len(self.only)} trial{'s' if len(self.only) != 1 else ''}"
        else:
            who = "all pipelines" if self.overlay else (self.selected or "no pipeline")
        return (f"{self.quantity}: {who} | x {self.x_mode} | {'log' if self.log_y else 'linear'} | "
                f"{'EMA' if self.smooth else 'raw'}")

    def _legend(self) -> Text:
        val = f"val {metric_label(self.metric)}" + ("" if self.metric_is_loss else " (strip)")
        if not self.overlaid:
            shown = self.series.get(self.selected or "")
            restarted = ("  ", (RESTART, "bold magenta"), " went back") if shown is not None and shown.restarts else ()
            clipped = ((ARROW, "bold"), " clipped  ") if self.clipped else ()
            what = "train loss" if self.quantity == "loss" else self.quantity
            return Text.assemble(*clipped, ("⠤⠒ ", "cyan"), f"{what}  ", (MARKER, "bold yellow"), f" {val}", *restarted)
        out = Text.assemble((ARROW, "bold"), " clipped  ") if self.clipped else Text()
        for name, _, index in self._visible():
            out.append(GLYPHS[index], style=f"bold {PALETTE[index]}")
            out.append(f" #{index + 1}  " if self.only is not None else f" {name}  ")  # ranks: as the table shows
        out.append(f"(glyph: curve end, {val})")
        return out

    def _visible(self) -> Visible:
        if self.only is not None:
            return [(n, self.series[n], i % len(PALETTE)) for i, n in enumerate(self.only) if n in self.series]
        names = list(self.series)
        chosen = names if self.overlay else [n for n in names if n == self.selected]
        return [(n, self.series[n], names.index(n) % len(PALETTE)) for n in chosen]

    def _draw(self, width: int, height: int) -> tuple[list[tuple[object, ...]], list[Strip]]:
        pw = width - GUTTER  # plot width in cells
        visible = self._visible()
        self.clipped = False
        x_lo, x_hi, origin, any_val = self._x_extent(visible)
        if x_lo > x_hi:
            return self._empty(width, height, "waiting for data" if visible else "no pipeline selected")
        x_hi = x_lo + nice_ceil(x_hi - x_lo) if x_hi > x_lo else x_lo + 1.0
        # Rows: the loss plot, then (for a metric that is no loss) a rule and the strip, then the x axis.
        strip = 0
        if any_val and not self.metric_is_loss and height - 1 >= 6:
            strip = 3 if height - 1 >= 14 else 2
        ph = height - 1 - (strip + 1 if strip else 0)
        cols, rows = pw * 2, ph * 4  # in braille dots
        x_scale = (cols - 1) / ((x_hi - x_lo) or 1.0)
        reduced, y_lo, y_hi = self._reduce(visible, x_lo, x_hi, cols)
        if y_lo > y_hi:
            return self._empty(width, height, "no finite values")
        if self.clip:
            y_hi = _robust_top(reduced, y_lo, y_hi)
        if y_hi - y_lo < 1e-12:
            y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
        # Snap both axes to round numbers: new points then change only the lines they touch,
        # instead of rescaling (and repainting) the whole chart on every redraw.
        y_lo, y_hi = nice_range(y_lo, y_hi)
        canvas = _Canvas(pw, ph, y_hi, (rows - 1) / (y_hi - y_lo), rows)
        for columns, marks, colour in reduced:
            end = canvas.trace(columns, colour)
            if self.overlaid and end is not None:  # the curve's end carries its glyph
                canvas.glyph(*end, colour)
            for x, v in marks:
                if v == v:
                    canvas.glyph(int((x - x_lo) * x_scale + 0.5), canvas.row_of(v), colour)
                    if v > y_hi:
                        canvas.over.setdefault(int((x - x_lo) * x_scale + 0.5) >> 1, colour)
        self.clipped = bool(canvas.over)
        lines = self._plot_lines(ph, pw, canvas, (y_lo, y_hi))
        if strip:
            lines += self._strip_lines(strip, pw, visible, x_lo, x_scale)
        restarts = [x for _, s, _ in visible for x in s.restart_points()] if not self.overlaid else []
        lines.append(self._x_axis(width, pw, x_lo, x_hi, origin, [int((x - x_lo) * x_scale + 0.5) >> 1
                                                                  for x in restarts if x_lo <= x <= x_hi]))
        keys: list[tuple[object, ...]] = [tuple((seg.text, str(seg.style)) for seg in line) for line in lines]
        return keys, [Strip(line, width) for line in lines]

    def _x_extent(self, visible: Visible) -> tuple[float, float, float, bool]:
        """The x range the visible series span, the time origin, and whether any has validation results."""
        x_lo, x_hi, origin, any_val = math.inf, -math.inf, math.inf, False
        for _, s, _ in visible:
            s.configure(self.x_mode, self.smooth)
            if s.bins.x0 is not None:
                x_lo, x_hi = min(x_lo, s.bins.x0), max(x_hi, s.bins.x_max)
            for x, _ in s.val_points():
                x_lo, x_hi = min(x_lo, x), max(x_hi, x)
                any_val = True
            if self.x_mode == "time" and len(s.times):
                origin = min(origin, s.times[0])
        return x_lo, x_hi, origin, any_val

    def _reduce(self, visible: Visible, x_lo: float, x_hi: float, cols: int) -> tuple[Reduced, float, float]:
        """Each series as (columns, markers on the loss axis, colour) in plotted y units, and their y range."""
        tf = (lambda v: math.log10(v) if v > 0 else math.nan) if self.log_y else (lambda v: v)
        reduced: Reduced = []
        y_lo, y_hi = math.inf, -math.inf
        for _, s, colour in visible:
            columns = [(c.index, tf(c.lo), tf(c.hi), tf(c.last)) for c in reduce_columns(s.bins, x_lo, x_hi, cols)]
            for _, lo, hi, _ in columns:
                if lo == lo:
                    y_lo, y_hi = min(y_lo, lo), max(y_hi, hi)
            marks = [(x, tf(v)) for x, v in s.val_points()] if self.metric_is_loss else []
            for _, v in marks:
                if v == v:
                    y_lo, y_hi = min(y_lo, v), max(y_hi, v)
            reduced.append((columns, marks, colour))
        return reduced, y_lo, y_hi

    def _glyph(self, colour: int) -> tuple[str, Style]:
        if self.overlaid:
            return GLYPHS[colour], self.rich_style + Style(color=PALETTE[colour], bold=True)
        return MARKER, self.rich_style + Style(color="yellow", bold=True)

    def _plot_lines(self, ph: int, pw: int, canvas: _Canvas, y_range: tuple[float, float]) -> list[list[Segment]]:
        masks, colours, glyphs = canvas.masks, canvas.colours, canvas.glyphs
        base = self.rich_style
        styles = [base + Style(color=c) for c in PALETTE]
        axis = base + Style(dim=True)
        y_lo, y_hi = y_range
        label_rows = {0: y_hi, ph - 1: y_lo}
        if ph >= 5:
            label_rows[(ph - 1) // 2] = (y_hi + y_lo) / 2
        out = []
        for row in range(ph):
            label = _fmt_y(label_rows[row], self.log_y) if row in label_rows else ""
            cells = []
            for i in range(row * pw, row * pw + pw):
                if i in glyphs:
                    cells.append(self._glyph(glyphs[i]))
                elif row == 0 and i in canvas.over:
                    cells.append((ARROW, base + Style(color=PALETTE[canvas.over[i]], bold=True)))
                else:
                    cells.append((chr(0x2800 + masks[i]), styles[colours[i]] if colours[i] >= 0 else base))
            out.append(_runs([(f"{label:>{GUTTER - 2}} ", axis), ("┤" if label else "│", axis), *cells]))
        return out

    def _strip_lines(self, height: int, pw: int, visible: Visible, x_lo: float, x_scale: float) -> list[list[Segment]]:
        """A rule naming the metric, then its validation results on a scale of their own."""
        base = self.rich_style
        axis = base + Style(dim=True)
        values = [v for _, s, _ in visible for _, v in s.val_points() if v == v]
        lo, hi = nice_range(min(values), max(values)) if max(values) > min(values) else \
            (min(values) - 0.5, max(values) + 0.5)
        cells: dict[int, int] = {}
        for _, s, colour in visible:
            for x, v in s.val_points():
                if v == v:
                    row = int((hi - v) / (hi - lo) * (height - 1) + 0.5)
                    cells[row * pw + (int((x - x_lo) * x_scale + 0.5) >> 1)] = colour
        name = f"val {metric_label(self.metric)}"[:GUTTER - 1]
        out = [[Segment(f"{name:>{GUTTER - 1}}┼", axis), Segment("╌" * pw, axis)]]
        for row in range(height):
            label = fmt_num(hi if row == 0 else lo, GUTTER - 2) if row in (0, height - 1) else ""
            line = [(f"{label:>{GUTTER - 2}} ", axis), ("┤" if label else "│", axis)]
            line += [self._glyph(cells[i]) if i in cells else (" ", base) for i in range(row * pw, row * pw + pw)]
            out.append(_runs(line))
        return out

    def _x_axis(self, width: int, pw: int, x_lo: float, x_hi: float, origin: float,
                restarts: Sequence[int] = ()) -> list[Segment]:
        """The x axis: its two ends, and RESTART under each column where a restart went back."""
        left, right = _fmt_x(x_lo, self.x_mode, origin), _fmt_x(x_hi, self.x_mode, origin)
        gap = max(1, pw - len(left) - len(right))
        bottom = list((" " * (GUTTER - 1) + "└" + left + " " * gap + right)[:width].ljust(width))
        for column in restarts:
            if 0 <= GUTTER + column < width:
                bottom[GUTTER + column] = RESTART
        dim = self.rich_style + Style(dim=True)
        return _runs([(ch, self.rich_style + Style(color="magenta", bold=True) if ch == RESTART else dim)
                      for ch in bottom])

    def _empty(self, width: int, height: int, why: str) -> tuple[list[tuple[object, ...]], list[Strip]]:
        keys: list[tuple[object, ...]] = []
        lines = []
        for row in range(height):
            text = why.center(width) if row == height // 2 else " " * width
            keys.append((text,))
            lines.append(Strip([Segment(text[:width], self.rich_style + Style(dim=True))], width))
        return keys, lines


def _robust_top(reduced: Reduced, y_lo: float, y_hi: float) -> float:
    """The top of the y axis that leaves out outliers: the highest column above `y_lo` that is no more
    than FENCE interquartile ranges above the third quartile of the columns' highs (Tukey's far-out
    fence, the range taken as at least MIN_SPREAD of that quartile), or `y_hi` when nothing is that far
    out or too few columns are drawn to tell."""
    highs = sorted(hi for columns, _, _ in reduced for _, lo, hi, _ in columns if lo == lo)
    if len(highs) < MIN_COLUMNS:
        return y_hi
    q1, q3 = highs[len(highs) // 4], highs[(3 * len(highs)) // 4]
    # A plateau flat to the fourth digit has next to no spread: the fence then sat on it, every point of the
    # descent onto it was an outlier, and the axis spanned 0.0864-0.0866. Half its level is spread enough.
    fence = q3 + FENCE * max(q3 - q1, MIN_SPREAD * abs(q3))
    top = max(v for v in highs if v <= fence)
    marks = [v for _, ms, _ in reduced for _, v in ms if v == v and v <= fence]
    top = max([top, *marks])
    # Clip only where it pays: the outliers would take more than half of the axis.
    return top if y_hi - y_lo > 2 * (top - y_lo) else y_hi


class _Canvas:
    """Braille dots, their colours and the cells that carry a glyph instead, for a plot of pw x ph cells."""

    def __init__(self, pw: int, ph: int, y_hi: float, y_scale: float, rows: int):
        self.pw, self.y_hi, self.y_scale, self.rows = pw, y_hi, y_scale, rows
        self.masks, self.colours = [0] * (pw * ph), [-1] * (pw * ph)
        self.glyphs: dict[int, int] = {}  # cell -> series colour index, drawn as its glyph (or MARKER)
        self.over: dict[int, int] = {}  # plot column -> colour of a series that goes above the top there

    def row_of(self, v: float) -> int:
        """The dot row of `v`; one above the top of the axis is drawn on its top row."""
        return max(0, min(self.rows - 1, int((self.y_hi - v) * self.y_scale + 0.5)))

    def dot(self, px: int, py: int, colour: int) -> None:
        cell = (py >> 2) * self.pw + (px >> 1)
        self.masks[cell] |= DOTS[py & 3][px & 1]
        self.colours[cell] = colour

    def glyph(self, px: int, py: int, colour: int) -> None:
        self.glyphs[(py >> 2) * self.pw + (px >> 1)] = colour

    def trace(self, columns: list[tuple[int, float, float, float]], colour: int) -> tuple[int, int] | None:
        """One series' columns as vertical runs joined by straight lines; returns the dot of its last value."""
        prev: tuple[int, int] | None = None  # (column, row of its last value)
        for c, lo, hi, last in columns:
            if lo != lo:
                continue
            if hi > self.y_hi:
                self.over.setdefault(c >> 1, colour)
            top, bottom = self.row_of(hi), self.row_of(lo)
            if prev is not None:  # a straight line across empty columns, so sparse data is a curve
                pc, y0 = prev
                target, y_prev, span = min(max(y0, top), bottom), y0, c - pc
                for k in range(1, span):
                    yk = y0 + ((target - y0) * k) // span
                    for py in range(min(y_prev, yk), max(y_prev, yk) + 1):
                        self.dot(pc + k, py, colour)
                    y_prev = yk
                top, bottom = min(top, y_prev), max(bottom, y_prev)
            for py in range(top, bottom + 1):
                self.dot(c, py, colour)
            prev = (c, self.row_of(last))
        return prev


def _runs(cells: list[tuple[str, Style]]) -> list[Segment]:
    """Adjacent cells of one style joined into one segment."""
    out: list[Segment] = []
    text: list[str] = []
    style = None
    for ch, st in cells:
        if st is not style and text:
            out.append(Segment("".join(text), style))
            text = []
        style = st
        text.append(ch)
    if text:
        out.append(Segment("".join(text), style))
    return out
