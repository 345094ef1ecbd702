"""Gangs larger than any node of the test cluster: their ranks span nodes (the fewest that hold them), meet on
rank 0's node with torchrun's per-node variables, and a node that leaves restarts the whole gang, unspent."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchherd.engine.protocol.messages import Notice, PipelineFinished, StepMetrics, WorkerExited, WorkerStarted
from torchherd.engine.protocol.telemetry import TelemetrySnapshot
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.ray.conftest import ray_config
from tests.test_gangs import DDP_SCRIPT, EPOCH_LOSS, checksums

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def rank_node(run_dir: Path, name: str, rank: int, attempt: int = 1) -> str:
    """The node a rank's attempt ran on, as its log's header names it."""
    log = (run_dir / name / ("log.txt" if rank == 0 else f"log-rank{rank}.txt")).read_text()
    return re.search(rf"attempt {attempt} on (\S+) \(Ray\)", log).group(1)


async def test_a_four_rank_gang_spans_two_nodes_and_a_lost_node_restarts_it_without_spending_a_restart(
        tmp_path, cluster):
    # 2 slots a node: no node has room for 4 ranks, so they span both (2 + 2)
    config = ray_config(tmp_path, [{"name": "g", "ranks": 4, "max_epochs": 6,
                                    "params": {"samples": 512, "delay": 0.004}}], cluster.address,
                        devices={"cpu_slots": 4}, validation={"mode": "off"},
                        restart={"min_uptime": 0.0, "max_restarts": 0},
                        telemetry={"enabled": True, "interval": 0.3})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    extra = None
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "g", 120)
        assert len(started.pids) == 4
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "g", 120)
        # telemetry shows each rank on its own node: ranks 2 and 3 on the node that is not rank 0's
        # The other node's sampler actor reports its ranks; beside a CPU hog that took over a minute.
        snap = await wait_for(stream, lambda e: isinstance(e, TelemetrySnapshot)
                              and sum(p.pipeline.split("#")[0] == "g" for p in e.processes) == 4, 240)
        nodes = [rank_node(sup.run_dir, "g", r) for r in range(4)]
        assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
        shown = {p.pipeline: p.node for p in snap.processes if p.pipeline.split("#")[0] == "g"}
        assert shown["g#2"] == shown["g#3"] != shown["g"] == shown["g#1"]
        # The node of ranks 2 and 3, or of ranks 0 and 1 (the store's) when those share the head, which this
        # process needs: either way the gang has room on no node now, and waits.
        gone = next(n for n in cluster.list_all_nodes() if n is not cluster.head_node)
        lost = [r for r, node in enumerate(nodes) if node.endswith(gone.node_id[:6])]
        assert lost in ([0, 1], [2, 3]), (nodes, gone.node_id)
        cluster.remove_node(gone)
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited) and e.pipeline == "g", 120)
        assert exited.reason == "restarted"  # moved, not crashed: no restart spent (max_restarts is 0)
        await wait_for(stream, lambda e: isinstance(e, Notice) and "waiting for room" in e.text, 60)
        extra = cluster.add_node(num_cpus=2, num_gpus=1)  # room again, and the module's later tests want it
        again = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "g", 180)
        assert set(again.pids).isdisjoint(started.pids)
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), 300)
    finally:
        await sup.shutdown(graceful=False)
    assert extra is not None
    assert done.status == "completed" and sup.view("g").restarts == 0
    assert rank_node(sup.run_dir, "g", lost[0], attempt=2) != nodes[lost[0]]
    waited = [e for e in read_events(sup.run_dir) if isinstance(e, Notice) and "waiting for room" in e.text]
    assert len(waited) == 1  # said once, however long it waited (each look for room is a second apart)
    sums = checksums(sup.run_dir, "g")
    assert set(sums) == {0, 1, 2, 3} and len(set(sums.values())) == 1


async def test_an_unmodified_ddp_script_gang_spans_two_nodes_with_torchruns_per_node_variables(tmp_path, cluster):
    # One 2-thread slot a node: the 2 ranks must span both nodes
    config = ray_config(tmp_path, [{"name": "s", "ranks": 2, "script": DDP_SCRIPT,
                                    "args": ["--epochs", "2", "--samples", "256"], "metrics": EPOCH_LOSS}],
                        cluster.address, defaults={"task": None}, validation={"mode": "off"},
                        devices={"cpu_slots": 2, "threads_per_worker": 2})
    sup = Supervisor(config)
    await sup.start()
    try:
        import asyncio

        assert await asyncio.wait_for(sup.wait(), 240) == {"s": "completed"}
    finally:
        await sup.shutdown(graceful=False)
    assert rank_node(sup.run_dir, "s", 0) != rank_node(sup.run_dir, "s", 1)
    envs = {}
    for rank, log in enumerate(("log.txt", "log-rank1.txt")):
        line = re.search(r"torchrun env (.*)", (sup.run_dir / "s" / log).read_text()).group(1)
        envs[rank] = dict(kv.split("=", 1) for kv in line.split())
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"])
            for e in envs.values()] == [("0", "0", "1", "0", "2"), ("1", "0", "1", "1", "2")]
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"]  # rank 0's node
    sums = checksums(sup.run_dir, "s")
    assert set(sums) == {0, 1} and sums[0] == sums[1]
    assert [e.status for e in read_events(sup.run_dir) if isinstance(e, PipelineFinished)] == ["completed"]
