"""Fault: the supervisor process dies (SIGKILL): every worker follows it within 5 s, their DataLoader workers soon after.

Workers ask for a parent-death signal and also exit on the control pipe's EOF; the
headless CLI runs in a session of its own here, as it would under nohup or tmux.
"""
from __future__ import annotations

import signal
import time

import pytest

from tests.faults.support import FAULTY, HeadlessCli, is_alive, tree, write_toml

pytestmark = pytest.mark.slow

CONFIG = f"""
# Two long pipelines; "loader" has a DataLoader worker process of its own.
[defaults]
task = "{FAULTY.replace(chr(92), '/')}"
max_epochs = 100
batch_size = 32
params = {{ samples = 256, delay = 0.002 }}

[[pipelines]]
name = "loader"
num_workers = 1

[[pipelines]]
name = "plain"

[devices]
placement = "cpu"
cpu_slots = 2

[telemetry]
enabled = false
"""

def workers(recs: list[dict]) -> dict[str, int]:
    return {r["pipeline"]: r["pid"] for r in recs if r["type"] == "worker_started"}


DEADLINE = 5.0  # seconds the workers may take to follow the supervisor
# DataLoader workers have no parent-death signal of their own: torch's watchdog in them notices the dead
# worker at their next index-queue timeout (torch.utils.data's MP_STATUS_CHECK_INTERVAL, 5 s), so they may
# take that much longer. With only DEADLINE they outlived it under load (an xdist run at load 7).
LOADER_DEADLINE = DEADLINE + 5.0


def test_sigkilled_supervisor_takes_every_worker_and_loader_with_it(tmp_path):
    cli = HeadlessCli(write_toml(tmp_path / "two.toml", CONFIG), tmp_path / "runs")
    try:
        started = cli.wait_records(lambda recs: len(workers(recs)) == 2 and workers(recs), 120,
                                   "both workers to start")
        # Training has begun once a step is reported; by then the DataLoader worker exists.
        cli.wait_records(lambda recs: {r["pipeline"] for r in recs if r["type"] == "step"} >= {"loader", "plain"},
                         60, "both pipelines to report a step")
        procs = tree(cli.proc.pid)[1:]
        pids = {p.pid for p in procs}
        assert set(started.values()) <= pids, f"workers {started} are not all under the CLI: {pids}"
        loader_children = [p for p in tree(started["loader"])[1:]]
        assert loader_children, "the num_workers=1 pipeline has no DataLoader worker"
        cli.known = procs

        cli.signal(signal.SIGKILL)
        cli.proc.wait(10)
        died = time.monotonic()
        loaders = {p.pid for p in loader_children}
        for group, deadline in (([p for p in procs if p.pid not in loaders], DEADLINE),
                                (loader_children, LOADER_DEADLINE)):
            left = [p for p in group if is_alive(p)]
            while left and time.monotonic() < died + deadline:
                time.sleep(0.05)
                left = [p for p in left if is_alive(p)]
            described = [f"{p.pid} {' '.join(p.cmdline()[:3])}" for p in left if is_alive(p)]
            assert not described, f"still alive {deadline:g}s after the supervisor died: {described}"
    finally:
        leftovers = cli.cleanup()
    assert not leftovers
