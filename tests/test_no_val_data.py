"""A Task without val_data has nothing to validate: no snapshot goes to the background validator, the run
ends as soon as its pipelines do, and `check --probe` and the run each say so once.

Regression: such a run kept `torchherd run` 120 s after its pipeline completed (snapshot_skipped "no
validation result within 120s"), its validator never saying why: it had no data to score the snapshots with.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.preflight.check import check_config

NO_GPU = Inventory(cpu_count=2, note="no NVIDIA GPU (test inventory)")

NOTE = "no val_data: nothing to validate, no background validation"


def write_config(tmp_path: Path) -> Path:
    """A one-pipeline config, validated in the background, whose task returns no val_data."""
    (tmp_path / "unvalidated.py").write_text(textwrap.dedent("""
        from torchherd.engine.runners.task.builtin import regression


        def build(params):
            task = regression(params)
            task.val_data = None
            return task
        """))
    config = tmp_path / "run.toml"
    config.write_text('[[pipelines]]\nname = "a"\ntask = "unvalidated.py:build"\nmax_epochs = 2\n'
                      'params = { samples = 128 }\n\n[devices]\nplacement = "cpu"\ncpu_slots = 1\n\n'
                      '[validation]\nmode = "background"\ndevice = "cpu"\n\n[telemetry]\nenabled = false\n')
    return config


@pytest.mark.slow  # starts the CLI, its service, a worker and the validator
def test_a_task_without_val_data_hands_nothing_off_and_the_run_ends_with_its_pipeline(tmp_path: Path):
    config = write_config(tmp_path)
    # Generous, yet under the 120 s the run used to wait for results that could never come.
    proc = subprocess.run([sys.executable, "-m", "torchherd", "run", str(config), "--headless", "--runs-dir",
                           str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    events = [json.loads(line) for path in (tmp_path / "runs").glob("*/events.jsonl")
              for line in path.read_text().splitlines()]
    types = [e["type"] for e in events]
    assert "snapshot_taken" not in types and "snapshot_skipped" not in types, types
    finished = [i for i, e in enumerate(events) if e["type"] == "pipeline_finished"]
    assert len(finished) == 1 and events[finished[0]]["status"] == "completed", events[finished[0]:]
    # Nothing between the pipeline's end and the run's but the run's own closing words.
    assert "run_finished" in types[finished[0]:], types[finished[0]:]
    said = [e for e in events if e["type"] == "notice" and NOTE in e["text"]]
    assert len(said) == 1 and said[0]["pipeline"] == "a", said
    assert proc.stdout.count(NOTE) == 1, proc.stdout


@pytest.mark.slow  # builds the task in the probe process (imports torch)
def test_check_says_once_that_a_task_without_val_data_is_not_validated(tmp_path: Path):
    report = check_config(write_config(tmp_path), probe=True, inventory=NO_GPU)
    assert report.ok, report.render()
    assert [line for line in report.lines if "val_data" in line] == [f"a: {NOTE}"], report.lines
