"""Elastic gangs grow back while they train: the policy's timing, the room the scheduler sees (never a slot a
queued pipeline waits for), the supervisor stopping a gang and starting it bigger without spending a restart, and
a real 1-rank gloo gang that grows to 2 from its checkpoint once the pipeline holding the other slot has ended."""
from __future__ import annotations

import asyncio

import pytest

from tests.conftest import make_config, wait_for
from tests.scripted import ScriptedLauncher, until
from tests.test_elastic import CPU, _stepped, inventory
from torchherd.engine.hardware.grants import Request
from torchherd.engine.protocol.channel import WorkerExit
from torchherd.engine.protocol.messages import (
    GangResized,
    PipelineFinished,
    Resumed,
    StepMetrics,
    Stop,
    TrainingStarted,
    WorkerExited,
)
from torchherd.engine.protocol.names import ExitReason
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.decisions import Outbox, Resize
from torchherd.engine.supervise.growing import Gang, GrowWatch
from torchherd.engine.supervise.scheduler import Scheduler
from torchherd.engine.supervise.supervisor import Supervisor

# ------------------------------------------------------------ the policy and the room it is told of


async def test_a_gang_grows_once_room_for_more_ranks_has_lasted_its_grow_after_and_not_before():
    sent: list = []
    gangs = {"g": Gang("g", ranks=1, room=3, grow_after=5.0)}
    watch = GrowWatch(Outbox(sent.append, lambda: False, asyncio.get_running_loop()), lambda: list(gangs.values()))
    watch.tick(100.0)  # room for 3 seen: the stretch begins
    gangs["g"] = Gang("g", ranks=1, room=2, grow_after=5.0)
    watch.tick(100.5)  # too soon after the last look: not looked at
    watch.tick(103.0)
    assert sent == []
    gangs["g"] = Gang("g", ranks=1, room=1, grow_after=5.0)
    watch.tick(104.0)  # no room for more: the stretch is broken
    gangs["g"] = Gang("g", ranks=1, room=2, grow_after=5.0)
    watch.tick(105.0)
    watch.tick(109.0)
    assert sent == []
    gangs["g"] = Gang("g", ranks=1, room=3, grow_after=5.0)
    watch.tick(110.0)  # 5 s of room for 2 at least: grow to the fewest it had room for all along
    assert sent == [Resize("g", 2, "1 more slot free for 5s")]
    gangs.clear()  # stopping to grow: no running gang below MAX
    watch.tick(111.0)
    gangs["g"] = Gang("g", ranks=2, room=2, grow_after=5.0)  # started again at 2 of 3: nothing more is free
    watch.tick(120.0)
    assert len(sent) == 1


def test_the_room_an_elastic_gang_sees_counts_its_own_slots_and_is_none_while_a_pipeline_waits():
    scheduler = Scheduler(list(CPU))
    gang = Request(ranks=2, min_ranks=1)
    scheduler.enqueue("hold", 1, 0)
    scheduler.enqueue("g", 0, 1, gang)
    assert sorted(k for k, _ in scheduler.allocate()) == ["g", "hold"]
    assert scheduler.room("g", gang) == 1  # only its own slot: cpu0 is held
    scheduler.enqueue("big", 0, 2, Request(ranks=2))  # waits for 2 slots, one of them the one hold frees
    scheduler.release([CPU[0]], "hold")  # hold ends
    assert scheduler.allocate() == [] and scheduler.room("g", gang) == 0  # cpu0 is big's to wait for
    scheduler.dequeue("big")
    assert scheduler.room("g", gang) == 2


# ------------------------------------------------------------ the supervisor over scripted ranks


