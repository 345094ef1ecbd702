"""Which GPUs each child sees: every rank of a gang sees the gang's GPUs and LOCAL_RANK picks its own, as
under torchrun; a pipeline that runs alone sees its own GPU only, the validator its own, a CPU child none.

None of this needs a GPU: slots are planned on an inventory of GPUs that need not exist here, and
what is checked is the spec and environment each child gets (through the local backend's own
`local_env`), and, end to end, what a torchrun-style script sees in its own process.
"""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import GpuInfo, Inventory
from torchherd.engine.protocol.spec import ValidatorSpec, WorkerSpec
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.scripted import ScriptedLauncher, until

GiB = 1 << 30
SHOW = str(Path(__file__).parent / "tasks" / "scripts" / "visible_devices.py")
SEEN = re.compile(r"visible_devices: rank (\d+) local_rank (\d+) cuda_visible_devices \[([^\]]*)\]")


def gpus(count: int = 6) -> Inventory:
    """A machine with `count` GPUs (indices as NVML counts them), which need not exist here."""
    return Inventory(gpus=tuple(GpuInfo(index=i, name="NVIDIA H100", uuid=f"GPU-{i:04d}", memory_total=80 * GiB)
                                for i in range(count)), cpu_count=8)


async def launched(tmp_path: Path, pipelines: list[dict], inventory: Inventory, count: int, **top) -> list:
    """The launch specs of the first `count` children the real supervisor starts (over a scripted backend)."""
    top.setdefault("validation", {"mode": "off"})
    config = make_config(tmp_path, pipelines, telemetry={"enabled": False}, **top)
    backend = ScriptedLauncher(obey_stop=True)  # the validator ends at the shutdown's Stop, as a real one does
    sup = Supervisor(config, launcher=backend, inventory=inventory, tick=0.005)
    await sup.start()
    try:
        await until(lambda: len(backend.specs) >= count)
    finally:
        await sup.shutdown(graceful=False)
    return backend.specs


def local_env(spec, inherit: dict[str, str]) -> dict[str, str]:
    """The environment the local backend starts `spec`'s child with, from `inherit`."""
    from torchherd.engine.launch.process import local_env

    return local_env(spec, inherit)


def workers(specs: list) -> list:
    return sorted((s for s in specs if isinstance(s.child, WorkerSpec)), key=lambda s: s.child.rank)


def cuda_index(device: str) -> int:
    """What torch.device(device).index would be for a worker's device ("cuda:1" -> 1)."""
    assert device.startswith("cuda:"), device
    return int(device.split(":", 1)[1])


# Regression: each rank saw only its own GPU, so rank 1's cuda:1 was "invalid device ordinal".
async def test_every_rank_of_a_gang_sees_the_gangs_gpus_and_local_rank_picks_its_own(tmp_path):
    specs = workers(await launched(tmp_path, [{"name": "g", "ranks": 2}], gpus(), 2,
                                   devices={"placement": [2, 5]}))
    assert [s.child.rank for s in specs] == [0, 1]
    for spec in specs:
        env = local_env(spec, inherit={})
        rank = spec.child.rank
        visible = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert env["CUDA_VISIBLE_DEVICES"] == "2,5"  # the same string, in slot order, for every rank
        assert env["LOCAL_RANK"] == str(rank) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA counts as NVML does: "2" is NVML's GPU 2
        # torch.device(f"cuda:{LOCAL_RANK}") in a script is a visible device, and the rank's own GPU
        assert int(env["LOCAL_RANK"]) < len(visible) and visible[int(env["LOCAL_RANK"])] == str(spec.gpu_index)
        # the Task trainer's device (set_device, DDP device_ids) is the same one
        assert spec.child.device == f"cuda:{rank}" and cuda_index(spec.child.device) == int(env["LOCAL_RANK"])


