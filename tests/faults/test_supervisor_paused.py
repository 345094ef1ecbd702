"""Fault: the supervisor itself stops running for a while (SIGSTOP, a swapping machine, a long GC).

Its worker trains on and its reports wait unread in its channel; so do the validator's scores. On waking, the
supervisor reads them before it judges anyone's silence, and the time it was stopped is no worker's silence:
the healthy worker is neither killed as hung nor flagged, no "validator behind" alert goes out, and it completes.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import TASKS
from tests.faults.support import poll_until, records, wait_gone, write_toml
from tests.test_service import LONG, of_type, service_of, stop_service
from torchherd.engine.serve.service import spawn
from torchherd.engine.worker import checkpoint as ckpt

pytestmark = pytest.mark.slow

HANG_TIMEOUT = 3.0  # seconds
EPOCHS_PAUSED = 6  # epochs the worker finishes while its supervisor is stopped: over 2x HANG_TIMEOUT (see below)
# 8 steps of 8 items, each item sleeping 20 ms: a step every 0.16 s at most, an epoch 1.28 s at least; the
# epochs before the pause wait for the validator's first score (importing torch on a loaded machine)
PARAMS = {"samples": 64, "delay": 0.02}


def steady_config(path: Path) -> Path:
    lines = [f'name = "paused-{uuid.uuid4().hex[:8]}"', "[defaults]", f'task = "{TASKS / "tiny.py"}:build"',
             "max_epochs = 30", "batch_size = 8",
             "params = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in PARAMS.items()) + " }",
             "[[pipelines]]", 'name = "steady"',
             "[validation]", 'mode = "background"', 'device = "cpu"',
             # stall_warning at hang_timeout: a stall flagged is then a hang too, never a flake of its own
             "[restart]", f"hang_timeout = {HANG_TIMEOUT}", f"stall_warning = {HANG_TIMEOUT}",
             "start_timeout = 120.0", "max_restarts = 0",
             "[devices]", 'placement = "cpu"', "cpu_slots = 1", "[telemetry]", "enabled = false"]
    return write_toml(path, "\n".join(lines) + "\n")


def stamp(path: Path) -> tuple[int, int] | None:
    """Which version of a checkpoint is there (it is replaced whole each time it is written)."""
    with contextlib.suppress(FileNotFoundError):
        st = path.stat()
        return st.st_ino, st.st_mtime_ns
    return None


def epochs_while_stopped(last: Path, at_least: int) -> None:
    """Wait until the worker has written its 'last' checkpoint `at_least` more times: it trained on for at least
    that many whole epochs (the worker's own work, not the supervisor's, which is stopped)."""
    seen = [stamp(last)]

    def more() -> bool:
        now = stamp(last)
        if now != seen[-1]:
            seen.append(now)
        return len(seen) > at_least
    poll_until(more, LONG, f"{at_least} epochs of the worker while its supervisor is stopped", interval=0.02)


# Regression: a supervisor stopped past hang_timeout judged its healthy worker hung on waking, before reading the
# reports waiting in its channel; it dumped its stacks, SIGTERMed it (exit reason `hung`) and raised a false
# "validator behind" alert.
@pytest.mark.timeout(900)
def test_a_supervisor_stopped_past_hang_timeout_kills_no_healthy_worker_and_raises_no_alert(tmp_path):
    started = spawn(config=steady_config(tmp_path / "steady.toml"), runs_dir=tmp_path / "runs")
    run_dir = started.run_dir
    service = service_of(run_dir)
    stopped_at = resumed_at = 0.0
    try:
        # Scored once: the validator is up, so snapshots it has not scored count as its lag from here on.
        poll_until(lambda: of_type(records(run_dir), "val_result", pipeline="steady"), LONG, "a first score")
        assert not of_type(records(run_dir), "run_finished"), "the run ended before the test could stop it"
        stopped_at = time.time()
        os.kill(service.pid, signal.SIGSTOP)
        epochs_while_stopped(run_dir / "steady" / "checkpoints" / ckpt.LAST, EPOCHS_PAUSED)
        resumed_at = time.time()
        os.kill(service.pid, signal.SIGCONT)
        assert not wait_gone([service], LONG), "the service did not end when its run completed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(service.pid, signal.SIGCONT)  # a stopped service could not even stop
        stop_service(run_dir)
    recs = records(run_dir)
    assert recs[-1]["type"] == "run_finished" and recs[-1]["statuses"] == {"steady": "completed"}, recs[-6:]
    # It trained on while stopped: its step reports of then waited in its channel and were all read.
    assert [r for r in of_type(recs, "step", pipeline="steady") if stopped_at < r["time"] < resumed_at]
    assert not of_type(recs, "worker_state", pipeline="steady", state="hung")
    assert [r["reason"] for r in of_type(recs, "worker_exited", pipeline="steady")] == ["completed"]
    assert len(of_type(recs, "worker_started", pipeline="steady")) == 1
    assert not [r for r in of_type(recs, "stalled", pipeline="steady") if r["quiet"] > 0 and r["time"] > stopped_at]
    assert not [(r["rule"], r["message"]) for r in of_type(recs, "alert") if r["time"] > stopped_at]
