"""Fault: bad user code and data: a task file that does not parse, a factory that raises or returns the
wrong thing, a loss that turns NaN under each nan_policy.

The run goes on around them; each is reported with the pipeline's name and the cause,
in the events and in the lines the headless CLI prints from them.
"""
from __future__ import annotations

import asyncio
import io

import pytest

from torchherd.engine.protocol.messages import (EpochEnd, Notice, PipelineFinished, Resumed, WorkerError, WorkerExited,
                             WorkerRestarting, WorkerStarted)
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS
from tests.faults.support import faulty_config, finish, of, run_events, supervised
from torchherd.tui.headless import LinePrinter

# One xdist worker for the whole file: its tests share one module-scoped run (--dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_bad_user_code")]

EPOCHS = 3
FATAL = {  # pipeline -> (task, words its failure must carry)
    "syntax": (f"{TASKS / 'bad_syntax.py'}:build", ["syntax error in", "bad_syntax.py", "line 1"]),
    "wrong": (f"{TASKS / 'wrong_return.py'}:build", ["returned dict", "must return torchherd.Task"]),
    "raises": (f"{TASKS / 'factory_raises.py'}:build", ["ValueError: no data at /nonexistent/path"]),
}


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    data = {"samples": 256, "delay": 0.002}  # 8 steps an epoch; call 12 is in epoch 1, after a checkpoint
    pipelines = [{"name": name, "task": task} for name, (task, _) in FATAL.items()]
    pipelines += [{"name": f"nan_{policy}", "nan_policy": policy,
                   "params": {**data, "fault": "nan", "fault_at_call": 12, "once_file": str(tmp / policy)}}
                  for policy in ("warn", "stop", "restart")]
    pipelines += [{"name": "calm", "params": data}]
    config = faulty_config(tmp, pipelines, defaults={"max_epochs": EPOCHS}, devices={"cpu_slots": len(pipelines)},
                           restart={"min_uptime": 0.0})
    sup = Supervisor(config)

    async def go():
        async with supervised(sup):
            return await finish(sup, timeout=150)

    statuses = asyncio.run(go())
    assert statuses == {"syntax": "failed", "wrong": "failed", "raises": "failed", "nan_warn": "completed",
                        "nan_stop": "failed", "nan_restart": "completed", "calm": "completed"}
    events = run_events(sup)
    out = io.StringIO()
    printer = LinePrinter(out)
    for event in events:
        printer.handle(event)
    return sup, events, out.getvalue().splitlines()


def said(lines: list[str], pipeline: str, *words: str) -> list[str]:
    """The printed lines about `pipeline` that carry every one of `words`."""
    return [line for line in lines if f"] {pipeline}: " in line and all(w in line for w in words)]


@pytest.mark.parametrize("name", list(FATAL))
def test_a_task_that_cannot_be_built_fails_once_with_the_cause(bad_run, name):
    sup, events, lines = bad_run
    words = FATAL[name][1]
    error = of(events, WorkerError, name)
    assert len(error) == 1 and error[0].where == "build" and all(w in error[0].error for w in words), error
    exited = of(events, WorkerExited, name)
    assert len(exited) == 1 and exited[0].exit_code == 11 and exited[0].reason == "failed"  # not restarted
    final = of(events, PipelineFinished, name)[0]
    assert final.status == "failed" and all(w in final.reason for w in words), final.reason
    assert said(lines, name, "error during build", *words)
    assert said(lines, name, "failed", *words)


def test_nan_with_policy_warn_is_a_notice_and_training_goes_on(bad_run):
    sup, events, lines = bad_run
    notices = [e for e in of(events, Notice, "nan_warn") if "nan" in e.text.lower()]
    assert notices and notices[0].level == "warning" and "training loss is nan" in notices[0].text
    assert len(of(events, WorkerStarted, "nan_warn")) == 1
    assert [e.epoch for e in of(events, EpochEnd, "nan_warn")] == list(range(EPOCHS))
    assert of(events, PipelineFinished, "nan_warn")[0].status == "completed"
    assert said(lines, "nan_warn", "warning", "training loss is nan")


def test_nan_with_policy_stop_fails_the_pipeline_naming_nan(bad_run):
    sup, events, lines = bad_run
    assert len(of(events, WorkerStarted, "nan_stop")) == 1
    final = of(events, PipelineFinished, "nan_stop")[0]
    assert final.status == "failed" and "NonFiniteLoss" in final.reason and "loss is nan" in final.reason
    assert of(events, WorkerExited, "nan_stop")[0].exit_code == 11
    assert said(lines, "nan_stop", "failed", "loss is nan")


def test_nan_with_policy_restart_restarts_from_the_last_checkpoint(bad_run):
    sup, events, lines = bad_run
    assert [e.attempt for e in of(events, WorkerStarted, "nan_restart")] == [1, 2]
    restarting = of(events, WorkerRestarting, "nan_restart")
    assert len(restarting) == 1 and "loss is nan" in restarting[0].reason
    resumed = of(events, Resumed, "nan_restart")
    assert len(resumed) == 1 and resumed[0].epoch >= 1 and resumed[0].path.endswith("last.pt")
    assert of(events, PipelineFinished, "nan_restart")[0].status == "completed"
    assert said(lines, "nan_restart", "restarting")


def test_the_calm_pipeline_is_untouched(bad_run):
    sup, events, _ = bad_run
    assert len(of(events, WorkerStarted, "calm")) == 1 and not of(events, WorkerError, "calm")
    assert [e.epoch for e in of(events, EpochEnd, "calm")] == list(range(EPOCHS))
    assert of(events, PipelineFinished, "calm")[0].status == "completed"
