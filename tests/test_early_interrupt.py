"""Ctrl-C in the first moments of `torchherd run CONFIG --headless`, while the run's service starts: it stops
what was started, says so without a traceback, and leaves no process and no run directory behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, TASKS, repo_env, still_alive

pytestmark = pytest.mark.slow
PLAIN = TASKS / "scripts" / "plain_loop.py"


def config(tmp_path: Path) -> Path:
    path = tmp_path / "early.toml"
    path.write_text(f'name = "early-{uuid.uuid4().hex[:8]}"\nruns_dir = "{tmp_path / "runs"}"\n'
                    f'[[pipelines]]\nname = "s"\nscript = "{PLAIN}"\nargs = ["--epochs", "100000", "--delay", "0.2"]\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 1\n[telemetry]\nenabled = false\n')
    return path


def service_child(cli: psutil.Process, timeout: float = 60.0) -> psutil.Process:
    """The run's service once the CLI has started it (it is the CLI's child until it serves)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in cli.children():
            try:
                if "torchherd.engine.serve.service" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.005)  # a poll of a condition, not a wait for time to pass
    raise AssertionError("the CLI never started the service")


def test_ctrl_c_while_the_service_starts_stops_it_and_keeps_nothing(tmp_path):
    # Regression: a raw KeyboardInterrupt traceback from service.spawn (reading the service's stdout), and
    # twice a run left behind that `torchherd ls` showed as "cut short, resumable".
    cli = subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(config(tmp_path)), "--headless"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=repo_env(),
                           stdin=subprocess.DEVNULL)
    service = service_child(psutil.Process(cli.pid))
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 3, out + err
    assert "interrupted while the run was starting: stopped what it had started" in err, out + err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert still_alive([service.pid], timeout=30) == []
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(PLAIN) in " ".join(p.info["cmdline"] or [])]
    assert still_alive(left, timeout=30) == []
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())


def test_ctrl_c_that_lands_inside_popen_still_stops_the_forked_service(tmp_path, monkeypatch):
    # Regression (seen in CI): SIGINT while Popen was in fork/exec raised out of Popen after the fork, losing
    # the service it had started. Here the signal lands just before the real Popen returns, every time.
    from torchherd.engine.serve import service

    real, forked = subprocess.Popen, []

    def popen_then_ctrl_c(*args, **kwargs):
        proc = real(*args, **kwargs)
        forked.append(proc.pid)
        os.kill(os.getpid(), signal.SIGINT)
        return proc

    monkeypatch.setattr(service.subprocess, "Popen", popen_then_ctrl_c)
    with pytest.raises(service.StartCancelled):
        service.spawn(config=config(tmp_path), runs_dir=tmp_path / "runs")
    assert forked and still_alive(forked, timeout=30) == []
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
