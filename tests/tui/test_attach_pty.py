"""The app in a real terminal (a pty), attached from a folder other than the run's, when the run's service is
SIGKILLed under it: its screen stops saying the pipeline runs and says the run was cut short."""
from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys

import pytest

from tests.conftest import repo_env
from tests.faults.support import poll_until
from tests.tui.terminal import read_screen
from tests.tui.test_attach_app import SLOW, held, write_config
from torchherd.engine.serve.service import spawn

pytestmark = pytest.mark.slow


def test_an_app_in_a_terminal_says_the_run_was_cut_short_when_its_service_dies(tmp_path, monkeypatch):
    gate, home = tmp_path / "gate", tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(tmp_path)
    started = spawn(config=write_config(tmp_path, ["long"], gate), runs_dir=tmp_path / "runs")
    master, slave = pty.openpty()
    app = subprocess.Popen([sys.executable, "-m", "torchherd", "attach", str(started.run_dir)], stdin=slave,
                           stdout=slave, stderr=slave, start_new_session=True, cwd=home,
                           env=repo_env(TERM="xterm-256color", COLUMNS="120", LINES="40"))
    os.close(slave)
    screen = read_screen(master)
    try:
        poll_until(lambda: held(started.run_dir, "long"), SLOW, "steps 1..12")
        poll_until(lambda: b"running" in screen, SLOW, "the app showing the pipeline running")
        drawn = len(screen)
        os.kill(started.pid, signal.SIGKILL)
        # Regression: the header kept "1 running" (only the event log said the run was cut short).
        poll_until(lambda: b"cut short, resumable" in screen[drawn:], SLOW, "the header saying the run was cut short")
    finally:
        gate.touch()
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait(10)
        os.close(master)
        try:
            os.kill(started.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
