"""Fault: the supervisor process dies (SIGKILL): every worker, with its DataLoader workers, its script and
whatever the script started, follows it within seconds.

Workers ask for a parent-death signal, on which they kill their process group, and also exit on the control
pipe's EOF. The supervisor is the run's
service, in a session of its own; both clients attached to it say the run was cut short, `torchherd ls`
says it is resumable, and its control socket is cleaned up.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from torchherd.engine.serve.runtime import read_control
from tests.conftest import repo_env
from tests.faults.support import FAULTY, REPO, HeadlessCli, is_alive, tree, write_toml


def torchherd(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torchherd", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env=repo_env(), **kw)

pytestmark = pytest.mark.slow

CONFIG = f"""
# Two long pipelines; "loader" has a DataLoader worker process of its own, "plain" a script with children.
[defaults]
task = "{FAULTY.replace(chr(92), '/')}"
max_epochs = 100
batch_size = 32
params = {{ samples = 256, delay = 0.002 }}

[[pipelines]]
name = "loader"
num_workers = 1

[[pipelines]]
name = "plain"  # a script of the user's own that starts two long-lived processes of its own
script = "{(REPO / 'tests' / 'tasks' / 'scripts' / 'plain_loop.py').as_posix()}"
args = ["--epochs", "100000", "--delay", "0.05", "--children", "2"]
metrics = 'Epoch (?P<epoch>\\d+), Loss: (?P<loss>[-+.\\deE]+)'

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
        service = cli.service()
        procs = tree(service.pid)[1:]
        pids = {p.pid for p in procs}
        assert set(started.values()) <= pids, f"workers {started} are not all under the supervisor: {pids}"
        loader_children = [p for p in tree(started["loader"])[1:]]
        assert loader_children, "the num_workers=1 pipeline has no DataLoader worker"
        assert len(tree(started["plain"])) >= 4, "the script and its two children are not under its worker"
        cli.known = procs
        run_dir = cli.run_dir()
        control = read_control(run_dir)
        assert control is not None and control.socket.exists()
        second = torchherd("attach", str(run_dir), "--headless", "--from-start")
        opening = second.stdout.readline()  # once it has attached: which run, what Ctrl-C does to it
        assert opening.startswith(f"torchherd: following run {run_dir.name} ") and "Ctrl-C stops" in opening, opening
        first_line = second.stdout.readline()  # the run's first event
        assert first_line.startswith("[") and " run " in first_line, first_line

        service.send_signal(signal.SIGKILL)
        died = time.monotonic()
        for client in (cli.proc, second):
            assert client.wait(30) == 1
        assert "the run was cut short" in cli.text() and "the run was cut short" in second.stdout.read()
        loaders = {p.pid for p in loader_children}
        for group, deadline in (([p for p in procs if p.pid not in loaders], DEADLINE),
                                (loader_children, LOADER_DEADLINE)):
            left = [p for p in group if is_alive(p)]
            while left and time.monotonic() < died + deadline:
                time.sleep(0.05)
                left = [p for p in left if is_alive(p)]
            described = [f"{p.pid} {' '.join(p.cmdline()[:3])}" for p in left if is_alive(p)]
            assert not described, f"still alive {deadline:g}s after the supervisor died: {described}"
        listed = subprocess.run([sys.executable, "-m", "torchherd", "ls", "--json", "--runs-dir", str(cli.runs_dir)],
                                capture_output=True, text=True, cwd=REPO, env=repo_env())
        [run] = json.loads(listed.stdout)
        assert (run["live"], run["state"], run["resumable"]) == (False, "cut short, resumable", True)
        assert not control.socket.exists() and read_control(run_dir) is None  # cleaned up on sight
    finally:
        leftovers = cli.cleanup()
    assert not leftovers
