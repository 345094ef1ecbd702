"""Per-GPU utilisation, memory, temperature and power with the workers on each; host and per-worker CPU/RSS.

It renders a `TelemetrySnapshot` it is handed (plain data) and repaints only when the text changes.
When its lines, wrapped, would not all fit, each becomes one row of what fits the width, so eight GPUs
still show at 80x24.
"""
from __future__ import annotations

import re

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from ...engine.protocol.telemetry import TelemetrySnapshot

GIB = 2 ** 30  # bytes


def _na(value, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, fmt) + suffix


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


def describe(snapshot: TelemetrySnapshot | None, width: int | None = None) -> Text:
    """The pane's text for one snapshot (None: nothing sampled yet); with `width`, one row of it a line."""
    out = Text()
    if snapshot is None:
        out.append("waiting for telemetry…", style="dim")
        return out
    lines: list[list[Part]] = []
    if not snapshot.gpus:
        note = snapshot.gpu_note
        if note.startswith("no NVIDIA GPU"):
            head, _, rest = note.partition(" (")
            lines.append([(head, "bold", 0), (f" ({rest}" if rest else "", "dim", 0)])
        else:
            lines.append([("no NVIDIA GPU", "bold", 0), (f" ({note})" if note else "", "dim", 0)])
    for g in snapshot.gpus:
        mem = "n/a" if g.mem_used is None or g.mem_total is None else \
            f"{g.mem_used / GIB:.1f}/{g.mem_total / GIB:.1f} GiB"
        power = "n/a" if g.power_draw is None else \
            f"{g.power_draw:.0f}" + (f"/{g.power_limit:.0f}" if g.power_limit else "") + " W"
        owners = sorted({p.owner for p in g.processes or ()})
        note = _short(g.note, width)
        lines.append([(f"{g.node}:GPU{g.index} " if g.node else f"GPU{g.index} ", "bold", 0),
                      (_bar(g.util_gpu), "green", 4), (f" {_na(g.util_gpu, 'd', '%'):>4}", "", 1),
                      (f" {mem}", "", 2), (f" {_na(g.temperature, 'd', '°C')}", "", 3), (f" {power}", "", 5),
                      (" " + ",".join(owners) if owners else "", "cyan", 6),
                      (f" {note}" if note else "", "yellow", 0)])
    if snapshot.gpu_note and any(not g.node for g in snapshot.gpus):  # this machine's GPUs NVML could not open
        lines.append([(_short(snapshot.gpu_note, width), "yellow", 0)])
    mem = "n/a" if snapshot.host_mem_used is None or snapshot.host_mem_total is None else \
        f"{snapshot.host_mem_used / GIB:.1f}/{snapshot.host_mem_total / GIB:.1f} GiB"
    lines.append([("host ", "bold", 0), (_bar(snapshot.host_cpu_percent), "green", 4),
                  (f" CPU {_na(snapshot.host_cpu_percent, '.0f', '%')}", "", 1),
                  (f" load {_na(snapshot.load1, '.2f')}", "", 3), (f" RAM {mem}", "", 2)])
    for p in snapshot.processes:
        rss = "n/a" if p.rss is None else f"{p.rss / GIB:.2f} GiB"
        kids = f" +{p.children}" if p.children else ""
        where = f"{p.node}:" if p.node else ""  # another node's worker; local rows look as they always did
        lines.append([(f" {where}{p.pipeline[:14]:<14}", "", 0), (f" pid {p.pid}{kids}", "", 2),
                      (f" CPU {_na(p.cpu_percent, '.0f', '%'):>5}", "", 1), (f" RSS {rss}", "", 3)])
    for i, parts in enumerate(lines):
        if i:
            out.append("\n")
        for text, style, _ in _fit(parts, width):
            out.append(text, style=style or None)
    return out


class DevicePane(Static):
    """Device and process readings; call `show(snapshot)` with the newest one."""

    DEFAULT_CSS = """
    DevicePane { height: auto; max-height: 12; border: round $panel-lighten-2; padding: 0 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(describe(None), **kwargs)
        self.border_title = "devices"
        self._plain = ""
        self._snapshot: TelemetrySnapshot | None = None

    def on_resize(self) -> None:
        self.show(self._snapshot)

    def show(self, snapshot: TelemetrySnapshot | None) -> None:
        self._snapshot = snapshot
        text = describe(snapshot)
        width, height = self.size
        if width and height and len(text.wrap(self.app.console, width)) > height:
            text = describe(snapshot, width)  # wrapped, some GPUs would be cut off: one row each instead
        if text.plain != self._plain:
            relayout = text.plain.count("\n") != self._plain.count("\n")
            self._plain = text.plain
            self.update(text, layout=relayout)