async def test_a_pipeline_alone_sees_only_its_own_gpu_as_cuda_0(tmp_path):
    [spec] = workers(await launched(tmp_path, [{"name": "solo"}], gpus(), 1, devices={"placement": [3]}))
    env = local_env(spec, inherit={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"})  # torchherd's own is not passed on
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and "LOCAL_RANK" not in env
    assert spec.child.device == "cuda:0"


async def test_two_gangs_each_see_their_own_gpus_only(tmp_path):
    specs = workers(await launched(tmp_path, [{"name": "a", "ranks": 2}, {"name": "b", "ranks": 2}], gpus(4), 4,
                                   devices={"placement": "auto"}))
    seen = {(s.child.name, s.child.rank): local_env(s, inherit={})["CUDA_VISIBLE_DEVICES"] for s in specs}
    assert seen == {("a", 0): "0,1", ("a", 1): "0,1", ("b", 0): "2,3", ("b", 1): "2,3"}


async def test_a_cpu_gang_sees_no_gpu(tmp_path):
    specs = workers(await launched(tmp_path, [{"name": "g", "ranks": 2}], Inventory(cpu_count=2), 2))
    for spec in specs:
        env = local_env(spec, inherit={"CUDA_VISIBLE_DEVICES": "0"})
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["LOCAL_RANK"] == str(spec.child.rank)
        assert spec.child.device == "cpu" and env["OMP_NUM_THREADS"] == str(spec.child.threads)


async def test_the_background_validator_on_a_spare_gpu_sees_only_that_gpu(tmp_path):
    specs = await launched(tmp_path, [{"name": "g", "ranks": 2}], gpus(3), 3, devices={"placement": [0, 1]},
                           validation={"mode": "background"})
    [validator] = [s for s in specs if isinstance(s.child, ValidatorSpec)]
    assert local_env(validator, inherit={})["CUDA_VISIBLE_DEVICES"] == "2"  # the GPU no worker uses
    assert validator.child.device == "cuda"
    assert {local_env(s, inherit={})["CUDA_VISIBLE_DEVICES"] for s in workers(specs)} == {"0,1"}


def test_the_memory_cap_and_the_current_device_are_the_ranks_own(monkeypatch):
    import torch

    from torchherd.engine.config.schema import Pipeline
    from torchherd.engine.runners.base import set_up_torch

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: calls.append(("fraction", fraction, device)))
    pipe = Pipeline(name="g", task="x.py:build", gpu_memory_fraction=0.4, ranks=2)
    spec = WorkerSpec(pipeline={}, validation={}, device="cuda:1", threads=1, pipeline_dir="", attempt=1,
                      rank=1, world_size=2)
    set_up_torch(spec, pipe)
    assert calls == [("set_device", 1), ("fraction", 0.4, 1)]  # never device 0: that is rank 0's GPU


# ------------------------------------------------------------ a real script gang


def seen_devices(run_dir: Path) -> dict[tuple[str, int], tuple[int, str]]:
    """(pipeline, RANK) -> (LOCAL_RANK, CUDA_VISIBLE_DEVICES) as tests/tasks/scripts/visible_devices.py printed them."""
    seen = {}
    for log in sorted(run_dir.glob("*/log*.txt")):
        for m in SEEN.finditer(log.read_text()):
            seen[(log.parent.name, int(m.group(1)))] = (int(m.group(2)), m.group(3))
    return seen



@pytest.mark.slow
async def test_a_torchrun_style_script_gang_finds_cuda_local_rank_among_its_visible_gpus(tmp_path):
    # The script touches no GPU: it prints what it sees and fails where cuda:{LOCAL_RANK} would not exist.
    config = make_config(tmp_path, [{"name": "g", "ranks": 2, "script": SHOW}, {"name": "solo", "script": SHOW}],
                         defaults={"task": None}, devices={"placement": [2, 5, 3]}, validation={"mode": "off"},
                         telemetry={"enabled": False}, restart={"max_restarts": 0})
    sup = Supervisor(config, inventory=gpus())
    await sup.start()
    try:
        finished = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown()
    assert seen_devices(sup.run_dir) == {("g", 0): (0, "2,5"), ("g", 1): (1, "2,5"), ("solo", 0): (0, "3")}
    assert finished == {"g": "completed", "solo": "completed"}
