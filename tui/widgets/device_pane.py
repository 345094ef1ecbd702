"""Per-GPU utilisation, memory, temperature and power with the workers on each; host and per-worker CPU/RSS.

It renders a `TelemetrySnapshot` it is handed (plain data) and repaints only when the text changes.
Each reading is one row of what fits the pane's width: a worker's row in short units ("RSS 312M"),
a GPU's in short units ("12/40G") where its full one does not fit, then the least needed parts left
out, so nothing wraps and eight GPUs still show at 80x24. Rows that do not fit its height scroll
(arrows and page keys once focused, the mouse wheel), and the border says which rows are shown, as
the pipeline table does.
"""
from __future__ import annotations

import re
from typing import Unpack

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from ...engine.protocol.telemetry import GpuSample, ProcessSample, TelemetrySnapshot
from . import WidgetOptions

GIB = 2 ** 30  # bytes
MIB = 2 ** 20  # bytes
NAME = 14  # cells at most for a pipeline's name in a process row


def _na(value: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, fmt) + suffix


def _bytes(n: int | None) -> str:
    """Bytes in four cells or so: '312M', '1.5G', '12G'."""
    if n is None:
        return "n/a"
    if n < GIB:
        return f"{n / MIB:.0f}M"
    return f"{n / GIB:.1f}G" if n < 10 * GIB else f"{n / GIB:.0f}G"


def _bar(percent: float | None, width: int = 8) -> str:
    if percent is None:
        return "·" * width
    filled = max(0, min(width, int(percent / 100 * width + 0.5)))
    return "█" * filled + "░" * (width - filled)


# A line is parts (text, style, rank); in a width too narrow for all, parts are kept by rank (0 always),
# then drawn in their order.
Part = tuple[str, str, int]


def _fit(parts: list[Part], width: int | None) -> list[Part]:
    if width is None:
        return parts
    keep, used = set(), 0
    for i in sorted(range(len(parts)), key=lambda i: parts[i][2]):
        cells = cell_len(parts[i][0])
        if parts[i][2] == 0 or used + cells <= width:
            keep.add(i)
            used += cells
    return [part for i, part in enumerate(parts) if i in keep]


def _short(note: str, width: int | None) -> str:
    """`note` for a narrow pane: "GPU is lost", not "NVMLError_GpuIsLost: GPU is lost"."""
    return note if width is None else re.sub(r"NVMLError_\w+: ", "", note)


def _gib(n: int) -> str:
    """GiB in three cells or so: '0.5', '7.5', '12', '80'."""
    return f"{n / GIB:.1f}" if n < 10 * GIB else f"{n / GIB:.0f}"


def _gpu_forms(g: GpuSample, width: int | None) -> list[list[Part]]:
    """A GPU's row in full, then in short units ("12/40G", "250W") for a pane too narrow for it. Which
    pipelines use it outranks the utilisation bar, which only repeats the percentage."""
    used, total = g.mem_used, g.mem_total
    owners = sorted({p.owner for p in g.processes or ()})
    note = _short(g.note, width)

    def form(mem: str, power: str) -> list[Part]:
        return [(f"{g.node}:GPU{g.index} " if g.node else f"GPU{g.index} ", "bold", 0),
                (_bar(g.util_gpu), "green", 5), (f" {_na(g.util_gpu, 'd', '%'):>4}", "", 1),
                (f" {mem}", "", 2), (f" {_na(g.temperature, 'd', '°C')}", "", 3), (f" {power}", "", 6),
                (" " + ",".join(owners) if owners else "", "cyan", 4),
                (f" {note}" if note else "", "yellow", 0)]

    limit = f"/{g.power_limit:.0f}" if g.power_limit else ""
    return [form(f"{used / GIB:.1f}/{total / GIB:.1f} GiB" if used is not None and total is not None else "n/a",
                 "n/a" if g.power_draw is None else f"{g.power_draw:.0f}{limit} W"),
            form(f"{_gib(used)}/{_gib(total)}G" if used is not None and total is not None else "n/a",
                 "n/a" if g.power_draw is None else f"{g.power_draw:.0f}W")]


def _process_line(p: ProcessSample, name: int) -> list[Part]:
    """A worker's row, names padded to `name` cells; GPU memory only where a GPU could be read."""
    kids = f"+{p.children}" if p.children else ""
    where = f"{p.node}:" if p.node else ""  # another node's worker; local rows look as they always did
    parts = [(f" {where}{p.pipeline[:NAME]:<{name}}", "", 0), (f" pid {p.pid}{kids}", "", 4),
             (f" CPU {_na(p.cpu_percent, '.0f', '%'):>4}", "", 1), (f" RSS {_bytes(p.rss)}", "", 3)]
    if p.gpu_memory is not None:
        parts.append((f" GPU {_bytes(p.gpu_memory)}", "", 2))
    return parts


