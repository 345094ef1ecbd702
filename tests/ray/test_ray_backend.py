"""The Ray backend end to end on a local two-node cluster: placement, completion, faults, commands."""
from __future__ import annotations

import asyncio
import re

import pytest

from torchherd.engine.messages import PipelineFinished, RunFinished
from torchherd.engine.rundir import read_events
from torchherd.engine.supervisor import Supervisor
from tests.ray.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def node_of(sup: Supervisor, name: str, attempt: int = 1) -> str:
    """The node a pipeline's attempt ran on, as its log's header names it."""
    log = (sup.run_dir / name / "log.txt").read_text()
    return re.search(rf"attempt {attempt} on (\S+) \(Ray\)", log).group(1)


async def test_pipelines_land_on_both_nodes_and_complete(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a"}, {"name": "b"}], cluster.address,
                        defaults={"max_epochs": 2}, validation={"mode": "inline"})
    sup = Supervisor(config)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"a": "completed", "b": "completed"}
    assert node_of(sup, "a") != node_of(sup, "b")
    events = read_events(sup.run_dir)
    assert isinstance(events[-1], RunFinished) and events[-1].ok
    assert "torchherd worker pid" in (sup.run_dir / "a" / "log.txt").read_text()
