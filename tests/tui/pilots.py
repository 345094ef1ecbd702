"""Driving the app with Pilot: wait for a condition, launch a fixture config from the picker, read a widget."""
from __future__ import annotations

import time

from textual.widgets import OptionList

from tests.tui.scripting import Session


async def wait_for(pilot, condition, timeout: float = 30.0, what: str = "condition") -> None:
    """Let the app run until `condition()` holds; fail after `timeout` seconds (generous: on a loaded 2-core
    machine the dashboard's first draws have taken over 10 s; a passing test never waits that long)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


def highlighted(app) -> str:
    try:
        option = app.screen.query_one("#choices", OptionList).highlighted_option
    except Exception:
        return ""
    return str(option.prompt) if option else ""


async def launch(pilot, session: Session, config: str = "good.toml", running: bool = True) -> Session:
    """From the picker, launch `config` and wait for the dashboard; with `running`, every worker reports
    that training started, so the pipelines are RUNNING."""
    from torchherd.tui.screens.dashboard import DashboardScreen

    app = pilot.app
    await wait_for(pilot, lambda: ".toml" in highlighted(app), what="configs listed")
    while config not in highlighted(app):
        await pilot.press("down")
    # The check builds the tasks in a fresh process (seconds, once per test session: it is cached).
    await wait_for(pilot, lambda: any(p.name == config for p in app.screen.checks), timeout=60,
                   what="check result")
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
    if running:
        names = [v.name for v in session.sup.views() if v.state.value == "starting"]
        for name in names:
            session.start_training(name)
        await wait_for(pilot, lambda: all(app.bridge.state.rows[n].state.value == "running" for n in names),
                       what="pipelines running")
    await settled(pilot)
    return session


async def settled(pilot) -> None:
    """Wait until the dashboard has drawn everything the bridge has folded."""
    app = pilot.app
    dashboard = app.screen
    await wait_for(pilot, lambda: not dashboard.redraw_pending and
                   dashboard.drawn_versions[0] == app.bridge.state.rows_version and
                   dashboard.drawn_versions[1] == app.bridge.state.series_version, what="redrawn")
    await pilot.pause()


def lines_of(widget) -> str:
    """What a line-based widget (Log, RichLog) shows, as plain text."""
    return "\n".join(getattr(line, "text", str(line)) for line in widget.lines)
