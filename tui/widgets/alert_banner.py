"""The alert banner under the dashboard's status line: the newest alert and how many there were, with the
terminal bell for a new one (unless the alert says not to, `[alerts] bell = false`, or NO_BELL is set)."""
from __future__ import annotations

import os
from typing import Unpack

from rich.markup import escape
from textual.widgets import Static

from ...engine.protocol import messages
from ...engine.protocol.health import Alert
from . import WidgetOptions


class AlertBanner(Static):
    """One line, shown once the run has raised an alert; `show(alerts)` with every alert so far."""

    DEFAULT_CSS = """
    AlertBanner { display: none; height: 1; padding: 0 1; background: $error 40%; }
    AlertBanner.-shown { display: block; }
    """

    def __init__(self, **kwargs: Unpack[WidgetOptions]) -> None:
        super().__init__(**kwargs)
        self.seen = 0  # alerts shown so far
        # seconds since the epoch, on the clock that stamps events: an alert older than the screen (an attach's
        # history) rings no bell
        self.since = messages.clock.time() - 1.0
        self.rang = 0  # bells rung (tests read it)

    def show(self, alerts: list[Alert]) -> None:
        if len(alerts) == self.seen:
            return
        fresh, self.seen = alerts[self.seen:], len(alerts)
        newest = alerts[-1]
        more = f"  [dim]({len(alerts)} alerts: the event log lists them)[/dim]" if len(alerts) > 1 else ""
        self.update(f"[b]ALERT[/b] {escape(newest.title)}: {escape(newest.message)}{more}")
        self.set_class(True, "-shown")
        if any(a.bell and a.time >= self.since for a in fresh) and not os.environ.get("NO_BELL"):
            self.rang += 1
            self.app.bell()
