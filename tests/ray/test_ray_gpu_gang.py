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
from tests.test_gpu_visibility import SHOW, seen_devices

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
