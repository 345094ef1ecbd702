"""Fixtures for the app tests: fixed time zone, config fixtures, and an app wired to the scripted supervisor."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakes import T0, FakeSupervisor  # noqa: E402

from torchherd.engine import messages as m  # noqa: E402
from torchherd.engine.rundir import RunDirectory  # noqa: E402
from torchherd.tui.app import TorchherdApp  # noqa: E402

CONFIGS = Path(__file__).parent / "configs"


@pytest.fixture(autouse=True)
def utc():
    """Event-log and picker times are local times: pin the zone so screens are the same everywhere."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def make_app(runs_dir: Path):
    """An app on the fixture configs whose launches go to a FakeSupervisor, with a frozen clock."""
    FakeSupervisor.instances.clear()

    def make(target: Path = CONFIGS, **kwargs) -> TorchherdApp:
        kwargs.setdefault("factory", FakeSupervisor)
        kwargs.setdefault("clock", lambda: T0 + 600)
        return TorchherdApp(target, runs_dir, **kwargs)

    return make


def fake() -> FakeSupervisor:
    return FakeSupervisor.instances[-1]


async def wait_for(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until `condition()` holds; fail after `timeout` seconds of app time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


async def launch_good(pilot) -> FakeSupervisor:
    """From the picker, launch good.toml and wait for the dashboard."""
    from torchherd.tui.screens.dashboard import DashboardScreen

    await wait_for(pilot, lambda: ".toml" in _highlighted(pilot.app), what="configs listed")
    while "good.toml" not in _highlighted(pilot.app):
        await pilot.press("down")
    # The check builds the tasks in a fresh process (seconds, once per test session: it is cached).
    await wait_for(pilot, lambda: any(p.name == "good.toml" for p in pilot.app.screen.checks), timeout=60,
                   what="check result")
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, DashboardScreen), what="dashboard")
    await pilot.pause()
    return fake()


def _highlighted(app) -> str:
    from textual.widgets import OptionList

    try:
        option = app.screen.query_one("#choices", OptionList).highlighted_option
    except Exception:
        return ""
    return str(option.prompt) if option else ""


def write_past_run(runs_dir: Path, run_id: str = "20231114-220000-old") -> Path:
    """A finished run directory with a failure in it, as the engine writes one."""
    rd = RunDirectory(runs_dir / run_id)
    sup = FakeSupervisor.__new__(FakeSupervisor)
    FakeSupervisor.__init__(sup, _Cfg(), runs_dir)
    events: list[m.Event] = []
    sup.emit = lambda *evs: events.extend(evs)  # record instead of streaming
    sup.run_id, sup.run_dir = run_id, runs_dir / run_id
    sup._queues = []
    sup.emit(m.RunStarted(run_id=run_id, run_dir=str(sup.run_dir), config_path="good.toml",
                          pipelines=("alpha",), time=T0))
    sup._begin("alpha", 0)
    sup.train("alpha", 100)
    sup.crash("alpha")
    sup.emit(m.PipelineFinished(pipeline="alpha", status="failed", reason="too many crashes", time=sup.t),
             m.RunFinished(ok=False, statuses={"alpha": "failed"}, time=sup.t))
    for ev in events:
        rd.write(ev)
    rd.close()
    (runs_dir / run_id / "alpha").mkdir(exist_ok=True)
    (runs_dir / run_id / "alpha" / "log.txt").write_text("epoch 0\nepoch 1\nTraceback: boom\n")
    return runs_dir / run_id


class _Cfg:
    name = "old"
    source = "good.toml"
    pipelines = ()
