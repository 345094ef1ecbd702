"""torchherd on real GPUs: one pipeline per GPU, DDP gangs over NCCL, a validator on a spare GPU, the memory
cap, and a CUDA out-of-memory crash that restarts.

Skipped without CUDA (see conftest.py). They mirror the CPU tests (tests/test_gangs.py,
tests/faults/test_worker_crashes.py) on GPU slots, with the real inventory NVML gives. One file on
purpose, and with test_handoff_gpu.py in one xdist group: `--dist loadgroup` never runs two GPU tests at once
on the same GPUs.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import discover_devices
from torchherd.engine.protocol.messages import EpochEnd, PipelineFinished, ValidatorStarted, ValResult, WorkerError, \
    WorkerExited, WorkerRestarting, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config
from tests.gpu.conftest import NO_CUDA, needs_gpus
from tests.test_gangs import EPOCH_LOSS, checksums, run_to_end

pytestmark = [pytest.mark.gpu, pytest.mark.slow, NO_CUDA, pytest.mark.xdist_group("gpu")]  # one GPU test at a time

GPU_TASK = f"{TASKS / 'gpu_task.py'}:build"
DDP_CUDA = str(TASKS / "scripts" / "ddp_cuda.py")
# gpu_task.py's and ddp_cuda.py's line about the GPU a process uses
USES = re.compile(r"(?:current cuda:(?P<current>\d+)|local_rank (?P<local>\d+)) of (?P<count>\d+) visible "
                  r"\[(?P<visible>[^\]]*)\].*? id (?P<id>\S+)")


def gpu_config(tmp_path: Path, pipelines: list[dict], **top):
    """make_config on this machine's GPUs, training tests/tasks/gpu_task.py unless a pipeline says otherwise."""
    top.setdefault("validation", {"mode": "off"})
    top["devices"] = {"placement": "auto", **top.get("devices", {})}
    top["defaults"] = {"task": GPU_TASK, **top.get("defaults", {})}
    return make_config(tmp_path, pipelines, **top)


def uses(log: Path) -> list[dict[str, str]]:
    """Every GPU line a process printed in `log`."""
    return [m.groupdict() for m in USES.finditer(log.read_text())]


def first_gpus(n: int) -> list[int]:
    """The NVML indices of this machine's first `n` GPUs (as torchherd's placement names them)."""
    return [g.index for g in discover_devices().gpus[:n]]


async def test_one_pipeline_per_gpu_each_sees_only_its_own(tmp_path):
    indices = first_gpus(8)
    config = gpu_config(tmp_path, [{"name": f"p{i}"} for i in range(len(indices))], devices={"placement": indices})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {f"p{i}": "completed" for i in range(len(indices))}
    started = [e for e in read_events(sup.run_dir) if isinstance(e, WorkerStarted)]
    assert sorted(e.device for e in started) == sorted(f"gpu{i}" for i in indices)
    seen = [uses(sup.run_dir / f"p{i}" / "log.txt")[0] for i in range(len(indices))]
    assert {(u["current"], u["count"]) for u in seen} == {("0", "1")}  # cuda:0, the only GPU it sees
    assert len({u["id"] for u in seen}) == len(indices)  # each on a GPU of its own


@needs_gpus(2)
async def test_a_task_gang_trains_over_nccl_each_rank_on_its_own_gpu_of_the_two_it_sees(tmp_path):
    pair = first_gpus(2)
    config = gpu_config(tmp_path, [{"name": "g", "ranks": 2, "max_epochs": 3, "gpu_memory_fraction": 0.5,
                                    "params": {"samples": 512}}], devices={"placement": pair})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"g": "completed"}
    ranks = [uses(sup.run_dir / "g" / log)[0] for log in ("log.txt", "log-rank1.txt")]
    assert [(u["current"], u["count"], u["visible"]) for u in ranks] == \
        [(str(r), "2", ",".join(map(str, pair))) for r in range(2)]  # cuda:LOCAL_RANK of the gang's two
    assert ranks[0]["id"] != ranks[1]["id"]
    sums = checksums(sup.run_dir, "g")
    assert set(sums) == {0, 1} and sums[0] == sums[1]


@needs_gpus(2)
async def test_a_torchrun_style_script_gang_uses_cuda_local_rank_over_nccl(tmp_path):
    config = gpu_config(tmp_path, [{"name": "s", "ranks": 2, "script": DDP_CUDA, "args": ["--epochs", "2"],
                                    "metrics": EPOCH_LOSS}], defaults={"task": None},
                        devices={"placement": first_gpus(2)})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"s": "completed"}
    ranks = [uses(sup.run_dir / "s" / log)[0] for log in ("log.txt", "log-rank1.txt")]
    assert [(u["local"], u["count"]) for u in ranks] == [("0", "2"), ("1", "2")]
    assert ranks[0]["visible"] == ranks[1]["visible"] and ranks[0]["id"] != ranks[1]["id"]
    sums = checksums(sup.run_dir, "s")
    assert set(sums) == {0, 1} and sums[0][1] == sums[1][1]


