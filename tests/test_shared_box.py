"""Many runs on one box: runs started separately grant their CPU slots from one ledger, never run more workers
than there are slots, say what their queued pipelines wait for, and a SIGKILLed run's slots free at once.

Real CLIs (`torchherd run CONFIG --headless`, each with its service in a session of its own), real workers,
real lease files; the test's own ledger folder (conftest's `private_ledger`) is the box's.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import TASKS, REPO, repo_env
from tests.faults.support import HeadlessCli, poll_until, records, write_toml

pytestmark = pytest.mark.slow
LONG = 240.0  # seconds: a deadline, not an expectation (four runs queue on two cores)


def config(path: Path, pipelines: list[str], slots: int = 2, epochs: int = 2, delay: float = 0.002) -> Path:
    """A config of `pipelines` on the tiny task, each training `epochs` short epochs, on `slots` CPU slots."""
    lines = [f'name = "box-{uuid.uuid4().hex[:6]}"', "[defaults]", f'task = "{TASKS / "tiny.py"}:build"',
             f"max_epochs = {epochs}", "batch_size = 32", f"params = {{ samples = 256, delay = {delay} }}"]
    for name in pipelines:
        lines += ["[[pipelines]]", f'name = "{name}"']
    lines += ["[devices]", 'placement = "cpu"', f"cpu_slots = {slots}", "[validation]", 'mode = "off"',
              "[telemetry]", "enabled = false"]
    return write_toml(path, "\n".join(lines) + "\n")


def worker_pids(run_dirs: list[Path]) -> set[int]:
    return {pid for d in run_dirs for r in records(d) if r.get("type") == "worker_started"
            for pid in (r.get("pids") or [r["pid"]])}


def running(pids: set[int]) -> int:
    """How many of `pids` are live processes now (a reaped or zombie worker is not)."""
    count = 0
    for pid in pids:
        try:
            count += psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass
    return count


@pytest.mark.parametrize("count", [2, 4])
def test_runs_started_separately_never_run_more_workers_than_slots(tmp_path, count):
    clis = [HeadlessCli(config(tmp_path / f"r{i}.toml", [f"r{i}a", f"r{i}b"]), tmp_path / f"runs{i}")
            for i in range(count)]
    most = 0
    try:
        def sample() -> bool:  # every CLI has exited (its run finished), counting live workers meanwhile
            nonlocal most
            dirs = [d for d in (c.run_dir() for c in clis) if d is not None]
            most = max(most, running(worker_pids(dirs)))
            return all(c.proc.poll() is not None for c in clis)
        poll_until(sample, LONG, f"{count} runs to finish", interval=0.02)
        assert [c.proc.returncode for c in clis] == [0] * count, "\n".join(c.text() for c in clis)
    finally:
        left = [p for c in clis for p in c.cleanup()]
    assert not left, f"processes left behind: {left}"
    assert 1 <= most <= 2  # two slots on the box, whatever the number of runs
    dirs = [c.run_dir() for c in clis]
    finished = [r for d in dirs for r in records(d) if r.get("type") == "pipeline_finished"]
    assert sorted(r["status"] for r in finished) == ["completed"] * (2 * count)
    # Someone waited, and said for which other run's pipelines
    waits = [(d.name, r["why"]) for d in dirs for r in records(d) if r.get("type") == "pipeline_waiting"]
    others = {d.name for d in dirs}
    assert any(f"held by run {other} (you)" in why for run, why in waits for other in others - {run}), waits


def test_a_sigkilled_runs_slot_goes_to_the_run_waiting_for_it(tmp_path):
    holder = HeadlessCli(config(tmp_path / "holder.toml", ["hold"], slots=1, epochs=100_000), tmp_path / "runs-a")
    waiter = None
    try:
        holder.wait_records(lambda recs: any(r["type"] == "step" for r in recs), LONG, "the holder to train")
        waiter = HeadlessCli(config(tmp_path / "waiter.toml", ["wait"], slots=1), tmp_path / "runs-b")
        held_by = holder.run_dir().name
        waiter.wait_records(lambda recs: any(r["type"] == "pipeline_waiting" and held_by in r["why"] for r in recs),
                            LONG, "the waiter to say what it waits for")
        [wait] = [r for r in waiter.records() if r["type"] == "pipeline_waiting"]
        assert wait["why"] == f"waiting for 1 CPU slot: cpu0 held by run {held_by} (you)"
        listed = subprocess.run([sys.executable, "-m", "torchherd", "ls", "--runs-dir", str(tmp_path / "runs-b")],
                                capture_output=True, text=True, cwd=REPO, env=repo_env(), timeout=120)
        assert f"  cpu0  run {held_by}  hold" in listed.stdout, listed.stdout
        assert f"  run {waiter.run_dir().name}  wait: waiting for 1 CPU slot" in listed.stdout, listed.stdout
        shown = json.loads(subprocess.run(
            [sys.executable, "-m", "torchherd", "ls", "--json", "--runs-dir", str(tmp_path / "runs-a")],
            capture_output=True, text=True, cwd=REPO, env=repo_env(), timeout=120).stdout)
        by_run = {r["run_id"]: r for r in shown}  # every live run of the user's, the waiter too
        assert by_run[held_by]["devices"] == [{"device": "cpu0", "pipeline": "hold", "rank": 0, "memory": None}]
        assert by_run[waiter.run_dir().name]["waiting"] == {"wait": wait["why"]}
        holder.kill_supervisor()  # its lease's lock dies with it: the waiter's next grant finds the slot free
        waiter.wait_records(lambda recs: any(r["type"] == "worker_started" for r in recs), LONG,
                            "the waiter to start on the freed slot")
        assert waiter.proc.wait(LONG) == 0, waiter.text()
    finally:
        left = holder.cleanup() + (waiter.cleanup() if waiter is not None else [])
    assert not left, f"processes left behind: {left}"
