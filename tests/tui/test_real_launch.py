"""The real thing: launch tiny.toml through the picker with the real Supervisor, see its first
val_result on screen, quit, and leave no process behind."""
from __future__ import annotations

import psutil
import pytest

from torchherd.tui.app import TorchherdApp
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.screens.dialogs import QuitScreen
from torchherd.tui.widgets.log_views import EventLog
from torchherd.tui.widgets.pipeline_table import PipelineTable
from tests.tui.conftest import CONFIGS
from tests.tui.pilots import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]  # starts real training processes


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
            shown = "\n".join(strip.text for strip in events.lines)  # wrapped to the pane's width
            return any(e.text.startswith("validated epoch") for e in app.bridge.state.log) and "validated" in shown

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


async def test_unfinished_run_is_offered_and_resumed_from_the_picker(runs_dir, tmp_path):
    """A run whose torchherd died (no run_finished, its pid gone) shows as resumable; r carries it on."""
    import json
    import subprocess
    import sys

    from torchherd.engine.config.load import load_config
    from torchherd.engine.protocol.messages import RunStarted
    from torchherd.engine.protocol.records import to_record

    config = load_config(CONFIGS / "tiny.toml")
    run_dir = runs_dir / "20260101-000000-tiny"
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps([config.model_dump(mode="json")]))
    started = RunStarted(run_id=run_dir.name, run_dir=str(run_dir), config_path=config.source,
                         pipelines=tuple(p.name for p in config.pipelines))
    (run_dir / "events.jsonl").write_text(json.dumps(to_record(started)) + "\n")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run_dir / "supervisor.pid").write_text(gone.stdout)  # a pid that has exited

    app = TorchherdApp(CONFIGS, runs_dir)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: getattr(app.screen, "runs", None), timeout=30, what="past runs listed")
        assert app.screen.runs[0].resumable
        await pilot.press("end")  # the past run is the last entry
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), timeout=30, what="dashboard")
        await wait_for(pilot, lambda: app.bridge.state.finished, timeout=120, what="the resumed run to finish")
        await pilot.press("q")
        if isinstance(app.screen, QuitScreen):
            await pilot.press("s")
        await wait_for(pilot, lambda: not app.is_running, timeout=60, what="app exit")
    records = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(r["type"] == "run_finished" and r["ok"] for r in records)
