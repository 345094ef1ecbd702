"""A failure a restart cannot fix ends the pipeline at once instead of burning the restart budget."""
from __future__ import annotations

import asyncio

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import Heartbeat, PipelineFinished, TrainingStarted, WorkerError, WorkerRestarting
from torchherd.engine.rundir.directory import read_events
from tests.conftest import TASKS, make_config
from tests.scripted import ScriptedLauncher, until
from torchherd.engine.supervise.supervisor import Supervisor


def scripted(tmp_path, **restart):
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False}, validation={"mode": "inline"},
                         restart={"min_uptime": 0.0, "backoff": 0.01, "max_restarts": 5, **restart})
    return Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005), launcher


def began(step: int = 0):
    return TrainingStarted(pipeline="a", epoch=0, step=step, epochs_total=1, steps_per_epoch=10, device="cpu",
                           parameters=1)


async def test_dying_before_the_first_step_is_a_failed_start_whatever_the_uptime(tmp_path):
    # Regression: importing torch outlasted min_uptime on a loaded machine, so workers that died at
    # their first step counted as ordinary crashes and used the whole budget, 30 s of output each.
    sup, launcher = scripted(tmp_path, min_uptime=0.0)
    stream = sup.subscribe()
    await sup.start()
    await until(lambda: launcher.handles)
    launcher.handles[0].exit(1, [began(), WorkerError(pipeline="a", error="OSError: disk", where="train", step=0)])
    restarting = await asyncio.wait_for(_first(stream, WorkerRestarting), 5)
    assert restarting.reason.startswith("failed start")
    await until(lambda: len(launcher.handles) == 2)
    # A worker that completed a step before dying is an ordinary crash.
    launcher.handles[1].exit(1, [began(), Heartbeat(pipeline="a", step=1),
                                 WorkerError(pipeline="a", error="OSError: disk again", where="train", step=1)])
    restarting = await asyncio.wait_for(_first(stream, WorkerRestarting), 5)
    assert restarting.reason.startswith("crashed")
    await sup.shutdown(graceful=False)


async def test_the_same_error_at_the_same_step_twice_ends_the_pipeline(tmp_path):
    sup, launcher = scripted(tmp_path, max_failed_starts=10)
    await sup.start()
    for n in (1, 2):
        await until(lambda: len(launcher.handles) == n)
        launcher.handles[-1].exit(1, [began(3), Heartbeat(pipeline="a", step=4),
                                      WorkerError(pipeline="a", error="ValueError: bad row 7", where="train",
                                                  step=4)])
    statuses = await asyncio.wait_for(sup.wait(), 5)
    assert statuses == {"a": "failed"} and len(launcher.handles) == 2
    [finished] = [e for e in read_events(sup.run_dir) if isinstance(e, PipelineFinished)]
    assert "ValueError: bad row 7" in finished.reason and "twice" in finished.reason
    await sup.shutdown(graceful=False)


async def test_the_same_error_reason_names_the_epoch_as_the_table_counts_it(tmp_path):
    # Regression: "the same error after step 4 twice in a row" while the table and the event said epoch 15 step
    # 4 (a script's step counter that starts over): the reason now names the epoch too.
    from torchherd.engine.protocol.messages import EpochEnd

    sup, launcher = scripted(tmp_path, max_failed_starts=10)
    await sup.start()
    for n in (1, 2):
        await until(lambda: len(launcher.handles) == n)
        launcher.handles[-1].exit(1, [began(0), EpochEnd(pipeline="a", epoch=13, step=4, train_loss=1.0, duration=1.0,
                                                         samples_per_s=None, epochs_total=0, steps_per_epoch=4),
                                      WorkerError(pipeline="a", error="ValueError: bad row 7", where="train", step=4)])
    await asyncio.wait_for(sup.wait(), 5)
    [finished] = [e for e in read_events(sup.run_dir) if isinstance(e, PipelineFinished)]
    assert finished.reason.startswith("the same error in epoch 15 after step 4 twice in a row"), finished.reason
    await sup.shutdown(graceful=False)


async def test_a_different_error_is_retried(tmp_path):
    sup, launcher = scripted(tmp_path, max_failed_starts=10)
    await sup.start()
    for n, error in ((1, "ValueError: bad row 7"), (2, "ValueError: bad row 9")):
        await until(lambda: len(launcher.handles) == n)
        launcher.handles[-1].exit(1, [began(), Heartbeat(pipeline="a", step=2),
                                      WorkerError(pipeline="a", error=error, where="train", step=2)])
    await until(lambda: len(launcher.handles) == 3)
    await sup.shutdown(graceful=False)


@pytest.mark.slow
async def test_a_shape_mismatch_fails_after_two_attempts_naming_the_shapes(tmp_path):
    config = make_config(tmp_path, [{"name": "m", "task": f"{TASKS / 'stubborn_builds.py'}:mismatched"}],
                         telemetry={"enabled": False}, validation={"mode": "inline"},
                         restart={"min_uptime": 0.0, "backoff": 0.05, "max_restarts": 3, "max_failed_starts": 5})
    sup = Supervisor(config)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"m": "failed"}
    events = read_events(sup.run_dir)
    assert len([e for e in events if isinstance(e, TrainingStarted)]) == 2
    [finished] = [e for e in events if isinstance(e, PipelineFinished)]
    assert "twice" in finished.reason
    errors = [e for e in events if isinstance(e, WorkerError)]
    assert "outputs float32 [32, 3]" in errors[0].error and "targets float32 [32, 1]" in errors[0].error


async def _first(stream, kind):
    async for event in stream:
        if isinstance(event, kind):
            return event
