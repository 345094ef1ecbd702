"""An attached client stands where its user stands: attached from a folder other than the one the run was
started from, every path the app shows exists from there; and when the run's service dies under it, the app
shows no pipeline running (each row and the header say "cut short") and a headless client says so and exits.

Every run is a real service over real workers of tests/tasks/faulty.py held at a gate (test_attach_app.py's).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import repo_env
from tests.tui.pilots import wait_for
from tests.tui.test_attach_app import SIZE, SLOW, dashboard_of, end_service, held, wait_for_file, write_config
from torchherd.engine.serve.service import spawn
from torchherd.tui.app import TorchherdApp, report_runs
from torchherd.tui.start import Attach
from torchherd.tui.widgets.pipeline_table import PipelineTable

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]  # real services and training processes


def started_elsewhere(tmp_path: Path, monkeypatch, gate: Path):
    """A run started from tmp_path/project into its relative `runs` folder; the test then stands in tmp_path/home."""
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    config = write_config(project, ["long"], gate)
    monkeypatch.chdir(project)
    started = spawn(config=config, runs_dir=Path("runs"))
    monkeypatch.chdir(home)
    return started, home


async def test_an_app_attached_from_another_folder_names_the_runs_files_as_they_are_from_there(
        tmp_path, monkeypatch, capsys):
    # Regression: the log pane was empty and `l` titled `runs/<id>/long/log.txt`, relative to the folder the
    # run was started from; on quit it named a run directory that did not exist.
    gate = tmp_path / "gate"
    started, home = await asyncio.to_thread(started_elsewhere, tmp_path, monkeypatch, gate)
    try:
        run_dir = tmp_path / "project" / started.run_dir
        await wait_for_file(lambda: held(run_dir, "long"), "steps 1..12")
        app = TorchherdApp(None, None, start=Attach(run_dir))
        async with app.run_test(size=SIZE) as pilot:
            await dashboard_of(pilot)
            state = app.bridge.state
            await wait_for(pilot, lambda: "long" in state.rows, what="the pipeline's row")
            log = state.log_path("long")
            assert log is not None and log.is_file() and log.resolve() == (run_dir / "long" / "log.txt").resolve()
            await pilot.press("l")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "LogScreen", what="the full log")
            title = app.screen._title(200).split(": ", 1)[1]
            assert (home / title).resolve() == log.resolve(), title
            gate.touch()
            await wait_for(pilot, lambda: state.finished, timeout=SLOW, what="the run to finish")
            await pilot.press("escape", "q")
            await wait_for(pilot, lambda: not app.is_running, timeout=SLOW, what="the app to exit")
        capsys.readouterr()
        report_runs(app, launch=False)
        [line] = [x for x in capsys.readouterr().out.splitlines() if "run directory: " in x]
        assert (home / line.split("run directory: ", 1)[1]).resolve() == run_dir.resolve(), line
    finally:
        await end_service(tmp_path / "project" / started.run_dir, started.pid, gate)


async def test_an_app_shows_the_run_cut_short_once_its_service_is_killed(tmp_path, runs_dir):
    # Regression: after `kill -9` of the service the header kept "1 running" and the row "running" with an eta,
    # for more than 10 s; only the event log said the run was cut short.
    gate = tmp_path / "gate"
    started = await asyncio.to_thread(spawn, config=write_config(tmp_path, ["long"], gate), runs_dir=runs_dir)
    try:
        await wait_for_file(lambda: held(started.run_dir, "long"), "steps 1..12")
        app = TorchherdApp(None, runs_dir, start=Attach(started.run_dir))
        async with app.run_test(size=SIZE) as pilot:
            dashboard = await dashboard_of(pilot)
            state, table = app.bridge.state, dashboard.query_one(PipelineTable)
            await wait_for(pilot, lambda: table.row_count == 1 and table.cell("long", "state") == "running",
                           what="the row running")
            os.kill(started.pid, signal.SIGKILL)
            await wait_for(pilot, lambda: table.cell("long", "state") == "cut short", timeout=SLOW,
                           what="the row cut short")
            assert state.rows["long"].eta() is None and "cut short, resumable" in dashboard._status_text
            assert "running" not in dashboard._status_text
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running, timeout=SLOW, what="the app to exit")
    finally:
        await end_service(started.run_dir, started.pid, gate)


async def test_a_headless_client_says_the_run_was_cut_short_and_exits(tmp_path, runs_dir):
    gate = tmp_path / "gate"
    started = await asyncio.to_thread(spawn, config=write_config(tmp_path, ["long"], gate), runs_dir=runs_dir)
    try:
        await wait_for_file(lambda: held(started.run_dir, "long"), "steps 1..12")
        follower = subprocess.Popen(
            [sys.executable, "-m", "torchherd", "attach", str(started.run_dir), "--headless", "--read-only"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=repo_env(), stdin=subprocess.DEVNULL)
        first = await asyncio.to_thread(follower.stdout.readline)
        assert "following run" in first, first
        os.kill(started.pid, signal.SIGKILL)
        out, err = await asyncio.to_thread(follower.communicate, timeout=SLOW)
        assert follower.returncode == 1 and "the run was cut short" in out, out + err
    finally:
        await end_service(started.run_dir, started.pid, gate)