@needs_gpus(2)
async def test_background_validation_runs_on_a_spare_gpu_that_it_alone_sees(tmp_path):
    first, spare = first_gpus(2)
    config = gpu_config(tmp_path, [{"name": "p", "max_epochs": 3}], devices={"placement": [first]},
                        validation={"mode": "background"})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"p": "completed"}
    events = read_events(sup.run_dir)
    [validator] = [e for e in events if isinstance(e, ValidatorStarted)]
    assert f"gpu{spare}" in validator.device
    assert [e for e in events if isinstance(e, ValResult) and e.pipeline == "p"]
    [scorer] = uses(sup.run_dir / "validator" / "log.txt")[:1]  # the validator built the task to score it
    assert (scorer["current"], scorer["count"], scorer["visible"]) == ("0", "1", str(spare))
    assert scorer["id"] != uses(sup.run_dir / "p" / "log.txt")[0]["id"]


async def test_the_memory_cap_holds_a_pipeline_to_its_share_of_its_gpu(tmp_path):
    # Each reserves a tenth of its GPU at build: under a cap of a twentieth that is a CUDA OOM.
    config = gpu_config(tmp_path, [
        {"name": "capped", "gpu_memory_fraction": 0.05, "params": {"reserve_fraction": 0.1}},
        {"name": "roomy", "gpu_memory_fraction": 0.5, "params": {"reserve_fraction": 0.1}},
    ], devices={"placement": first_gpus(1)}, restart={"max_restarts": 0})
    sup = Supervisor(config)
    statuses = await run_to_end(sup)
    assert statuses["roomy"] == "completed" and statuses["capped"] == "failed"
    events = read_events(sup.run_dir)
    [error] = [e for e in events if isinstance(e, WorkerError) and e.pipeline == "capped"]
    assert error.error.startswith("CUDA out of memory"), error.error


async def test_a_cuda_out_of_memory_crash_is_named_and_restarts(tmp_path):
    config = gpu_config(tmp_path, [{"name": "oom", "max_epochs": 3, "params": {
        "oom_at_call": 12, "once_file": str(tmp_path / "oom-once")}}], devices={"placement": first_gpus(1)},
        restart={"max_restarts": 2})
    sup = Supervisor(config)
    statuses = await run_to_end(sup)
    events = read_events(sup.run_dir)
    assert statuses == {"oom": "completed"}, [e for e in events if isinstance(e, (WorkerError, WorkerExited,
                                                                                WorkerRestarting, PipelineFinished))]
    [crash] = [e for e in events if isinstance(e, WorkerExited) and e.reason == "crashed"]
    assert crash.error.startswith("CUDA out of memory"), crash.error
    [again] = [e for e in events if isinstance(e, WorkerRestarting)]
    assert "CUDA out of memory" in again.reason


@needs_gpus(2)
async def test_two_gpus_per_rank_a_script_trains_data_parallel_and_a_model_split_over_its_pair(tmp_path):
    config = gpu_config(tmp_path, [{"name": "pair", "gpus_per_rank": 2, "task": None,
                                    "script": str(TASKS / "scripts" / "two_gpus.py")}],
                        restart={"max_restarts": 0})
    sup = Supervisor(config)
    finished = await run_to_end(sup)
    assert finished == {"pair": "completed"}, (sup.run_dir / "pair" / "log.txt").read_text()[-2000:]
    log = (sup.run_dir / "pair" / "log.txt").read_text()
    assert "two_gpus: data_parallel ok on [0, 1]" in log and "two_gpus: split ok on cuda:0 and cuda:1" in log


@needs_gpus(2)
async def test_an_fsdp_task_gang_over_nccl_holds_half_the_weights_and_trains_to_the_ddp_loss(tmp_path):
    from tests.test_sharded import LAYERED, LOSS_TOLERANCE, held

    same = {"task": LAYERED, "ranks": 2, "max_epochs": 2, "params": {"samples": 128}}
    config = gpu_config(tmp_path, [{"name": "f", "strategy": "fsdp", **same}, {"name": "d", **same}],
                        validation={"mode": "background"}, devices={"placement": first_gpus(2)})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"f": "completed", "d": "completed"}
    events = read_events(sup.run_dir)
    losses = {n: [e.train_loss for e in events if isinstance(e, EpochEnd) and e.pipeline == n] for n in "fd"}
    assert losses["f"] == pytest.approx(losses["d"], rel=LOSS_TOLERANCE)
    shards, whole = held(sup.run_dir, "f"), held(sup.run_dir, "d")
    assert all(0.4 * whole[0][2] <= s[2] <= 0.6 * whole[0][2] for s in shards.values())
    assert [e for e in events if isinstance(e, ValResult) and e.pipeline == "f" and e.step == 4]
    assert (sup.run_dir / "f" / "checkpoints" / "last.dcp" / "torchherd.json").exists()