def describe(snapshot: TelemetrySnapshot | None, width: int | None = None, ended: bool = False) -> Text:
    """The pane's text for one snapshot (None: nothing sampled yet, or ever, once the run has `ended`); with
    `width`, one row of it a line."""
    out = Text()
    if snapshot is None:
        out.append("no readings: the run has ended" if ended else "waiting for telemetry…", style="dim")
        return out
    lines: list[list[Part] | list[list[Part]]] = []  # a line, or its forms, the shorter later
    if not snapshot.gpus:
        note = snapshot.gpu_note
        if note.startswith("no NVIDIA GPU"):
            head, _, rest = note.partition(" (")
            lines.append([(head, "bold", 0), (f" ({rest}" if rest else "", "dim", 0)])
        else:
            lines.append([("no NVIDIA GPU", "bold", 0), (f" ({note})" if note else "", "dim", 0)])
    lines += [_gpu_forms(g, width) for g in snapshot.gpus]
    if snapshot.gpu_note and any(not g.node for g in snapshot.gpus):  # this machine's GPUs NVML could not open
        lines.append([(_short(snapshot.gpu_note, width), "yellow", 0)])
    mem = "n/a" if snapshot.host_mem_used is None or snapshot.host_mem_total is None else \
        f"{snapshot.host_mem_used / GIB:.1f}/{snapshot.host_mem_total / GIB:.1f} GiB"
    lines.append([("host ", "bold", 0), (_bar(snapshot.host_cpu_percent), "green", 4),
                  (f" CPU {_na(snapshot.host_cpu_percent, '.0f', '%')}", "", 1),
                  (f" load {_na(snapshot.load1, '.2f')}", "", 3), (f" RAM {mem}", "", 2)])
    # Names are padded to the longest shown, not to NAME: "reg-a" needs 5 cells, not 14.
    name = max((len(p.pipeline[:NAME]) for p in snapshot.processes), default=0)
    lines += [_process_line(p, name) for p in snapshot.processes]
    for i, line in enumerate(lines):
        if i:
            out.append("\n")
        forms = line if isinstance(line[0], list) else [line]
        fits = [parts for parts in forms if width is None or sum(cell_len(p[0]) for p in parts) <= width]
        for text, style, _ in fits[0] if fits else _fit(forms[-1], width):
            out.append(text, style=style or None)
    return out


class DevicePane(Widget, can_focus=True):
    """Device and process readings; call `show(snapshot)` with the newest one."""

    DEFAULT_CSS = """
    DevicePane { height: auto; max-height: 12; border: round $panel-lighten-2; padding: 0 1; }
    DevicePane:focus { border: round $accent; }
    """
    BINDINGS = [Binding("up", "scroll_rows(-1)", show=False), Binding("down", "scroll_rows(1)", show=False),
                Binding("pageup", "page(-1)", show=False), Binding("pagedown", "page(1)", show=False),
                Binding("home", "scroll_rows(-1000000)", show=False),
                Binding("end", "scroll_rows(1000000)", show=False)]

    def __init__(self, **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(**kwargs)
        self.border_title = "devices"
        self.top = 0  # first row shown
        self._snapshot: TelemetrySnapshot | None = None
        self._ended = False  # the run has ended: no reading will come
        self._text = describe(None)
        self._rows: list[Strip] = []
        self._width = 0  # the width the rows were laid out for

    # ------------------------------------------------------------ API
    def show(self, snapshot: TelemetrySnapshot | None, ended: bool = False) -> None:
        """Take the newest readings (and whether the run has ended); repaint only if the text changed."""
        self._snapshot, self._ended = snapshot, ended
        width = self.size.width
        text = describe(snapshot, width or None, ended)
        if text.plain == self._text.plain and width == self._width:
            return
        count = len(self._rows)
        self._text, self._rows, self._width = text, self._lay_out(text, width), width
        self._scroll_rows_to(self.top)
        self.refresh(layout=len(self._rows) != count)

    def rows(self) -> list[str]:
        """Every row's text, shown or scrolled out of view, top to bottom."""
        return [strip.text for strip in self._rows]

    # ------------------------------------------------------------ drawing
    def _lay_out(self, text: Text, width: int) -> list[Strip]:
        """One strip per row; a note longer than the width (rank 0, never dropped) wraps."""
        if not width:
            return []
        console = self.app.console
        return [Strip(list(line.render(console)), line.cell_len) for line in text.wrap(console, width)]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        text = describe(self._snapshot, width or None, self._ended)
        return len(text.wrap(self.app.console, width)) if width else 1

    def render_line(self, y: int) -> Strip:
        width, base = self.size.width, self.rich_style
        index = self.top + y
        if index >= len(self._rows):
            return Strip.blank(width, base)
        return self._rows[index].apply_style(base).crop_extend(0, width, base)

    def on_resize(self) -> None:
        self.show(self._snapshot, self._ended)
        self._scroll_rows_to(self.top)

    # ------------------------------------------------------------ scrolling
    def _visible_rows(self) -> int:
        return max(1, self.size.height)

    def _scroll_rows_to(self, top: int) -> None:
        top = max(0, min(top, len(self._rows) - self._visible_rows()))
        if top != self.top:
            self.top = top
            self.refresh()
        n, visible = len(self._rows), self._visible_rows()
        self.border_subtitle = f"rows {self.top + 1}-{min(n, self.top + visible)} of {n} ↑↓" \
            if self.size.height and n > visible else ""

    def action_scroll_rows(self, delta: int) -> None:
        """Scroll by `delta` rows."""
        self._scroll_rows_to(self.top + delta)

    def action_page(self, direction: int) -> None:
        """Scroll by the rows shown, less one kept for context."""
        self._scroll_rows_to(self.top + direction * max(1, self._visible_rows() - 1))

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self._scroll_rows_to(self.top + 1)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self._scroll_rows_to(self.top - 1)
