"""GPU requests on the fake NVIDIA driver: a foreign process makes a GPU busy for whole-GPU requests and takes
its memory off what shares may reserve; when it ends a waiting pipeline starts there; two GPUs a rank go to
NVLink pairs, and a real script gang prints that each rank is told its own pair.

The driver is tests/nvml_fake (pynvml's real bindings over a scripted libnvidia-ml); the supervisor is the
real one, over a scripted backend where only the grants matter and over real processes for what a script sees.
"""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import discover_devices
from torchherd.engine.protocol.messages import PipelineWaiting
from torchherd.engine.protocol.spec import ValidatorSpec, WorkerSpec
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config
from tests.nvml_fake import FakeGpu, GiB
from tests.scripted import ScriptedLauncher, until

SHOW = str(Path(__file__).parent / "tasks" / "scripts" / "visible_devices.py")
SEEN = re.compile(r"visible_devices: rank (\d+) local_rank \d+ cuda_visible_devices \[([^\]]*)\] own \[([^\]]*)\]")
FOREIGN_PID = 1  # init: a process that is no descendant of any supervisor of ours


def four_gpus(fake_nvml, foreign_on: int | None = None, nvlink: bool = False) -> None:
    gpus = [FakeGpu(memory_used=1 * GiB) for _ in range(4)]
    if foreign_on is not None:
        gpus[foreign_on] = FakeGpu(memory_used=31 * GiB, processes=[(FOREIGN_PID, 30 * GiB)])
    if nvlink:  # two NVLink pairs, 0-2 and 1-3; every other pair crosses the CPUs
        for a, b in ((0, 2), (1, 3)):
            gpus[a].nvlink.append(b)
            gpus[b].nvlink.append(a)
    fake_nvml.gpus = gpus
    fake_nvml.write()


def end_foreign(fake_nvml, index: int) -> None:
    fake_nvml.gpus[index] = FakeGpu(memory_used=1 * GiB)
    fake_nvml.write()


def gpus_of(backend: ScriptedLauncher) -> dict[str, tuple[int, ...]]:
    return {s.child.name: s.visible_gpus for s in backend.specs if isinstance(s.child, WorkerSpec)}


async def supervised(tmp_path: Path, pipelines: list[dict], **top) -> tuple[Supervisor, ScriptedLauncher, list]:
    config = make_config(tmp_path, pipelines, telemetry={"enabled": False}, validation={"mode": "off"},
                         devices={"placement": "auto", **top.pop("devices", {})}, **top)
    backend = ScriptedLauncher(obey_stop=True)
    sup = Supervisor(config, launcher=backend, inventory=discover_devices(), tick=0.02)
    await sup.start()
    return sup, backend, sup.subscribe()


async def test_whole_gpu_requests_skip_the_foreign_gpu_and_take_it_once_the_process_ends(tmp_path, fake_nvml):
    four_gpus(fake_nvml, foreign_on=1)
    sup, backend, stream = await supervised(tmp_path, [{"name": f"w{i}"} for i in range(4)])
    try:
        await until(lambda: len(gpus_of(backend)) == 3, 30)
        assert gpus_of(backend) == {"w0": (0,), "w1": (2,), "w2": (3,)}  # gpu1 is someone else's
        waiting = await asyncio.wait_for(_first(stream, PipelineWaiting), 30)
        assert waiting.pipeline == "w3"
        assert "gpu1 held by pid 1 (user " in waiting.why and "30 GiB)" in waiting.why
        assert "gpu0, gpu2, gpu3 held by this run (w0, w1, w2)" in waiting.why
        end_foreign(fake_nvml, 1)  # the driver's state changes: the process is gone
        await until(lambda: "w3" in gpus_of(backend), 30)
        assert gpus_of(backend)["w3"] == (1,)
    finally:
        await sup.shutdown(graceful=False)


async def test_memory_shares_pack_on_the_foreign_gpu_up_to_its_free_memory(tmp_path, fake_nvml):
    four_gpus(fake_nvml, foreign_on=1)
    sup, backend, stream = await supervised(tmp_path, [{"name": f"s{i}", "gpu_memory": "20GiB"} for i in range(3)],
                                            devices={"placement": [1]})
    try:
        await until(lambda: len(gpus_of(backend)) == 2, 30)
        assert gpus_of(backend) == {"s0": (1,), "s1": (1,)}  # 80 GiB less the foreign 30: two shares of 20
        waiting = await asyncio.wait_for(_first(stream, PipelineWaiting), 30)
        assert waiting.pipeline == "s2" and "gpu1 10.0 GiB free" in waiting.why
        end_foreign(fake_nvml, 1)
        await until(lambda: "s2" in gpus_of(backend), 30)
        assert gpus_of(backend)["s2"] == (1,)
    finally:
        await sup.shutdown(graceful=False)


async def test_two_gpus_per_rank_are_nvlink_pairs_and_each_rank_is_told_its_own(tmp_path, fake_nvml):
    four_gpus(fake_nvml, nvlink=True)
    sup, backend, _ = await supervised(tmp_path, [{"name": "g", "ranks": 2, "gpus_per_rank": 2}])
    try:
        await until(lambda: len(backend.specs) == 2, 30)
        ranks = sorted((s for s in backend.specs if isinstance(s.child, WorkerSpec)), key=lambda s: s.child.rank)
        assert [s.visible_gpus for s in ranks] == [(0, 2, 1, 3)] * 2  # the gang's GPUs, in rank order, for all
        assert [s.env["TORCHHERD_GPUS"] for s in ranks] == ["0,1", "2,3"]
        assert [s.child.device for s in ranks] == ["cuda:0", "cuda:2"]
    finally:
        await sup.shutdown(graceful=False)


