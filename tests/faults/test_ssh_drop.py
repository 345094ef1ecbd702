"""Fault: the SSH session drops (SIGHUP) or the run is told to end (SIGTERM) while the headless CLI trains.

Every pipeline stops gracefully with a 'stop' checkpoint, events.jsonl ends with
run_finished whose statuses are all 'stopped', and the CLI exits 3.
"""
from __future__ import annotations

import os
import pty
import signal

import pytest
import torch

from tests.faults.support import FAULTY, HeadlessCli, write_toml

pytestmark = pytest.mark.slow

CONFIG = f"""
# Two pipelines that would train for minutes if nobody stopped them.
[defaults]
task = "{FAULTY}"
max_epochs = 100
batch_size = 32
params = {{ samples = 256, delay = 0.002 }}

[[pipelines]]
name = "first"
num_workers = 1  # a DataLoader worker too, which must not outlive the stop

[[pipelines]]
name = "second"

[devices]
placement = "cpu"
cpu_slots = 2

[telemetry]
enabled = false
"""

PIPELINES = {"first", "second"}


def start_and_wait_for_training(tmp_path, stdout=None) -> HeadlessCli:
    cli = HeadlessCli(write_toml(tmp_path / "long.toml", CONFIG), tmp_path / "runs", stdout=stdout)
    # A checkpoint of each exists, so the stop has something to keep and the worker is mid-training.
    cli.wait_records(lambda recs: {r["pipeline"] for r in recs if r["type"] == "epoch_end"} >= PIPELINES,
                     120, "an epoch of each pipeline")
    return cli


def assert_stopped_gracefully(cli: HeadlessCli, signame: str) -> None:
    records = cli.records()
    assert records[-1]["type"] == "run_finished", records[-3:]
    assert records[-1]["statuses"] == {"first": "stopped", "second": "stopped"}
    assert records[-1]["ok"] is False
    for name in PIPELINES:
        saved = [r for r in records if r["type"] == "checkpoint_saved" and r["pipeline"] == name
                 and r["reason"] == "stop"]
        assert len(saved) == 1, f"{name}: no stop checkpoint"
        state = torch.load(saved[0]["path"], weights_only=False)
        assert state["step"] == saved[0]["step"] > 0
        exited = [r for r in records if r["type"] == "worker_exited" and r["pipeline"] == name]
        assert [(r["exit_code"], r["reason"]) for r in exited] == [(10, "stopped")]
        finished = [r for r in records if r["type"] == "pipeline_finished" and r["pipeline"] == name]
        assert finished[0]["status"] == "stopped" and finished[0]["reason"] == signame


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_signal_stops_every_pipeline_gracefully(tmp_path, sig):
    cli = start_and_wait_for_training(tmp_path)
    try:
        cli.signal(sig)
        code = cli.proc.wait(60)
        assert code == 3, cli.text()
        assert_stopped_gracefully(cli, sig.name)
        assert f"{sig.name}: stopping every pipeline gracefully" in cli.text()
    finally:
        leftovers = cli.cleanup()
    assert not leftovers


def test_sighup_with_the_terminal_gone_still_stops_gracefully(tmp_path):
    # A real SSH drop: the pty's master side goes away, then the session gets SIGHUP.
    # Every later write to the terminal fails with EIO. Regression: the printer's OSError used to end
    # run_headless early, and its shutdown(graceful=False) killed the workers instead of stopping them.
    master, slave = pty.openpty()
    cli = start_and_wait_for_training(tmp_path, stdout=slave)
    try:
        os.close(slave)
        os.close(master)
        cli.signal(signal.SIGHUP)
        code = cli.proc.wait(60)
        assert_stopped_gracefully(cli, "SIGHUP")
        assert code == 3
    finally:
        leftovers = cli.cleanup()
    assert not leftovers
