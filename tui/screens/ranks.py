"""The ranks of one gang (`w` on the dashboard): each rank's own time per batch against its peers' median,
the straggler, and where each rank was at the last triage of its stacks; an elastic gang's size of MIN..MAX and
its newest resizes."""
from __future__ import annotations

import time

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...engine.protocol.messages import GangResized
from ...engine.protocol.progress import PipelineProgress

NO_PACE = ("no rank has reported its pace (a gang's ranks report theirs with their step reports; a script's only "
           "through torchherd.client)")


def ranks_text(row: PipelineProgress) -> str:
    """The table of a gang's ranks as text (markup), from its row's plain data."""
    times, places = row.rank_times, row.rank_places
    name = f"[b]{escape(row.name)}[/b]"
    if not times and not places and not row.elastic:
        return f"{name}: {NO_PACE}"
    size = elastic_size(row) if row.elastic else f"{len(times) or len(places)} ranks"
    lines = [f"{name}: {size}" + (f", straggler {row.straggler}" if row.straggler else ""), ""]
    lines += pace_lines(row) if times or places else [NO_PACE]
    if row.verdict:
        lines += ["", f"triage: {escape(row.verdict)}"]
    if row.elastic or row.resizes:
        lines += ["", *resize_lines(row.resizes)]
    return "\n".join(lines)


def elastic_size(row: PipelineProgress) -> str:
    """'1 of 1..2 ranks (elastic)': the ranks of its newest attempt, of the sizes it may run at."""
    sizes = f"{row.min_ranks}..{row.max_ranks} ranks (elastic)"
    return f"{row.ranks} of {sizes}" if row.ranks else f"{sizes}, none running"


def pace_lines(row: PipelineProgress) -> list[str]:
    """A header, then each rank's own ms per batch, its ratio to its peers' median and where the triage found it."""
    times, places = row.rank_times, row.rank_places
    lines = ["rank  ms/batch   x peers  where (last triage)"]
    for rank in range(max(len(times), len(places))):
        t = times[rank] if rank < len(times) else float("nan")
        ms = f"{t * 1e3:8.1f}" if t == t else "       -"
        median = row.peers_median(rank)
        ratio = f"{t / median:8.1f}x" if median and t == t else "        -"
        where = places[rank] if rank < len(places) and places[rank] else "-"
        lines.append(f"{rank:>4}  {ms}  {ratio}  {escape(where)}")
    return lines


def resize_lines(resizes: tuple[GangResized, ...]) -> list[str]:
    """An elastic gang's newest resizes, oldest first: when, from -> to ranks, the samples of one optimizer step
    before -> after, and why."""
    if not resizes:
        return ["resizes: none yet"]
    lines = ["resizes     ranks   samples/step  why"]
    for ev in resizes:
        when = time.strftime("%H:%M:%S", time.localtime(ev.time))
        ranks = f"{ev.from_ranks} -> {ev.to_ranks}"
        samples = f"{ev.samples_per_step_before} -> {ev.samples_per_step}" if ev.keep else "script's own"
        lines.append(f"{when}  {ranks:>7}  {samples:>13}  {escape(ev.why or '-')}")
    return lines


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