@pytest.mark.slow
async def test_a_script_gang_and_a_single_rank_see_their_own_nvlink_pairs(tmp_path, fake_nvml):
    # Six fake GPUs, NVLink pairs 0-3, 1-4, 2-5: the gang's two ranks take two pairs, the one-rank pipeline the third.
    gpus = [FakeGpu() for _ in range(6)]
    for a, b in ((0, 3), (1, 4), (2, 5)):
        gpus[a].nvlink.append(b)
        gpus[b].nvlink.append(a)
    fake_nvml.gpus = gpus
    fake_nvml.write()
    config = make_config(tmp_path, [{"name": "g", "ranks": 2, "gpus_per_rank": 2, "script": SHOW},
                                    {"name": "solo", "gpus_per_rank": 2, "script": SHOW}],
                         defaults={"task": None}, devices={"placement": "auto"}, validation={"mode": "off"},
                         telemetry={"enabled": False}, restart={"max_restarts": 0})
    sup = Supervisor(config, inventory=discover_devices())
    await sup.start()
    try:
        finished = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown()
    assert finished == {"g": "completed", "solo": "completed"}
    seen = {}
    for log in sorted(sup.run_dir.glob("*/log*.txt")):
        for m in SEEN.finditer(log.read_text()):
            seen[(log.parent.name, int(m.group(1)))] = (m.group(2), m.group(3))
    assert seen == {("g", 0): ("0,3,1,4", "0,1"), ("g", 1): ("0,3,1,4", "2,3"), ("solo", 0): ("2,5", "0,1")}


async def _first(stream, kind):
    async for event in stream:
        if isinstance(event, kind):
            return event


def test_check_lists_what_is_held_now_and_which_pipelines_would_wait(tmp_path, fake_nvml):
    from torchherd.engine.hardware.grants import leases_for
    from torchherd.engine.hardware.ledger import Ledger
    from torchherd.engine.hardware.placement import plan_slots
    from torchherd.engine.preflight.check import check_config

    four_gpus(fake_nvml, foreign_on=1)
    other = Ledger()  # another run of the user's, live in this process: it holds gpu0
    slots, _ = plan_slots(make_config(tmp_path, [{"name": "x"}], devices={"placement": "auto"}).devices,
                          discover_devices())
    with other.locked():
        other.take(leases_for(slots[:1], "20261128-0408-a", "theirs", pid=1))
    toml = tmp_path / "four.toml"
    toml.write_text('[defaults]\ntask = "regression"\n' + "".join(f'[[pipelines]]\nname = "w{i}"\n' for i in range(3)))
    try:
        report = check_config(toml)
    finally:
        other.close()
    assert report.ok, report.render()
    text = report.render()
    assert "gpu0 held now by run 20261128-0408-a (you)" in text
    assert "gpu1 held now by pid 1 (user " in text
    assert "w0: task regression" in text and "-> gpu2 (" in text
    assert "w2: task regression" in text and ("queued (#1), waiting for 1 GPU: gpu0 held by run 20261128-0408-a (you); "
                                              "gpu1 held by pid 1") in text


async def validated(tmp_path: Path, name: str, pipelines: list[dict]) -> tuple[Supervisor, ScriptedLauncher, list]:
    """A run validating in the background on the fake GPUs (its validator's GPU as placement chooses it)."""
    config = make_config(tmp_path / name, pipelines, telemetry={"enabled": False}, validation={"mode": "background"},
                         devices={"placement": "auto"})
    backend = ScriptedLauncher(obey_stop=True)
    sup = Supervisor(config, launcher=backend, inventory=discover_devices(), tick=0.02)
    await sup.start()
    return sup, backend, sup.subscribe()


def validator_gpu(backend: ScriptedLauncher) -> int | None:
    [spec] = [s for s in backend.specs if isinstance(s.child, ValidatorSpec)]
    return spec.gpu_index


async def test_a_validators_spare_gpu_is_leased_and_no_other_run_is_granted_it(tmp_path, fake_nvml):
    # Regression: the validator's "GPU no worker uses" was no lease, and the next run was granted it whole.
    four_gpus(fake_nvml, foreign_on=2)  # someone else's process on gpu2: a validator never picks it
    first, first_backend, _ = await validated(tmp_path, "first", [{"name": "a"}])
    second = None
    try:
        await until(lambda: "a" in gpus_of(first_backend) and validator_gpu(first_backend) is not None, 30)
        assert gpus_of(first_backend)["a"] == (0,) and validator_gpu(first_backend) == 1
        second, backend, stream = await validated(tmp_path, "second", [{"name": f"b{i}"} for i in range(2)])
        await until(lambda: len(gpus_of(backend)) == 1, 30)
        assert gpus_of(backend) == {"b0": (3,)}  # gpu0: a; gpu1: a's validator; gpu2: the foreign process
        waiting = await asyncio.wait_for(_first(stream, PipelineWaiting), 30)
        assert waiting.pipeline == "b1" and f"gpu0, gpu1 held by run {first.run_dir.name} (you)" in waiting.why
        # the second run's validator has no spare GPU left: it shares its own run's
        assert validator_gpu(backend) == 3
    finally:
        for sup in (second, first):
            if sup is not None:
                await sup.shutdown(graceful=False)
