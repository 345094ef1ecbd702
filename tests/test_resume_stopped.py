"""Any run that did not complete can be resumed: stopped, killed, failed or never-started pipelines carry on
from their checkpoints; completed ones are left alone; `--only` picks some."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from torchherd.engine.protocol.messages import PipelineFinished, Resumed, RunFinished, StepMetrics, TrainingStarted
from torchherd.engine.rundir.directory import list_runs, read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, wait_for

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchherd", *args], capture_output=True, text=True, timeout=180)


async def stopped_run(tmp_path: Path) -> Path:
    """A run of three pipelines on two slots, stopped gracefully mid-epoch: a and b stopped, c never started.
    Each waits at its sixth step until the stop is asked for, so on a loaded machine a cannot finish before b
    has started."""
    gate = tmp_path / "stop-asked"
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}, {"name": "c"}],
                         defaults={"max_epochs": 2, "task": f"{TASKS / 'faulty.py'}:build",
                                   "params": {"gate_file": str(gate), "gate_at_call": 6}},
                         validation={"mode": "inline"}, telemetry={"enabled": False})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        seen: set[str] = set()

        def both_training(e) -> bool:
            if isinstance(e, StepMetrics) and e.step >= 4:
                seen.add(e.pipeline)
            return seen == {"a", "b"}
        await wait_for(stream, both_training)
        sup.stop()
        gate.touch()
        statuses = await asyncio.wait_for(sup.wait(), 60)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"a": "stopped", "b": "stopped", "c": "stopped"}
    return sup.run_dir


async def test_a_stopped_run_resumes_every_pipeline_from_its_checkpoint(tmp_path):
    # Regression: `torchherd resume` said "already finished (stopped); nothing to resume" (exit 2)
    # after headless Ctrl-C, SIGHUP or the app's "stop & quit", although all of them wrote checkpoints.
    run_dir = await stopped_run(tmp_path)
    [summary] = list_runs(run_dir.parent)
    assert summary.resumable and summary.to_resume == ("a", "b", "c")
    stopped_at = {e.pipeline: e.step for e in read_events(run_dir) if isinstance(e, PipelineFinished)}
    proc = cli("resume", str(run_dir), "--headless")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_events(run_dir)
    resumed = {e.pipeline: e.step for e in events if isinstance(e, Resumed)}
    assert resumed["a"] == stopped_at["a"] > 0 and resumed["b"] == stopped_at["b"] > 0
    assert "c" not in resumed  # it never started: it starts from scratch, and says so
    assert "c from scratch" in proc.stdout
    last = [e for e in events if isinstance(e, RunFinished)][-1]
    assert last.statuses == {"a": "completed", "b": "completed", "c": "completed"}
    # Resumed mid-epoch from the stop checkpoint: each ends at exactly its step budget (2 epochs of 8 steps).
    ends = {e.pipeline: e.step for e in events if isinstance(e, PipelineFinished) and e.status == "completed"}
    assert ends == {"a": 16, "b": 16, "c": 16}
    assert not list_runs(run_dir.parent)[0].resumable


async def test_resume_only_picks_pipelines_and_leaves_completed_ones_alone(tmp_path):
    run_dir = await stopped_run(tmp_path)
    proc = cli("resume", str(run_dir), "--headless", "--only", "b")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # a and c are still stopped
    events = read_events(run_dir)
    last = [e for e in events if isinstance(e, RunFinished)][-1]
    assert last.statuses == {"a": "stopped", "b": "completed", "c": "stopped"}
    started = [e.pipeline for e in events if isinstance(e, TrainingStarted)]
    # By its run id, as `torchherd ls` lists it (regression: "not a torchherd run directory", exit 2).
    proc = cli("resume", run_dir.name, "--runs-dir", str(run_dir.parent), "--headless")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = [e.pipeline for e in read_events(run_dir) if isinstance(e, TrainingStarted)][len(started):]
    assert sorted(again) == ["a", "c"]  # b had completed: not trained again
    # Regression: resuming a run that had completed exited 2, the code for bad input; nothing to do is success.
    done = cli("resume", str(run_dir), "--headless")
    assert done.returncode == 0 and "nothing to resume" in done.stderr, done.stdout + done.stderr
    bad = cli("resume", str(run_dir), "--headless", "--only", "nope")
    assert bad.returncode == 2 and "nope" in bad.stderr
    nosuch = cli("resume", "no-such-run", "--runs-dir", str(run_dir.parent), "--headless")
    assert nosuch.returncode == 2 and "no-such-run: no such run" in nosuch.stderr, nosuch.stderr
