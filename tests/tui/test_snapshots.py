"""SVG snapshots of the main screens, driven by the real Supervisor over scripted workers.

Fixed data, UTC, a frozen event clock (the supervisor's own events are stamped by it) and a fixed
app clock, so each run draws the same screen. Update with
`python -m pytest tests/tui/test_snapshots.py --snapshot-update` after looking at the new pictures.
"""
from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

import torchherd.engine.preflight.check
from torchherd.engine.protocol import telemetry as t
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.rundir import provenance
from torchherd.tui.widgets.log_views import LogTail
from tests.tui.conftest import CONFIGS
from tests.tui.pilots import launch, settled, wait_for
from tests.tui.scripting import RUN_ID, T0, write_past_run
from torchherd.tui.start import Launch

GIB = 2 ** 30


@pytest.fixture
def fixed_machine(monkeypatch):
    """The check's device lines and the config paths must not depend on the machine or the checkout."""
    monkeypatch.setattr(torchherd.engine.preflight.check, "discover_devices",
                        lambda: Inventory(cpu_count=2, note="no NVIDIA GPU (test machine); using CPU slots"))
    monkeypatch.chdir(CONFIGS.parent)
    # Nor on the checkout's commit, which the header shows.
    monkeypatch.setattr(provenance, "record", lambda configs, run_dir: provenance.Provenance(()))


def telemetry() -> t.TelemetrySnapshot:
    gpu = t.GpuSample(index=0, uuid="GPU-0", name="Test GPU", util_gpu=87, util_mem=40, mem_used=12 * GIB,
                      mem_total=40 * GIB, temperature=65, power_draw=250.0, power_limit=400.0,
                      processes=(t.GpuProcess(pid=10000, used_memory=6 * GIB, owner="alpha"),
                                 t.GpuProcess(pid=10001, used_memory=5 * GIB, owner="beta")))
    return t.TelemetrySnapshot(gpus=(gpu,), processes=(
        t.ProcessSample(pipeline="alpha", pid=10000, cpu_percent=98.0, rss=int(1.5 * GIB), children=2),
        t.ProcessSample(pipeline="beta", pid=10001, cpu_percent=95.0, rss=int(1.4 * GIB), children=0)),
        host_cpu_percent=45.0, host_mem_used=12 * GIB, host_mem_total=64 * GIB, load1=3.5, time=T0 + 200)


def dashboard_with_data(session, crash: bool = False, tiny: bool = False):
    async def run_before(pilot) -> None:
        app = pilot.app
        log = app.runs_dir / RUN_ID / "alpha" / "log.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(f"epoch {e} step {s} loss {1 / (s + 1):.4f}\n" for e in range(1, 5)
                               for s in range(0, 50, 10)))
        await launch(pilot, session)
        loss = (lambda step: 3e-5 * (1 + math.exp(-step / 60))) if tiny else None
        session.train("alpha", 180, loss=loss)
        session.train("beta", 120, dt=1.4, t0=T0, loss=loss)
        session.show_telemetry(telemetry())
        if crash:
            session.crash("beta")
            await wait_for(pilot, lambda: session.state("beta") == "failed", what="beta failed")
        await wait_for(pilot, lambda: len(app.screen.query_one(LogTail).lines) == 20, what="log tail")
        await wait_for(pilot, lambda: app.bridge.state.rows["beta"].step == 120, what="data")
        await wait_for(pilot, lambda: app.bridge.state.telemetry is not None, what="telemetry")
        if crash:
            await wait_for(pilot, lambda: app.bridge.state.rows["beta"].state.final, what="failure shown")
        await settled(pilot)
    return run_before


def test_picker(snap_compare, make_app, fixed_machine, runs_dir, clock):
    asyncio.run(write_past_run(runs_dir, clock))

    async def run_before(pilot) -> None:
        await wait_for(pilot, lambda: pilot.app.screen.configs, what="configs")
        await pilot.press("down")
        await wait_for(pilot, lambda: "ready" in str(pilot.app.screen.query_one("#verdict").content),
                       timeout=60, what="check")

    assert snap_compare(make_app(Path("configs")), terminal_size=(100, 30), run_before=run_before)


def test_dashboard_with_data(snap_compare, make_app, fixed_machine, session):
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=dashboard_with_data(session))


def test_dashboard_at_80x24_with_tiny_losses(snap_compare, make_app, fixed_machine, session):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=dashboard_with_data(session, tiny=True))


def test_failure_with_traceback(snap_compare, make_app, fixed_machine, session):
    session.restart = {"max_restarts": 0}  # the first crash is final: nothing moves after it

    async def run_before(pilot) -> None:
        await dashboard_with_data(session, crash=True)(pilot)
        await pilot.press("down")  # select beta, the one that failed
        await wait_for(pilot, lambda: pilot.app.screen.selected == "beta", what="beta selected")
        await settled(pilot)

    assert snap_compare(make_app(), terminal_size=(100, 32), run_before=run_before)


def test_overlay_with_legend(snap_compare, make_app, fixed_machine, session):
    async def run_before(pilot) -> None:
        await dashboard_with_data(session)(pilot)
        await pilot.press("a")
        await settled(pilot)

    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=run_before)


def test_accuracy_strip(snap_compare, make_app, fixed_machine, session):
    async def run_before(pilot) -> None:
        from torchherd.tui.screens.dashboard import DashboardScreen

        app = pilot.app
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="dashboard")
        await wait_for(pilot, lambda: session.sup.views()[0].state.value == "starting", what="started")
        session.start_training("alpha")
        session.train("alpha", 200, loss=lambda step: 0.01 + 0.002 * math.exp(-step / 100))
        await wait_for(pilot, lambda: len(app.bridge.state.series["alpha"].val) == 4, what="results")
        await settled(pilot)

    app = make_app(CONFIGS / "metrics" / "accuracy.toml", start=Launch(CONFIGS / "metrics" / "accuracy.toml"))
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_help_at_80x24(snap_compare, make_app, fixed_machine, session):
    async def run_before(pilot) -> None:
        await launch(pilot, session)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)


def test_quit_dialog(snap_compare, make_app, fixed_machine, session):
    async def run_before(pilot) -> None:
        await dashboard_with_data(session)(pilot)
        await pilot.press("q")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)
