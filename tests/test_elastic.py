"""Elastic gangs (ranks = "MIN:MAX"): accepted for Task pipelines and refused for Lightning, granted as many ranks
as are free (at least MIN), and shrunk on a restart when a pipeline that outranks it took a slot, keeping the
samples of one optimizer step; then a real 2-rank gloo gang that loses a rank and finishes on one."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import make_config, wait_for
from tests.scripted import ScriptedLauncher, until
from tests.test_headless_lines import printed
from torchherd.engine.config.problems import ConfigError
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.hardware.grants import Request, Wait, grant, leases_for
from torchherd.engine.hardware.slots import Slot
from torchherd.engine.preflight.check import check_config
from torchherd.engine.protocol.messages import (
    CheckpointSaved,
    GangResized,
    Heartbeat,
    PipelineFinished,
    Resumed,
    TrainingStarted,
    WorkerStarted,
)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.resizing import sizing
from torchherd.engine.supervise.supervisor import Supervisor

CPU = [Slot(f"cpu{i}", "cpu", None, 1) for i in range(2)]


def inventory() -> Inventory:
    return Inventory(cpu_count=2, note="no NVIDIA GPU (test inventory)")


# ------------------------------------------------------------ config and check


def test_min_max_ranks_is_read_and_a_bad_one_is_named(tmp_path):
    pipe = make_config(tmp_path, [{"name": "g", "ranks": "1:2"}]).pipelines[0]
    assert (pipe.min_ranks, pipe.max_ranks, pipe.elastic) == (1, 2, True)
    for bad, said in (("2:1", "1 <= MIN <= MAX"), ("0:2", "1 <= MIN <= MAX"), ("two", "'MIN:MAX'"), (0, "at least 1")):
        with pytest.raises(ConfigError) as info:
            make_config(tmp_path, [{"name": "g", "ranks": bad}])
        [problem] = info.value.problems
        assert problem.key == "pipelines[0].ranks" and said in problem.message and "test.toml" in str(problem)


def _check(tmp_path: Path, pipeline: str) -> list:
    toml = tmp_path / "elastic.toml"
    toml.write_text(f'[[pipelines]]\nname = "g"\nranks = "1:2"\n{pipeline}\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 2\n')
    return check_config(toml, inventory=inventory()).problems


def test_check_refuses_an_elastic_lightning_gang_saying_why(tmp_path):
    # a script's elastic gang: tests/test_elastic_scripts.py
    (tmp_path / "lit.py").write_text("class Lit: pass\n")
    [lit] = _check(tmp_path, 'task = "lightning:lit.py:Lit"')
    assert lit.key == "pipelines[0].ranks" and "Lightning's Trainer restores" in lit.message


def test_check_plans_an_elastic_task_gang_and_refuses_it_a_shard_group(tmp_path):
    assert _check(tmp_path, 'task = "regression"') == []
    toml = tmp_path / "elastic.toml"
    assert "an elastic gang of 2 ranks (1 to 2) on cpu0" in check_config(toml, inventory=inventory()).render()
    [problem] = _check(tmp_path, 'task = "regression"\nstrategy = "fsdp"\nshard_group = 2')
    assert problem.key == "pipelines[0].shard_group" and "elastic gang" in problem.message


# ------------------------------------------------------------ grants and the batch


def test_an_elastic_request_takes_what_is_free_down_to_its_min_and_waits_for_its_min():
    elastic = Request(ranks=2, min_ranks=1)
    assert len(grant(elastic, CPU, [], "r")) == 2
    held = leases_for(CPU[:1], "r", "urgent", 1)
    assert grant(elastic, CPU, held, "r") == CPU[1:]
    assert isinstance(grant(Request(ranks=2), CPU, held, "r"), Wait)  # a fixed gang of 2 waits
    wait = grant(elastic, CPU, held + leases_for(CPU[1:], "r", "other", 1), "r")
    assert isinstance(wait, Wait) and "waiting for 1 CPU slot" in wait.why


def test_the_global_batch_is_kept_by_the_accumulation_else_the_batch_else_said(tmp_path):
    def at(ranks: int, world: int, **keys):
        pipe = make_config(tmp_path, [{"name": "g", "ranks": ranks, "batch_size": 32, **keys}]).pipelines[0]
        s = sizing(pipe, world)
        return s.batch_size, s.accumulate_grad_batches, s.samples_per_step

    assert at("1:2", 1) == (32, 2, 64) and at("1:2", 2) == (32, 1, 64)
    assert at("2:4", 2, accumulate_grad_batches=3) == (32, 6, 384)
    assert at("1:3", 2) == (48, 1, 96)  # 3 / 2 is no whole accumulation: the per-rank batch grows
    assert at("2:3", 2, batch_size=5)[2] == 10  # neither divides: as configured, and the event says so
    assert at("1:2", 1, keep="per_rank_batch") == (32, 1, 32)


def test_a_resize_is_one_line_saying_why_and_what_became_of_the_batch():
    kept = GangResized(pipeline="g", from_ranks=2, to_ranks=1, why="rank 1 killed by SIGKILL", batch_size=32,
                       accumulate_grad_batches=2, samples_per_step=64, samples_per_step_before=64)
    assert printed(kept).split("] ", 1)[-1].rstrip() == (
        "g: gang resized from 2 to 1 rank (rank 1 killed by SIGKILL): batch_size 32 x accumulate_grad_batches 2 "
        "a rank, 64 samples an optimizer step as before")
    halved = GangResized(pipeline="g", from_ranks=2, to_ranks=1, batch_size=32, samples_per_step=32,
                         samples_per_step_before=64, keep="per_rank_batch")
    assert "64 -> 32 samples an optimizer step (keep = per_rank_batch)" in printed(halved)



def test_an_elastic_gangs_started_line_says_its_size_of_min_max_and_a_fixed_ones_is_as_it_was():
    def started(**kw) -> str:
        return printed(WorkerStarted(pipeline="g", attempt=1, **kw)).split("] ", 1)[-1].rstrip()

    assert started(pid=7, device="cpu0,cpu1", pids=(7, 8), min_ranks=1, max_ranks=2) == \
        "g: started 2 of 1:2 ranks, pids 7, 8, on cpu0,cpu1 (attempt 1)"
    assert started(pid=9, device="cpu1", min_ranks=1, max_ranks=2) == \
        "g: started 1 of 1:2 ranks, pid 9 on cpu1 (attempt 1)"
    assert started(pid=7, device="cpu0,cpu1", pids=(7, 8)) == "g: started 2 ranks, pids 7, 8, on cpu0,cpu1 (attempt 1)"
    assert started(pid=7, device="cpu0") == "g: started pid 7 on cpu0 (attempt 1)"


# ------------------------------------------------------------ the supervisor over scripted ranks


def _stepped(name: str) -> list:
    return [TrainingStarted(pipeline=name, epoch=0, step=0, epochs_total=1, steps_per_epoch=9, device="cpu",
                            parameters=1), Heartbeat(pipeline=name, step=1)]


async def test_a_restart_shrinks_to_the_slots_left_when_a_higher_priority_pipeline_takes_one(tmp_path):
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "g", "ranks": "1:2"}], telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=inventory(), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        await until(lambda: len(launcher.handles) == 2)
        launcher.handles[0].on_events(_stepped("g"))
        sup.add_config(make_config(tmp_path, [{"name": "urgent", "priority": 1}], telemetry={"enabled": False}))
        launcher.handles[1].exit(-signal.SIGKILL)  # rank 1 dies; urgent waits for a slot
        await until(lambda: len(launcher.handles) == 4)  # urgent's worker, then the gang on the slot left
        specs = {s.child.pipeline["name"]: s.child for s in launcher.specs[2:]}
        assert specs["g"].world_size == 1 and specs["g"].pipeline["accumulate_grad_batches"] == 2
        assert sup.view("urgent").device != sup.view("g").device
    finally:
        await sup.shutdown(graceful=False)
    seen = []
    while (e := events.get_nowait()) is not None:
        seen.append(e)
    [resized] = [e for e in seen if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks) == (2, 1)
    assert resized.why.startswith("rank 1 killed by SIGKILL") and "held by this run (urgent)" in resized.why
    assert resized.samples_per_step == resized.samples_per_step_before == 64


async def test_an_elastic_gang_starts_on_the_slots_free_and_a_fixed_one_waits(tmp_path):
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "urgent", "priority": 1}, {"name": "g", "ranks": "1:2"}],
                         telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=inventory(), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        await until(lambda: len(launcher.handles) == 2)
        assert [s.child.world_size for s in launcher.specs] == [1, 1]
    finally:
        await sup.shutdown(graceful=False)
    seen = []
    while (e := events.get_nowait()) is not None:
        seen.append(e)
    [resized] = [e for e in seen if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks, resized.why) == (2, 1, "1 of 2 CPU slots free: cpu0 held by this "
                                                                         "run (urgent)")
    started = {e.pipeline: e for e in seen if isinstance(e, WorkerStarted)}
    assert (started["g"].min_ranks, started["g"].max_ranks) == (1, 2)  # what the app and headless say of its size
    assert (started["urgent"].min_ranks, started["urgent"].max_ranks) == (0, 0)


# ------------------------------------------------------------ a real gang


@pytest.mark.slow
async def test_a_gang_that_loses_a_rank_to_a_higher_priority_pipeline_finishes_on_one_from_its_checkpoint(tmp_path):
    pipe = {"name": "g", "ranks": "1:2", "max_epochs": 4, "params": {"samples": 256, "delay": 0.004}}
    config = make_config(tmp_path, [pipe], validation={"mode": "off"}, telemetry={"enabled": False},
                         restart={"max_restarts": 1})
    sup = Supervisor(config, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), 120)
        assert len(started.pids) == 2
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved), 120)
        sup.add_config(make_config(tmp_path, [{"name": "urgent", "priority": 1, "max_epochs": 2,
                                                "params": {"samples": 256, "delay": 0.002}}],
                                   validation={"mode": "off"}, telemetry={"enabled": False}))
        os.kill(started.pids[1], signal.SIGKILL)
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 240)
        assert done.status == "completed" and done.step == 4 * 4  # 4 steps an epoch at 2 ranks and at 1
        await sup.wait()
    finally:
        await sup.shutdown()
    events = read_events(sup.run_dir)
    [resized] = [e for e in events if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks) == (2, 1) and "rank 1 killed by SIGKILL" in resized.why
    assert resized.samples_per_step == resized.samples_per_step_before == 64
    after = events[events.index(resized):]
    [again] = [e for e in after if isinstance(e, WorkerStarted) and e.pipeline == "g"]
    assert again.pids == () and [e for e in after if isinstance(e, Resumed) and e.pipeline == "g"]
    [urgent] = [e for e in events if isinstance(e, WorkerStarted) and e.pipeline == "urgent"]
    assert {urgent.device, again.device} == {"cpu0", "cpu1"}  # the slot rank 1 had went to urgent, not back
