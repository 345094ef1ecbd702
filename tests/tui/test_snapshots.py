"""SVG snapshots of the picker, the dashboard with data, a failure with its traceback, and the quit dialog.

Fixed data, fixed clock, UTC, no live telemetry: each run draws the same screen.
Update with `pytest tests/tui/test_snapshots.py --snapshot-update` after checking the new pictures.
"""
from __future__ import annotations

import pytest
from conftest import CONFIGS, launch_good, wait_for, write_past_run
from fakes import T0

import torchherd.engine.check
from torchherd.engine import messages as m
from torchherd.engine.devices import Inventory
from torchherd.tui.screens.dashboard import DashboardScreen
from torchherd.tui.widgets.log_views import LogTail

GIB = 2 ** 30


@pytest.fixture
def fixed_machine(monkeypatch):
    """The check's device lines and the config paths must not depend on the machine or the checkout."""
    monkeypatch.setattr(torchherd.engine.check, "discover_devices",
                        lambda: Inventory(cpu_count=2, note="no NVIDIA GPU (test machine); using CPU slots"))
    monkeypatch.chdir(CONFIGS.parent)


def telemetry() -> m.TelemetrySnapshot:
    gpu = m.GpuSample(index=0, uuid="GPU-0", name="Test GPU", util_gpu=87, util_mem=40, mem_used=12 * GIB,
                      mem_total=40 * GIB, temperature=65, power_draw=250.0, power_limit=400.0,
                      processes=(m.GpuProcess(pid=4000, used_memory=6 * GIB, owner="alpha"),
                                 m.GpuProcess(pid=4001, used_memory=5 * GIB, owner="beta")))
    return m.TelemetrySnapshot(gpus=(gpu,), processes=(
        m.ProcessSample(pipeline="alpha", pid=4000, cpu_percent=98.0, rss=int(1.5 * GIB), children=2),
        m.ProcessSample(pipeline="beta", pid=4001, cpu_percent=95.0, rss=int(1.4 * GIB), children=0)),
        host_cpu_percent=45.0, host_mem_used=12 * GIB, host_mem_total=64 * GIB, load1=3.5, time=T0 + 200)


async def dashboard_with_data(pilot, crash: bool = False) -> None:
    app = pilot.app
    log = app.runs_dir / "20231114-221320-good" / "alpha" / "log.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(f"epoch {e} step {s} loss {1 / (s + 1):.4f}\n" for e in range(4) for s in range(0, 50, 10)))
    sup = await launch_good(pilot)
    sup.train("alpha", 180)
    sup.t = T0
    sup.train("beta", 120, dt=1.4)
    sup.emit(telemetry())
    if crash:
        sup.crash("beta")
    tail = app.screen.query_one(LogTail)
    await wait_for(pilot, lambda: len(tail.lines) == 20, what="log tail")
    await wait_for(pilot, lambda: app.bridge.state.rows["beta"].step == 120, what="data")
    dashboard = app.screen
    assert isinstance(dashboard, DashboardScreen)
    await wait_for(pilot, lambda: not dashboard._pending and dashboard._seen[0] == app.bridge.state.rows_version,
                   what="redrawn")
    await pilot.pause()


def test_picker(snap_compare, make_app, fixed_machine, runs_dir):
    write_past_run(runs_dir)

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: pilot.app.screen.configs, what="configs")
        await pilot.press("down")
        await wait_for(pilot, lambda: "ready" in str(pilot.app.screen.query_one("#verdict").content),
                       timeout=60, what="check")

    from pathlib import Path
    assert snap_compare(make_app(Path("configs")), terminal_size=(100, 30), run_before=run_before)


def test_dashboard_with_data(snap_compare, make_app, fixed_machine):
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=dashboard_with_data)


def test_failure_with_traceback(snap_compare, make_app, fixed_machine):
    async def run_before(pilot) -> None:
        await dashboard_with_data(pilot, crash=True)
        await pilot.press("down")  # select beta, the one that failed
        await wait_for(pilot, lambda: pilot.app.screen.selected == "beta", what="beta selected")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(100, 32), run_before=run_before)


def test_quit_dialog(snap_compare, make_app, fixed_machine):
    async def run_before(pilot) -> None:
        await dashboard_with_data(pilot)
        await pilot.press("q")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)
