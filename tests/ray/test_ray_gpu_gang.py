"""A GPU gang on a test cluster whose second node has two GPUs that Ray counts but that need not exist.

Ray gives each rank's actor one GPU and sets that actor's CUDA_VISIBLE_DEVICES to it alone; every
rank's process must still see both of the gang's, in rank order, with LOCAL_RANK picking its own, as
under torchrun. The script touches no GPU: it prints what it sees (tests/tasks/scripts/visible_devices.py).
"""
from __future__ import annotations

import asyncio

import pytest

from torchherd.engine.supervise.supervisor import Supervisor
from tests.ray.conftest import local_cluster, ray_config
from tests.conftest import TASKS
from tests.test_gpu_visibility import SHOW, seen_devices

BARRIER = str(TASKS / "scripts" / "share_barrier.py")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    """A head (2 CPUs) and a node with 2 CPUs and 2 fake GPUs: room for a gang of two GPU ranks."""
    with local_cluster(num_cpus=2, num_gpus=2) as c:
        yield c


async def test_every_rank_of_a_gpu_gang_sees_the_gangs_gpus_and_local_rank_picks_its_own(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "g", "ranks": 2, "script": SHOW}], cluster.address,
                        defaults={"task": None}, devices={"placement": "auto"}, validation={"mode": "off"},
                        restart={"max_restarts": 0})
    sup = Supervisor(config)
    await sup.start()
    try:
        finished = await asyncio.wait_for(sup.wait(), 180)
    finally:
        await sup.shutdown()
    seen = seen_devices(sup.run_dir)
    assert {key: local for key, (local, _) in seen.items()} == {("g", 0): 0, ("g", 1): 1}
    assert len({gpus for _, gpus in seen.values()}) == 1, seen  # one string for every rank
    visible = seen[("g", 0)][1]
    assert sorted(visible.split(",")) == ["0", "1"], seen  # the two GPUs Ray gave the gang's actors, one each
    assert finished == {"g": "completed"}


async def test_a_rank_of_two_gpus_sees_both_and_fractions_of_a_gpu_run_four_at_once_on_two(tmp_path, cluster):
    # gpus_per_rank = 2 is Ray's num_gpus=2 on one node; gpu_memory = 0.5 is num_gpus=0.5: the node's two GPUs
    # hold four such pipelines at once (the barrier script exits 4 unless all four run together).
    barrier = str(tmp_path / "barrier")
    shares = [{"name": f"s{i}", "script": BARRIER, "args": [barrier, "4"], "gpu_memory": 0.5} for i in range(4)]
    config = ray_config(tmp_path, [{"name": "wide", "script": SHOW, "gpus_per_rank": 2, "priority": 1}, *shares],
                        cluster.address, defaults={"task": None}, devices={"placement": "auto"},
                        validation={"mode": "off"}, restart={"max_restarts": 0})
    sup = Supervisor(config)
    await sup.start()
    try:
        finished = await asyncio.wait_for(sup.wait(), 180)
    finally:
        await sup.shutdown()
    assert finished == {name: "completed" for name in ("wide", "s0", "s1", "s2", "s3")}, finished
    seen = seen_devices(sup.run_dir)
    assert sorted(seen[("wide", 0)][1].split(",")) == ["0", "1"], seen  # Ray gave the one rank both GPUs
    assert "own [0,1]" in (sup.run_dir / "wide" / "log.txt").read_text()
    assert all(len(seen[(f"s{i}", 0)][1].split(",")) == 1 for i in range(4)), seen  # each one GPU, shared
