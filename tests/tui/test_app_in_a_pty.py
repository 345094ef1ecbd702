"""The app in a real terminal (a pty) whose SSH session drops: SIGHUP to the terminal's process group ends
the app, and the run, whose supervisor is a service of its own, trains on until it is stopped from
another shell."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import TASKS, repo_env
from tests.faults.support import REPO, poll_until, wait_gone
from tests.tui.terminal import read_screen
from torchherd.engine.rundir.directory import read_records, run_held

pytestmark = pytest.mark.slow

CONFIG = f"""
[defaults]
task = "{TASKS / 'faulty.py'}:build"
max_epochs = 100
batch_size = 32
params = {{ samples = 256, delay = 0.002 }}

[[pipelines]]
name = "long"

[devices]
placement = "cpu"
cpu_slots = 1

[telemetry]
enabled = false
"""


def steps(run_dir) -> int:
    return sum(r.get("type") == "step" for r in read_records(run_dir / "events.jsonl"))


def test_sighup_to_the_apps_terminal_leaves_the_run_training(tmp_path):
    config = tmp_path / "long.toml"
    config.write_text(CONFIG)
    runs = tmp_path / "runs"
    master, slave = pty.openpty()
    env = repo_env(TERM="xterm-256color", COLUMNS="120", LINES="40")
    app = subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(config), "--runs-dir", str(runs)],
                           stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=tmp_path, env=env)
    os.close(slave)
    read_screen(master)  # read as a terminal would, or the app blocks on a full pty
    service = None
    try:
        run_dir = poll_until(lambda: next(iter(runs.glob("*/events.jsonl")), None), 120, "the run to start").parent
        poll_until(lambda: steps(run_dir) > 3, 120, "training steps")  # step records: one every 10 steps
        service = psutil.Process(int((run_dir / "supervisor.pid").read_text().split()[0]))
        assert os.getsid(service.pid) != os.getsid(app.pid)  # a session of its own: the hangup is not its

        os.killpg(app.pid, signal.SIGHUP)  # what the kernel does when the SSH session's terminal goes away
        os.close(master)
        assert app.wait(30) is not None
        before = steps(run_dir)
        poll_until(lambda: steps(run_dir) > before + 3, 60, "steps after the hangup")
        assert run_held(run_dir) and service.is_running()

        stop = subprocess.run([sys.executable, "-m", "torchherd", "stop", str(run_dir)], capture_output=True,
                              text=True, cwd=REPO, env=repo_env(), timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert not wait_gone([service], 60)
        records = read_records(run_dir / "events.jsonl")
        assert records[-1]["type"] == "run_finished" and records[-1]["statuses"] == {"long": "stopped"}
        assert any(r["type"] == "checkpoint_saved" and r["reason"] == "stop" for r in records)
        commands = [r for r in records if r["type"] == "client_command"]
        assert [(c["action"], c["ok"]) for c in commands] == [("stop", True)]
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait(10)
        if service is not None and service.is_running():
            for p in [service] + service.children(recursive=True):
                p.kill()


def test_torchherd_run_on_an_invalid_config_closes_its_screen_and_says_why(tmp_path):
    # The app opens before the config is read (its first frame waits for no engine import); a config the
    # check refuses still launches nothing and exits 2 with every problem, once the terminal is back.
    config = tmp_path / "bad.toml"
    config.write_text('[defaults]\ntask = "regression"\nmax_epoch = 3\n\n[[pipelines]]\nname = "g"\n')
    master, slave = pty.openpty()
    env = repo_env(TERM="xterm-256color", COLUMNS="120", LINES="40")
    app = subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(config), "--runs-dir", str(tmp_path / "runs")],
                           stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=tmp_path, env=env)
    os.close(slave)
    screen = bytearray()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # what the app draws, then what it prints, until the pty closes
        if not select.select([master], [], [], 1.0)[0]:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        screen.extend(data)
    os.close(master)
    assert app.wait(30) == 2
    text = screen.decode(errors="replace")
    assert "torchherd run: checking bad.toml" in text  # the screen came up first
    assert "1 problem:" in text and "max_epoch" in text
    assert not (tmp_path / "runs").exists()


NAN_CONFIG = f"""
[defaults]
task = "{TASKS / 'faulty.py'}:build"
max_epochs = 1000
batch_size = 32
nan_policy = "warn"
params = {{ samples = 256, delay = 0.002, fault = "nan", fault_at_call = 3 }}

[[pipelines]]
name = "nan"

[devices]
placement = "cpu"
cpu_slots = 1

[telemetry]
enabled = false
"""
OSC = re.compile(rb"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")  # a terminal command that may end in BEL: no bell


def test_an_alert_rings_the_terminal_bell_of_the_app(tmp_path):
    config = tmp_path / "nan.toml"
    config.write_text(NAN_CONFIG)
    runs = tmp_path / "runs"
    master, slave = pty.openpty()
    env = repo_env(TERM="xterm-256color", COLUMNS="120", LINES="40")
    env.pop("NO_BELL", None)
    app = subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(config), "--runs-dir", str(runs)],
                           stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=tmp_path, env=env)
    os.close(slave)
    screen = read_screen(master)
    run_dir = None
    try:
        poll_until(lambda: b"\x07" in OSC.sub(b"", bytes(screen)), 120, "the bell")
        run_dir = next(iter(runs.glob("*/events.jsonl"))).parent
        alerts = [r for r in read_records(run_dir / "events.jsonl") if r["type"] == "alert"]
        assert [(a["rule"], a["pipeline"]) for a in alerts] == [("nan", "nan")]
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait(10)
        os.close(master)
        if run_dir is not None:
            subprocess.run([sys.executable, "-m", "torchherd", "stop", str(run_dir)], capture_output=True,
                           cwd=REPO, env=repo_env(), timeout=60)
