"""A DDP gang on the test cluster: its ranks share one node, meet on its address, and restart as one."""
from __future__ import annotations

import os
import signal

import pytest

from torchherd.engine.launch import gang
from torchherd.engine.protocol.messages import PipelineFinished, StepMetrics, WorkerExited, WorkerStarted
from torchherd.engine.launch.ray.gang import rendezvous
from torchherd.engine.launch.ray.placement import cluster_inventory, read_nodes
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import still_alive, wait_for
from tests.ray.conftest import ray, ray_config
from tests.test_gangs import checksums

pytestmark = [pytest.mark.ray, pytest.mark.slow]


async def test_a_gang_trains_on_one_node_and_a_killed_rank_restarts_it_until_it_completes(tmp_path, cluster):
    # Two CPU slots per node (head, other, head, other): a gang of 2 gets both of one node's.
    config = ray_config(tmp_path, [{"name": "g", "ranks": 2, "max_epochs": 4,
                                    "params": {"samples": 256, "delay": 0.004}}], cluster.address,
                        devices={"cpu_slots": 4}, validation={"mode": "off"}, restart={"min_uptime": 0.0})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "g", 120)
        assert len(started.pids) == 2 and all(started.pids)  # each rank's child, read once its actor started it
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "g", 120)
        os.kill(started.pids[1], signal.SIGKILL)  # rank 1's child, not its actor
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited), 60)
        assert (exited.rank, exited.signal, exited.reason) == (1, "SIGKILL", "crashed")
        assert not still_alive(list(started.pids), timeout=15.0)  # rank 0 was not left in a collective
        again = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "g", 120)
        assert set(again.pids).isdisjoint(started.pids)
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), 180)
        assert done.status == "completed" and done.step == 4 * 4  # 256 samples, 2 ranks of 32: 4 steps an epoch
    finally:
        await sup.shutdown(graceful=False)
    sums = checksums(sup.run_dir, "g")
    assert set(sums) == {0, 1} and sums[0] == sums[1]


def test_a_gang_on_another_node_meets_on_that_nodes_address_and_a_port_it_named(cluster):
    nodes = read_nodes(ray.nodes())
    here = ray.get_runtime_context().get_node_id()
    [other] = [n for n in nodes if n.node_id != here]
    # A Ray worker on that node first: its cold start beside a CPU hog can outlast RENDEZVOUS_WAIT, which is
    # about a node that does not answer, not about how fast Ray starts a worker.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    warm = ray.remote(num_cpus=0)(lambda: None).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(other.node_id, soft=False)).remote()
    ray.get(warm, timeout=240)
    addr, port = rendezvous(ray, cluster_inventory(nodes), here, other.node_id)  # a task on that node
    try:
        assert addr == other.ip and 0 < port < 65536
        assert not gang.hold_port(port)  # held until the gang's attempt ends: no other gang gets it meanwhile
    finally:
        gang.release_port(port)
