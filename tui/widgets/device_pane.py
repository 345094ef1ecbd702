"""Per-GPU utilisation, memory, temperature and power with the workers on each; host and per-worker CPU/RSS.

It renders a `TelemetrySnapshot` it is handed (plain data) and repaints only when the text changes.
"""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ...engine.protocol.messages import TelemetrySnapshot

GIB = 2 ** 30  # bytes


def _na(value, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, fmt) + suffix


def _bar(percent: float | None, width: int = 8) -> str:
    if percent is None:
        return "·" * width
    filled = max(0, min(width, int(percent / 100 * width + 0.5)))
    return "█" * filled + "░" * (width - filled)


def describe(snapshot: TelemetrySnapshot | None) -> Text:
    """The pane's text for one snapshot (None: nothing sampled yet)."""
    out = Text()
    if snapshot is None:
        out.append("waiting for telemetry…", style="dim")
        return out
    if not snapshot.gpus:
        note = snapshot.gpu_note
        if note.startswith("no NVIDIA GPU"):
            head, _, rest = note.partition(" (")
            out.append(head, style="bold")
            out.append(f" ({rest}" if rest else "", style="dim")
        else:
            out.append("no NVIDIA GPU", style="bold")
            out.append(f" ({note})" if note else "", style="dim")
        out.append("\n")
    for g in snapshot.gpus:
        mem = "n/a" if g.mem_used is None or g.mem_total is None else \
            f"{g.mem_used / GIB:.1f}/{g.mem_total / GIB:.1f} GiB"
        power = "n/a" if g.power_draw is None else \
            f"{g.power_draw:.0f}" + (f"/{g.power_limit:.0f}" if g.power_limit else "") + " W"
        owners = sorted({p.owner for p in g.processes or ()})
        out.append(f"{g.node}:GPU{g.index} " if g.node else f"GPU{g.index} ", style="bold")
        out.append(_bar(g.util_gpu), style="green")
        out.append(f" {_na(g.util_gpu, 'd', '%'):>4} {mem} {_na(g.temperature, 'd', '°C')} {power}")
        if owners:
            out.append(" " + ",".join(owners), style="cyan")
        if g.note:
            out.append(f" {g.note}", style="yellow")
        out.append("\n")
    mem = "n/a" if snapshot.host_mem_used is None or snapshot.host_mem_total is None else \
        f"{snapshot.host_mem_used / GIB:.1f}/{snapshot.host_mem_total / GIB:.1f} GiB"
    out.append("host ", style="bold")
    out.append(_bar(snapshot.host_cpu_percent), style="green")
    out.append(f" CPU {_na(snapshot.host_cpu_percent, '.0f', '%')} load {_na(snapshot.load1, '.2f')} RAM {mem}")
    for p in snapshot.processes:
        rss = "n/a" if p.rss is None else f"{p.rss / GIB:.2f} GiB"
        kids = f" +{p.children}" if p.children else ""
        where = f"{p.node}:" if p.node else ""  # another node's worker; local rows look as they always did
        out.append(f"\n {where}{p.pipeline[:14]:<14} pid {p.pid}{kids} CPU {_na(p.cpu_percent, '.0f', '%'):>5} RSS {rss}")
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

    def show(self, snapshot: TelemetrySnapshot | None) -> None:
        text = describe(snapshot)
        if text.plain != self._plain:
            relayout = text.plain.count("\n") != self._plain.count("\n")
            self._plain = text.plain
            self.update(text, layout=relayout)
