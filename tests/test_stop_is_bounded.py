"""A graceful stop ends within the grace period whatever state the pipeline is in, and the run's last
event is always `run_finished`."""
from __future__ import annotations

import asyncio

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import SnapshotTaken, TrainingStarted, ValResult, WorkerStarted
from torchherd.engine.rundir.directory import read_records
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, wait_for
from tests.scripted import FakeHandle, ScriptedLauncher, until


@pytest.mark.slow
async def test_stopping_a_worker_that_is_still_building_ends_it_now(tmp_path):
    # Regression (soak, seed 2026): a pipeline stopped while STARTING stayed `stopping` until
    # stop_timeout (120 s), because a worker only hears Stop once it trains.
    config = make_config(tmp_path, [{"name": "b", "task": f"{TASKS / 'stubborn_builds.py'}:never_built",
                                     "params": {"release_file": str(tmp_path / "never")}}],
                         telemetry={"enabled": False}, validation={"mode": "inline"},
                         restart={"stop_timeout": 600.0, "kill_grace": 2.0})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        sup.stop()
        statuses = await asyncio.wait_for(sup.wait(), 30)  # far below stop_timeout
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"b": "stopped"}


class LateResults(FakeHandle):
    """A validator that takes a few looks to obey a stop, and delivers its last result as it exits."""

    def __init__(self, pid):
        super().__init__(pid)
        self.late = [ValResult(pipeline="a", epoch=0, step=5, metrics={"val_loss": 1.0}, mode="background", seq=1)]
        self.looks_left: int | None = None

    def send(self, command):
        super().send(command)
        self.looks_left = 5

    def poll(self):
        if self.looks_left is not None:
            self.looks_left -= 1
            if self.looks_left <= 0:
                self.code = 0
        return self.code

    def drain(self):
        out, self.late = self.late, []
        return out


async def test_results_that_arrive_while_the_session_ends_come_before_run_finished(tmp_path):
    # Regression (soak, under load): four val_result events were written after run_finished.
    launcher = ScriptedLauncher()
    launcher.make = lambda n: LateResults(n) if n == 0 else FakeHandle(10_000 + n)
    config = make_config(tmp_path, [{"name": "a"}], telemetry={"enabled": False},
                         validation={"mode": "background", "device": "cpu"})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=4), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    worker = launcher.handles[1]
    worker.on_events([TrainingStarted(pipeline="a", epoch=0, step=0, epochs_total=1, steps_per_epoch=9,
                                      device="cpu", parameters=1),
                      SnapshotTaken(pipeline="a", seq=1, epoch=0, step=5, slot=0, stall_ms=0.1, nbytes=8)])
    worker.send = lambda command: setattr(worker, "code", 10)  # it stops at once, with its checkpoint
    await sup.shutdown(graceful=True, timeout=1.0)  # the result for seq 1 comes only as the validator stops
    types = [r["type"] for r in read_records(sup.run_dir / "events.jsonl")]
    assert types[-1] == "run_finished" and "val_result" in types
    assert types.index("val_result") < types.index("run_finished")
