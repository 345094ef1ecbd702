"""The full log of one pipeline, followed live; escape (or l) goes back.

Its title names the pipeline and the file; a path too long for the terminal loses its start, not
the file name, so at 80 columns it still says which log this is.
"""
from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer

from ..formats import shown_path
from ..widgets.log_views import LogTail

FULL_BYTES = 4 * 2 ** 20  # bytes of the file shown at most
FRAME = 8  # cells of the border around the title ("╭─ " ... " ─╮" and some rule)


def fit_left(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut at the start ('…' marks the cut)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1:]


class LogScreen(Screen[None]):
    """One log file, scrollable with the usual keys."""

    CSS_PATH = "log_view.tcss"
    BINDINGS = [Binding("escape,l,q", "close", "back")]

    def __init__(self, path: Path, pipeline: str) -> None:
        super().__init__()
        self.path, self.pipeline = path, pipeline

    def compose(self) -> ComposeResult:
        yield LogTail(max_lines=50_000, tail_bytes=FULL_BYTES, wrap=True, id="full")  # every line whole
        yield Footer()

    def on_mount(self) -> None:
        log = self.query_one(LogTail)
        log.follow(self.path, self._title(self.app.size.width))
        log.focus()

    def on_resize(self) -> None:
        self.query_one(LogTail).border_title = self._title(self.size.width)

    def _title(self, width: int) -> str:
        head = f"{self.pipeline}: "
        return head + fit_left(shown_path(self.path), max(12, width - FRAME - len(head)))

    def action_close(self) -> None:
        self.dismiss(None)
