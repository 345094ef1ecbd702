"""Fault: the supervisor is SIGKILLed right after a pipeline reaches a final state. Step reports wait in a
buffer, but a final state is written to events.jsonl before anyone is told of it, so the file has it (and
every step before it) however soon the supervisor dies."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid

import pytest

from torchherd.engine.protocol.messages import PipelineFinished, StepMetrics
from torchherd.engine.serve.remote import RemoteRun
from torchherd.engine.serve.service import spawn
from tests.conftest import TASKS, still_alive
from tests.faults.support import records, write_toml

pytestmark = pytest.mark.slow

LONG = 180.0  # seconds: a loaded two-core machine is slow, not stuck


def _config(path):
    task = json.dumps(f"{TASKS / 'tiny.py'}:build")
    return write_toml(path, f"""
name = "final-{uuid.uuid4().hex[:8]}"
[defaults]
task = {task}
batch_size = 8
log_every_n_steps = 1
params = {{ samples = 64, delay = 0.001 }}

[[pipelines]]
name = "quick"  # ends while the other trains on
max_epochs = 2

[[pipelines]]
name = "long"
max_epochs = 1000

[devices]
placement = "cpu"
cpu_slots = 2

[validation]
mode = "off"

[telemetry]
enabled = false
""")


async def test_a_final_state_is_on_disk_before_a_client_hears_of_it(tmp_path):
    started = await asyncio.to_thread(spawn, config=_config(tmp_path / "final.toml"), runs_dir=tmp_path / "runs")
    run = await RemoteRun.connect(started.run_dir, read_only=True, history=False)
    heard = []
    try:
        async def until_final() -> None:
            async for event in run.subscribe(replay=False):
                heard.append(event)
                if isinstance(event, PipelineFinished) and event.pipeline == "quick":
                    os.kill(started.pid, signal.SIGKILL)  # at once: nothing more is written after this
                    return
        await asyncio.wait_for(until_final(), LONG)
    finally:
        await run.close()
        try:
            os.kill(started.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    workers = [r["pid"] for r in records(started.run_dir) if r["type"] == "worker_started"]
    assert not await asyncio.to_thread(still_alive, workers, 30.0), "workers outlived their supervisor"
    on_disk = records(started.run_dir)
    finals = [r for r in on_disk if r["type"] == "pipeline_finished"]
    assert [(r["pipeline"], r["status"]) for r in finals] == [("quick", "completed")]
    # Every step report the client heard before it is on disk too, before the final state, in the order heard.
    steps = [(e.pipeline, e.step) for e in heard if isinstance(e, StepMetrics)]
    assert steps, "no step was heard before the final state"
    before = on_disk[:on_disk.index(finals[0])]
    written = [(r["pipeline"], r["step"]) for r in before if r["type"] == "step"]
    assert written[-len(steps):] == steps
