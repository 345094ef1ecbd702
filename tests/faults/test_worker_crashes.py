"""Fault: a worker crashes (exception, SIGKILL from outside, SIGSEGV, CUDA OOM) or crashes every attempt.

One run holds one pipeline per kind of crash beside a calm one: each crash is
reported with its cause, the pipeline restarts from its checkpoint and completes
(the crash loop fails once it repeats itself), and the calm pipeline is not
touched by any of it.
"""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, PipelineFinished, Resumed, WorkerError, WorkerExited,
                             WorkerRestarting, WorkerStarted)
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.faults.support import faulty_config, finish, of, run_events, supervised

# One xdist worker for the whole file: its tests share one module-scoped run (--dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_worker_crashes")]

EPOCHS = 3
ONCE = ("raise", "segv", "oom")  # pipelines named after the fault they hit once, at forward call 12


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory):
    """Run every crash kind at once; returns (supervisor, events, pid killed from outside)."""
    tmp = tmp_path_factory.mktemp("crashes")
    data = {"samples": 256, "delay": 0.002}  # 8 steps an epoch; call 12 is in epoch 1, after a checkpoint
    pipelines = [{"name": f, "params": {**data, "fault": f, "fault_at_call": 12, "once_file": str(tmp / f)}}
                 for f in ONCE]
    pipelines += [{"name": "sigkill", "params": data},
                  {"name": "loop", "params": {**data, "fault": "raise", "fault_at_call": 3}},
                  {"name": "calm", "params": data}]
    config = faulty_config(tmp, pipelines, defaults={"max_epochs": EPOCHS}, devices={"cpu_slots": len(pipelines)},
                           restart={"min_uptime": 0.0, "max_restarts": 2})
    sup = Supervisor(config)

    async def go():
        async with supervised(sup) as stream:
            started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "sigkill")
            await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.pipeline == "sigkill"
                                                   and e.reason == "epoch")
            os.kill(started.pid, signal.SIGKILL)
            statuses = await finish(sup, timeout=150)
        return started.pid, statuses

    killed_pid, statuses = asyncio.run(go())
    assert statuses == {"raise": "completed", "segv": "completed", "oom": "completed", "sigkill": "completed",
                        "loop": "failed", "calm": "completed"}
    return sup, run_events(sup), killed_pid


def assert_restarted_once_and_completed(events, name: str) -> None:
    assert [e.attempt for e in of(events, WorkerStarted, name)] == [1, 2]
    restarting = of(events, WorkerRestarting, name)
    assert len(restarting) == 1 and restarting[0].attempt == 2
    resumed = of(events, Resumed, name)
    assert len(resumed) == 1 and resumed[0].epoch >= 1  # from its checkpoint, not from scratch
    assert of(events, EpochEnd, name)[-1].epoch == EPOCHS - 1
    assert of(events, PipelineFinished, name)[0].status == "completed"


def test_python_exception(crash_run):
    sup, events, _ = crash_run
    crash = of(events, WorkerExited, "raise")[0]
    assert crash.reason == "crashed" and crash.exit_code == 1 and crash.signal == ""
    error = of(events, WorkerError, "raise")[0]
    assert error.error == "RuntimeError: faulty task exploded on purpose" and error.where == "train"
    assert "Traceback" in error.traceback and "faulty.py" in error.traceback
    assert crash.error == error.error and crash.traceback == error.traceback
    assert_restarted_once_and_completed(events, "raise")


def test_sigkill_from_outside(crash_run):
    sup, events, killed_pid = crash_run
    crash = of(events, WorkerExited, "sigkill")[0]
    assert crash.pid == killed_pid and crash.reason == "crashed"
    assert crash.signal == "SIGKILL" and crash.exit_code is None and crash.error == "killed by SIGKILL"
    assert_restarted_once_and_completed(events, "sigkill")


def test_segfault_leaves_its_stack_in_the_log(crash_run):
    sup, events, _ = crash_run
    crash = of(events, WorkerExited, "segv")[0]
    assert crash.reason == "crashed" and crash.signal == "SIGSEGV" and crash.exit_code is None
    assert crash.error == "killed by SIGSEGV"
    log = (sup.run_dir / "segv" / "log.txt").read_text()
    assert "Fatal Python error: Segmentation fault" in log
    assert "faulty.py" in log.split("Fatal Python error")[1]  # faulthandler's stack names the culprit
    assert_restarted_once_and_completed(events, "segv")


def test_cuda_oom_is_named_as_such(crash_run):
    sup, events, _ = crash_run
    crash = of(events, WorkerExited, "oom")[0]
    assert crash.reason == "crashed" and crash.exit_code == 1
    error = of(events, WorkerError, "oom")[0]
    assert "torch.OutOfMemoryError: CUDA out of memory" in error.traceback  # the real type was raised
    # ... and the worker named it as an OOM, not as "OutOfMemoryError: ..." like any other exception
    assert error.error.startswith("CUDA out of memory"), error.error
    assert "Tried to allocate 20.00 GiB" in error.error and crash.error == error.error
    assert "CUDA out of memory" in of(events, WorkerRestarting, "oom")[0].reason
    assert_restarted_once_and_completed(events, "oom")


def test_a_crash_that_repeats_at_the_same_step_fails_at_once(crash_run):
    # The same exception at the same step twice in a row is deterministic: a third attempt (and the
    # rest of the budget) would only repeat it. The budget itself is covered by the scripted tests.
    sup, events, _ = crash_run
    assert [e.attempt for e in of(events, WorkerStarted, "loop")] == [1, 2]
    assert [e.restarts_left for e in of(events, WorkerRestarting, "loop")] == [1]
    assert all(e.exit_code == 1 and e.reason == "crashed" for e in of(events, WorkerExited, "loop"))
    final = of(events, PipelineFinished, "loop")[0]
    assert final.status == "failed"
    assert "RuntimeError: faulty task exploded on purpose" in final.reason and "twice in a row" in final.reason


def test_the_calm_pipeline_is_untouched(crash_run):
    sup, events, _ = crash_run
    name = "calm"
    assert len(of(events, WorkerStarted, name)) == 1
    assert [e.epoch for e in of(events, EpochEnd, name)] == list(range(EPOCHS))
    assert not of(events, WorkerError, name) and not of(events, WorkerRestarting, name)
    assert not of(events, Resumed, name)
    exits = of(events, WorkerExited, name)
    assert len(exits) == 1 and exits[0].exit_code == 0 and exits[0].reason == "completed"
    assert of(events, PipelineFinished, name)[0].status == "completed"
