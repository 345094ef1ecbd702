"""The full log of one pipeline, followed live; escape goes back."""
from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer

from torchherd.tui.widgets.log_views import LogTail

FULL_BYTES = 4 * 2 ** 20  # bytes of the file shown at most


class LogScreen(Screen[None]):
    """One log file, scrollable with the usual keys."""

    CSS_PATH = "log_view.tcss"
    BINDINGS = [Binding("escape,l,q", "close", "back")]

    def __init__(self, path: Path, pipeline: str) -> None:
        super().__init__()
        self.path, self.pipeline = path, pipeline

    def compose(self) -> ComposeResult:
        yield LogTail(max_lines=50_000, tail_bytes=FULL_BYTES, id="full")
        yield Footer()

    def on_mount(self) -> None:
        log = self.query_one(LogTail)
        log.follow(self.path, f"{self.pipeline}: {self.path}")
        log.focus()

    def action_close(self) -> None:
        self.dismiss(None)