async def test_a_running_gang_is_stopped_and_started_again_bigger_spending_no_restart(tmp_path):
    launcher = ScriptedLauncher(obey_stop=True)  # a Stop ends an attempt as a real one (WorkerExit.STOPPED)
    config = make_config(tmp_path, [{"name": "hold", "priority": 1}, {"name": "g", "ranks": "1:2", "grow_after": 0}],
                         telemetry={"enabled": False}, restart={"max_restarts": 0})
    sup = Supervisor(config, launcher=launcher, inventory=inventory(), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        await until(lambda: len(launcher.handles) == 2)
        assert [s.child.world_size for s in launcher.specs] == [1, 1]
        launcher.handles[1].on_events(_stepped("g"))
        launcher.handles[0].exit(WorkerExit.COMPLETED)  # hold ends: its slot is free and nobody waits for it
        await until(lambda: len(launcher.handles) == 4, timeout=10.0)
        assert [s.child.world_size for s in launcher.specs[2:]] == [2, 2]
        assert any(isinstance(c, Stop) for c in launcher.handles[1].sent)  # asked to checkpoint and exit
        assert (sup.view("g").restarts, sup.view("g").attempt) == (0, 2)
    finally:
        await sup.shutdown(graceful=False)
    seen = []
    while (e := events.get_nowait()) is not None:
        seen.append(e)
    first, grew = [e for e in seen if isinstance(e, GangResized)]
    assert (first.from_ranks, first.to_ranks, grew.from_ranks, grew.to_ranks) == (2, 1, 1, 2)
    assert grew.why == "1 more slot free for 0s" and grew.samples_per_step == grew.samples_per_step_before == 64
    [ended] = [e for e in seen if isinstance(e, WorkerExited) and e.pipeline == "g" and e.attempt == 1]
    assert ended.reason == ExitReason.RESTARTED and not ended.error


async def test_a_person_stopping_a_gang_on_its_way_to_grow_stops_it_for_good(tmp_path):
    launcher = ScriptedLauncher()  # it exits when the test says
    config = make_config(tmp_path, [{"name": "hold", "priority": 1}, {"name": "g", "ranks": "1:2", "grow_after": 0}],
                         telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=inventory(), tick=0.005)
    await sup.start()
    try:
        await until(lambda: len(launcher.handles) == 2)
        launcher.handles[1].on_events(_stepped("g"))
        launcher.handles[0].exit(WorkerExit.COMPLETED)
        await until(lambda: any(isinstance(c, Stop) for c in launcher.handles[1].sent), timeout=10.0)
        sup.stop("g", reason="done for today")
        launcher.handles[1].exit(WorkerExit.STOPPED)
        await until(lambda: sup.view("g").state.ended)
        assert (sup.view("g").state.value, sup.view("g").finish_reason) == ("stopped", "done for today")
        assert len(launcher.handles) == 2
    finally:
        await sup.shutdown(graceful=False)


# ------------------------------------------------------------ a real gang


def _steps(events: list, name: str) -> list[StepMetrics]:
    return [e for e in events if isinstance(e, StepMetrics) and e.pipeline == name]


@pytest.mark.slow
async def test_a_gang_started_on_one_slot_grows_to_two_from_its_checkpoint_when_the_other_is_freed(tmp_path):
    hold = {"name": "hold", "priority": 1, "max_epochs": 50, "params": {"samples": 256, "delay": 0.01}}
    gang = {"name": "g", "ranks": "1:2", "max_epochs": 6, "grow_after": 0.5,
            "params": {"samples": 256, "delay": 0.01}}
    config = make_config(tmp_path, [hold, gang], validation={"mode": "off"}, telemetry={"enabled": False},
                         restart={"max_restarts": 0})  # the growth spends no restart: there are none to spend
    sup = Supervisor(config, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "g", 120)
        sup.stop("hold", reason="its slot is wanted")
        grew = await wait_for(stream, lambda e: isinstance(e, GangResized) and e.to_ranks == 2, 120)
        assert grew.from_ranks == 1 and grew.why.startswith("1 more slot free for ")
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 240)
        assert done.status == "completed" and done.step == 6 * 4  # 4 steps an epoch at 1 rank and at 2
        await sup.wait()
    finally:
        await sup.shutdown()
    events = read_events(sup.run_dir)
    at = events.index(next(e for e in events if isinstance(e, GangResized) and e.to_ranks == 2))
    before, after = _steps(events[:at], "g"), _steps(events[at:], "g")
    assert before and after and min(e.step for e in after) > max(e.step for e in before)  # on, not from scratch
    assert after[0].loss < before[0].loss  # the model it trains on is the one it had trained
    [again] = [e for e in events[at:] if isinstance(e, TrainingStarted) and e.pipeline == "g"]
    assert again.step > 0 and [e for e in events[at:] if isinstance(e, Resumed) and e.pipeline == "g"]
    assert not [e for e in events if isinstance(e, WorkerExited) and e.pipeline == "g" and e.error]
