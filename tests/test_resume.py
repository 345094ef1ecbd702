"""An unfinished run (its supervisor SIGKILLed) is noticed and carried on from its checkpoints."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from torchherd.engine.protocol.messages import PipelineFinished, Resumed, TrainingStarted
from torchherd.engine.rundir.directory import list_runs, read_events, read_records
from tests.conftest import TASKS, service_of, still_alive, repo_env

pytestmark = pytest.mark.slow

CONFIG = f"""
[defaults]
task = "{TASKS / 'tiny.py'}:build"
max_epochs = 4
batch_size = 32
[validation]
mode = "inline"
[devices]
placement = "cpu"
cpu_slots = 2
[[pipelines]]
name = "quick"
max_epochs = 1
[[pipelines]]
name = "slow"
params = {{ delay = 0.004 }}
"""


def cli(*args: str, **kw) -> subprocess.Popen:
    env = repo_env()
    return subprocess.Popen([sys.executable, "-m", "torchherd", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def wait_until(condition, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)  # polling a file another process writes


def test_killed_run_is_listed_resumable_and_resume_finishes_it(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    runs = tmp_path / "runs"
    proc = cli("run", str(config), "--headless", "--runs-dir", str(runs))
    try:
        def slow_checkpointed():
            found = list(runs.glob("*/events.jsonl"))
            return found and any(r.get("type") == "checkpoint_saved" and r.get("pipeline") == "slow"
                                 and r.get("reason") == "epoch" for r in read_records(found[0])) and \
                any(r.get("type") == "pipeline_finished" and r.get("pipeline") == "quick"
                    for r in read_records(found[0]))
        wait_until(slow_checkpointed)
        service = service_of(next(runs.iterdir()))
        workers = [c.pid for c in service.children(recursive=True)]
        assert workers
        service.send_signal(signal.SIGKILL)
        assert proc.wait(30) == 1  # the attached CLI says the run was cut short
        assert still_alive(workers) == []  # workers die with their supervisor
        assert "cut short" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [summary] = list_runs(runs)
    assert summary.status == "unfinished" and summary.resumable
    out = cli("resume", str(summary.path), "--headless")
    text, _ = out.communicate(timeout=120)
    assert out.returncode == 0, text
    # Regression: the old session's lines were printed again (at [0.0s]) before the new one's.
    assert "slow: epoch 1/" not in text and "quick: completed" not in text, text
    events = read_events(summary.path)
    resumed = [e for e in events if isinstance(e, Resumed) and e.pipeline == "slow"]
    assert resumed and resumed[-1].epoch >= 1
    # "quick" had completed: it is not trained again.
    assert len([e for e in events if isinstance(e, TrainingStarted) and e.pipeline == "quick"]) == 1
    finals = {e.pipeline: e.status for e in events if isinstance(e, PipelineFinished)}
    assert finals == {"quick": "completed", "slow": "completed"}
    assert not list_runs(runs)[0].resumable
