"""Elastic gangs stop being granted a slot whose rank failed first in two crashes in a row (issue 53): the rule,
the scheduler's grants without that slot (and with it where the gang could never start without it), the
supervisor over scripted ranks (a fixed gang as before), then a real 2-rank gloo gang whose rank 1 keeps failing
and that finishes on one rank."""
from __future__ import annotations

import signal

import pytest

from tests.conftest import make_config, wait_for
from tests.scripted import ScriptedLauncher, until
from tests.test_elastic import CPU, _stepped, inventory
from torchherd.engine.hardware.grants import Request
from torchherd.engine.hardware.ledger import MemoryLedger
from torchherd.engine.protocol.messages import GangResized, Notice, PipelineFinished, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.resizing import failed_again
from torchherd.engine.supervise.scheduler import Scheduler
from torchherd.engine.supervise.supervisor import Supervisor

AVOIDED = "cpu1 failed rank 1 twice in a row: not granted to this gang again"

# ------------------------------------------------------------ the rule


def test_a_slot_is_named_when_the_first_failing_rank_ran_on_it_in_two_crashes_in_a_row():
    cpu0, cpu1 = CPU
    assert failed_again((cpu1, 1), (cpu1, 1)) == "cpu1 failed rank 1 twice in a row"
    assert failed_again((cpu1, 1), (cpu1, 0)) == "cpu1 failed twice in a row (rank 1, then rank 0)"
    assert failed_again((cpu0, 0), (cpu1, 1)) == ""  # another slot: no repeat
    assert failed_again(None, (cpu1, 1)) == failed_again((cpu1, 1), None) == ""  # a hang, a one-rank attempt


def test_an_avoided_slot_is_granted_no_more_to_that_gang_nor_counted_as_room_to_grow():
    scheduler = Scheduler(list(CPU))
    gang = Request(ranks=2, min_ranks=1)
    assert scheduler.avoid("g", CPU[1], AVOIDED, gang) == ""
    scheduler.enqueue("g", 0, 0, gang)
    assert scheduler.allocate() == [("g", [CPU[0]])]
    assert scheduler.short["g"] == AVOIDED  # its gang_resized says why it is smaller
    assert scheduler.room("g", gang) == 1  # cpu1 is free, but not to grow onto
    scheduler.enqueue("other", 0, 1)
    assert scheduler.allocate() == [("other", [CPU[1]])]  # other pipelines are granted it as before


def test_a_gang_waits_for_its_other_slots_and_is_granted_one_it_cannot_do_without():
    ledger = MemoryLedger()
    other, scheduler = Scheduler(list(CPU), ledger, run="A"), Scheduler(list(CPU), ledger, run="B")
    other.enqueue("hold", 0, 0, Request(ranks=1))
    assert other.allocate() == [("hold", [CPU[0]])]
    gang = Request(ranks=2, min_ranks=1)
    scheduler.avoid("g", CPU[1], AVOIDED, gang)
    scheduler.enqueue("g", 0, 0, gang)
    assert scheduler.allocate() == []  # cpu1 is free, but g waits for cpu0
    assert scheduler.waits == {"g": f"waiting for 1 CPU slot: cpu0 held by run A (you); {AVOIDED}"}
    # cpu0 failing too would leave it no slot for its MIN: it is not kept off cpu0, nor (still) granted cpu1
    said = scheduler.avoid("g", CPU[0], "cpu0 failed rank 0 twice in a row: not granted to this gang again", gang)
    assert said == "the other slots cannot hold its 1 rank (its MIN)"
    other.release([CPU[0]], "hold")
    assert scheduler.allocate() == [("g", [CPU[0]])]
    fixed_min = Request(ranks=2, min_ranks=2)
    assert scheduler.avoid("f", CPU[1], AVOIDED, fixed_min) == "the other slots cannot hold its 2 ranks (its MIN)"


# ------------------------------------------------------------ the supervisor over scripted ranks


async def _rank1_dies_twice(tmp_path, ranks: int | str) -> tuple[ScriptedLauncher, list]:
    """A gang of `ranks` whose rank 1 (on cpu1) is SIGKILLed in its first two attempts; the launcher once it
    has started the third, and every event."""
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "g", "ranks": ranks}], telemetry={"enabled": False},
                         restart={"max_restarts": 3, "min_uptime": 0})
    sup = Supervisor(config, launcher=launcher, inventory=inventory(), tick=0.005)
    events = sup.subscribe()
    await sup.start()
    try:
        for first in (0, 2):  # each attempt's rank 0 steps, then its rank 1 dies
            await until(lambda n=first + 2: len(launcher.handles) == n)
            launcher.handles[first].on_events(_stepped("g"))
            launcher.handles[first + 1].exit(-signal.SIGKILL)
        await until(lambda: len(launcher.handles) > 4)
    finally:
        await sup.shutdown(graceful=False)
    seen = []
    while (e := events.get_nowait()) is not None:
        seen.append(e)
    return launcher, seen


async def test_an_elastic_gang_whose_rank_fails_twice_on_one_slot_restarts_without_it(tmp_path):
    launcher, seen = await _rank1_dies_twice(tmp_path, "1:2")
    assert [s.child.world_size for s in launcher.specs] == [2, 2, 2, 2, 1]
    [resized] = [e for e in seen if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks) == (2, 1)
    assert resized.why == f"rank 1 killed by SIGKILL; {AVOIDED}"
    assert f"{AVOIDED} (its later grants skip it, down to 1 rank)" in [e.text for e in seen if isinstance(e, Notice)]
    started = [e for e in seen if isinstance(e, WorkerStarted)]
    assert [e.device for e in started] == ["cpu0,cpu1", "cpu0,cpu1", "cpu0"]


async def test_a_fixed_gang_is_granted_the_same_slots_as_before(tmp_path):
    launcher, seen = await _rank1_dies_twice(tmp_path, 2)
    assert all(s.child.world_size == 2 for s in launcher.specs)
    assert not [e for e in seen if isinstance(e, GangResized)]
    assert not [e for e in seen if isinstance(e, Notice) and "not granted" in e.text]


# ------------------------------------------------------------ a real gang


@pytest.mark.slow
async def test_a_gang_whose_rank_1_keeps_failing_finishes_on_one_rank(tmp_path):
    # issue 53: without the rule it was granted both slots again and ended failed (the same error twice in a row)
    params = {"samples": 256, "crash_at_step": 3, "crash_rank": 1, "crash_world_size": 2}
    config = make_config(tmp_path, [{"name": "g", "ranks": "1:2", "max_epochs": 2, "params": params}],
                         validation={"mode": "off"}, telemetry={"enabled": False},
                         restart={"max_restarts": 3, "min_uptime": 0})
    sup = Supervisor(config, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 240)
        await sup.wait()
    finally:
        await sup.shutdown()
    assert done.status == "completed", done.reason
    events = read_events(sup.run_dir)
    started = [e for e in events if isinstance(e, WorkerStarted)]
    assert [e.device for e in started] == ["cpu0,cpu1", "cpu0,cpu1", "cpu0"]
    [resized] = [e for e in events if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks) == (2, 1)
    assert resized.why.startswith("rank 1: RuntimeError: tiny task exploded on purpose") and AVOIDED in resized.why
    assert any(isinstance(e, Notice) and e.text.startswith(AVOIDED) for e in events)
