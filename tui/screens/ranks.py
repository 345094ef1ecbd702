"""The ranks of one gang (`w` on the dashboard): each rank's own time per batch against its peers' median,
the straggler, and where each rank was at the last triage of its stacks."""
from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...engine.protocol.progress import PipelineProgress


def ranks_text(row: PipelineProgress) -> str:
    """The table of a gang's ranks as text (markup), from its row's plain data."""
    times, places = row.rank_times, row.rank_places
    if not times and not places:
        return (f"[b]{escape(row.name)}[/b]: no rank has reported its pace (a gang's ranks report theirs with "
                "their step reports; a script's only through torchherd.client)")
    lines = [f"[b]{escape(row.name)}[/b]: {len(times) or len(places)} ranks"
             + (f", straggler {row.straggler}" if row.straggler else ""),
             "", "rank  ms/batch   x peers  where (last triage)"]
    for rank in range(max(len(times), len(places))):
        t = times[rank] if rank < len(times) else float("nan")
        ms = f"{t * 1e3:8.1f}" if t == t else "       -"
        median = row.peers_median(rank)
        ratio = f"{t / median:8.1f}x" if median and t == t else "        -"
        where = places[rank] if rank < len(places) and places[rank] else "-"
        lines.append(f"{rank:>4}  {ms}  {ratio}  {escape(where)}")
    if row.verdict:
        lines += ["", f"triage: {escape(row.verdict)}"]
    return "\n".join(lines)


class RanksScreen(ModalScreen[None]):
    """One gang's ranks, read from its row when opened; escape closes."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS = [Binding("escape,w,q,enter", "close", "close")]

    def __init__(self, row: PipelineProgress) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog ranks", id="ranks"):
            yield Static(ranks_text(self.row), id="ranks-text")

    def action_close(self) -> None:
        self.dismiss(None)
