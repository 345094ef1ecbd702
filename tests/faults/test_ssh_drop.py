"""Fault: the SSH session drops (SIGHUP) or the run is told to end (SIGTERM) while the headless CLI trains.

SIGHUP ends only the CLI: the run's supervisor is a service of its own and training goes on, to be
attached to and stopped from another shell. SIGTERM to the CLI that started the run stops every pipeline
gracefully ('stop' checkpoints, run_finished all 'stopped', exit 3).
"""
from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys

import pytest
import torch

from tests.conftest import repo_env
from tests.faults.support import FAULTY, REPO, HeadlessCli, poll_until, wait_gone, write_toml

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


def torchherd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchherd", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=repo_env())


def steps(cli: HeadlessCli) -> int:
    return sum(r["type"] == "step" for r in cli.records())


def assert_goes_on_then_stops(cli: HeadlessCli) -> None:
    """The CLI has gone; the run trains on, `torchherd stop` from another shell stops it gracefully."""
    service = cli.service()
    assert service is not None and service.is_running()
    before = steps(cli)
    poll_until(lambda: steps(cli) > before + 3, 60, "steps after the hangup")  # a record every 10 steps
    stopped = torchherd("stop", str(cli.run_dir()))
    assert stopped.returncode == 0, stopped.stderr
    assert not wait_gone([service], 60), "the service did not end after the stop"
    assert_stopped_gracefully(cli, "requested")


def test_sighup_ends_only_the_client_and_training_goes_on(tmp_path):
    cli = start_and_wait_for_training(tmp_path)
    try:
        cli.signal(signal.SIGHUP)
        assert cli.proc.wait(30) == 0, cli.text()
        assert_goes_on_then_stops(cli)
    finally:
        leftovers = cli.cleanup()
    assert not leftovers


def test_sigterm_to_the_client_that_started_the_run_stops_it_gracefully(tmp_path):
    cli = start_and_wait_for_training(tmp_path)
    try:
        cli.signal(signal.SIGTERM)
        code = cli.proc.wait(60)
        assert code == 3, cli.text()
        assert_stopped_gracefully(cli, "SIGTERM")
        assert "stopping every pipeline gracefully (SIGTERM)" in cli.text()
    finally:
        leftovers = cli.cleanup()
    assert not leftovers


def test_sighup_with_the_terminal_gone_leaves_the_run_going(tmp_path):
    # A real SSH drop: the pty's master side goes away, then the session gets SIGHUP; every later write to
    # the terminal fails with EIO. The client ends and the run, in its own session, trains on.
    master, slave = pty.openpty()
    cli = start_and_wait_for_training(tmp_path, stdout=slave)
    try:
        os.close(slave)
        os.close(master)
        cli.signal(signal.SIGHUP)
        cli.proc.wait(30)
        assert_goes_on_then_stops(cli)
    finally:
        leftovers = cli.cleanup()
    assert not leftovers
