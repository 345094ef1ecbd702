"""Fixtures for the app tests: fixed time zone and event clock, and an app whose launches go to a real
Supervisor over scripted workers (tests/tui/scripting.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from torchherd.engine.protocol import messages
from torchherd.tui.app import TorchherdApp
from tests.tui.scripting import T0, FrozenTime, Session

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


@pytest.fixture(scope="session", autouse=True)
def fixture_configs_checked():
    """The fixture configs' tasks built once per test session by the real probe, so each app test finds
    the picker's verdict in the probe's cache instead of building the same tasks again (seconds each)."""
    from torchherd.engine.config.load import load_config
    from torchherd.engine.config.problems import ConfigError
    from torchherd.engine.preflight.probe import probe_tasks

    configs = []
    for path in sorted(CONFIGS.glob("*.toml")):
        try:
            configs.append(load_config(path))
        except ConfigError:
            continue  # a config the check refuses before any task is built
    # One probe process for all of them (each costs a torch import): their pipelines side by side build the
    # same (task, params, settings) jobs, so the verdicts land under the keys each config asks for.
    assert len({c.validation.mode for c in configs}) == 1
    probe_tasks(configs[0].model_copy(update={"pipelines": [p for c in configs for p in c.pipelines]}))


@pytest.fixture
def clock(monkeypatch) -> FrozenTime:
    """The clock that stamps the events the supervisor makes, frozen at T0 until a test moves it."""
    frozen = FrozenTime(T0)
    monkeypatch.setattr(messages, "clock", frozen)
    return frozen


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def session(clock) -> Session:
    """The supervisor factory of the app `make_app` builds; it scripts the workers of its session."""
    return Session(clock)


@pytest.fixture
def make_app(runs_dir: Path, session: Session):
    """An app on the fixture configs whose launches build a real Supervisor over scripted workers. It redraws
    at up to 10 Hz: at the app's 2 Hz every wait for what the screen shows would take up to half a second."""

    def make(target: Path = CONFIGS, **kwargs) -> TorchherdApp:
        kwargs.setdefault("factory", session)
        kwargs.setdefault("clock", lambda: T0 + 600)
        kwargs.setdefault("refresh_hz", 10.0)
        return TorchherdApp(target, runs_dir, **kwargs)

    return make
