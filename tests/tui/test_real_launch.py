"""The real thing: launch tiny.toml through the picker with the real Supervisor, see its first
val_result on screen, quit, and leave no process behind."""
from __future__ import annotations

import psutil
import pytest
from conftest import CONFIGS, wait_for

from tui.app import TorchherdApp
from tui.screens.dashboard import DashboardScreen
from tui.screens.dialogs import QuitScreen
from tui.widgets.log_views import EventLog
from tui.widgets.pipeline_table import PipelineTable

pytestmark = pytest.mark.asyncio


async def test_real_config_reaches_val_result(runs_dir):
    app = TorchherdApp(CONFIGS / "tiny.toml", runs_dir)
    pids: set[int] = set()
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: any(p.name == "tiny.toml" for p in getattr(app.screen, "checks", {})),
                       timeout=30, what="tiny.toml checked")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), timeout=30, what="dashboard")
        events = app.screen.query_one(EventLog)

        def seen() -> bool:
            pids.update(r.pid for r in app.bridge.state.rows.values() if r.pid)
            return "val_result" in "\n".join(strip.text for strip in events.lines)

        await wait_for(pilot, seen, timeout=120, what="first val_result on screen")
        assert app.screen.query_one(PipelineTable).cell("tiny", "val") != "-"
        await pilot.press("q")
        if isinstance(app.screen, QuitScreen):
            await pilot.press("s")
        await wait_for(pilot, lambda: not app.is_running, timeout=60, what="app exit")
    assert pids, "never saw a worker pid"
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert list(runs_dir.glob("*/events.jsonl"))
