"""An elastic gang on two real GPUs (NCCL): a `ranks = "1:2"` gang whose rank 1 is SIGKILLed while a pipeline of
higher priority waits for a GPU finishes on one GPU from its checkpoint, as tests/test_elastic.py's CPU gang does
over gloo. Skipped without CUDA or with fewer than two GPUs.
"""
from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import wait_for
from tests.gpu.conftest import NO_CUDA, needs_gpus
from tests.gpu.test_gpus import gpu_config
from torchherd.engine.protocol.messages import CheckpointSaved, GangResized, PipelineFinished, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor

pytestmark = [pytest.mark.gpu, pytest.mark.slow, NO_CUDA, needs_gpus(2), pytest.mark.xdist_group("gpu")]


async def test_an_elastic_gang_on_two_gpus_loses_one_to_a_higher_priority_pipeline_and_finishes_on_one(tmp_path):
    config = gpu_config(tmp_path, [{"name": "g", "ranks": "1:2", "max_epochs": 4}], restart={"max_restarts": 1},
                        telemetry={"enabled": False}, devices={"placement": [0, 1]})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), 300)
        assert len(started.pids) == 2
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved), 300)
        sup.add_config(gpu_config(tmp_path, [{"name": "urgent", "priority": 1, "max_epochs": 1}],
                                  telemetry={"enabled": False}, devices={"placement": [0, 1]}))
        os.kill(started.pids[1], signal.SIGKILL)
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 600)
        assert done.status == "completed"
        await sup.wait()
    finally:
        await sup.shutdown()
    [resized] = [e for e in read_events(sup.run_dir) if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks) == (2, 1)
