"""DDP gangs: one pipeline on N slots, started together, brought down by any rank, restarted as a unit.

Logic first (the sharded sampler, the scheduler's k-slot order, the gang handle over
scripted ranks, `check`), then real 2-rank gangs over gloo on the CPU.
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from torchherd.engine.launch import gang as gangs
from torchherd.engine.preflight.check import check_config
from torchherd.engine.worker.data import EpochSampler
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, Notice, PipelineFinished, StepMetrics,
                                       WorkerError, WorkerExited, WorkerStarted, WorkerStateChanged)
from torchherd.engine.hardware.placement import Slot
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.scheduler import Scheduler
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config, still_alive, wait_for
from torchherd.engine.protocol.names import Intent
from tests.scripted import FakeHandle

SCRIPTS = Path(__file__).parent / "tasks" / "scripts"
DDP_SCRIPT = str(SCRIPTS / "ddp_loop.py")
EPOCH_LOSS = r"Epoch (?P<epoch>\d+), Loss: (?P<loss>[-+.\deE]+)"
CHECKSUM = re.compile(r"rank (\d+).* weights checksum (\S+)")


def inventory(cores: int = 2) -> Inventory:
    return Inventory(cpu_count=cores, note="no NVIDIA GPU (test inventory)")


# ------------------------------------------------------------ logic


# (1, 3), (2, 5), (3, 8): regression, a dataset smaller than half the gang left a rank with no sample.
@pytest.mark.parametrize("size,world", [(10, 2), (11, 2), (7, 3), (4, 4), (1, 3), (2, 5), (3, 8)])
def test_ranks_split_each_epoch_between_them_evenly_and_cover_every_sample(size, world):
    samplers = [EpochSampler(size, seed=3, rank=r, world=world) for r in range(world)]
    shards = [list(s) for s in samplers]
    assert {len(s) for s in shards} == {len(samplers[0])}  # as many batches on every rank: none waits alone
    assert set().union(*shards) == set(range(size))
    assert sum(len(s) for s in shards) - size < world  # padding only to even the shards


def test_a_resumed_rank_skips_exactly_what_it_trained():
    whole = list(EpochSampler(100, seed=1, rank=1, world=2))
    resumed = EpochSampler(100, seed=1, rank=1, world=2)
    resumed.set_epoch(0, skip=16)
    assert list(resumed) == whole[16:] and len(resumed) == len(whole) - 16


def test_a_waiting_gang_is_not_overtaken_by_smaller_pipelines():
    slots = [Slot(f"cpu{i}", "cpu", None, 1) for i in range(3)]
    sched = Scheduler(slots)
    sched.enqueue("single-a", 0, 0)
    sched.enqueue("single-b", 0, 1)
    assert [k for k, _ in sched.allocate()] == ["single-a", "single-b"]
    sched.enqueue("gang", 0, 2, need=3)
    sched.enqueue("single-c", 0, 3)
    assert sched.allocate() == []  # one slot free: the gang waits, and single-c may not slip past it
    sched.release(slots[:1])
    assert sched.allocate() == []
    sched.release(slots[1:2])
    granted = sched.allocate()
    assert [k for k, _ in granted] == ["gang"] and len(granted[0][1]) == 3
    with pytest.raises(ValueError, match="needs 4 slots"):
        sched.enqueue("too-big", 0, 4, need=4)


def test_on_a_cluster_a_gang_gets_all_its_slots_on_one_node_and_keeps_its_place_in_the_queue():
    # Slots spread node by node, as engine/launch/ray/placement.py plans them: a, b, a, b.
    slots = [Slot(f"cpu{i}", "cpu", None, 1, node="ab"[i % 2]) for i in range(4)]
    sched = Scheduler(slots)
    sched.enqueue("single", 0, 0)
    [(_, [first])] = sched.allocate()
    assert first.node == "a"
    sched.enqueue("gang", 0, 1, need=2)
    sched.enqueue("late", 0, 2)
    (key, on_b), (_, [late]) = sched.allocate()  # the first two free slots are on b and a: b has two
    assert key == "gang" and [s.node for s in on_b] == ["b", "b"] and late.node == "a"
    sched.release([first])
    sched.enqueue("gang2", 0, 3, need=2)
    sched.enqueue("late2", 0, 4)
    assert sched.allocate() == []  # one slot free on a: gang2 waits, and late2 may not slip past it
    sched.release([late])
    [(key, on_a)] = sched.allocate()
    assert key == "gang2" and [s.node for s in on_a] == ["a", "a"]
    # Node b leaves: its gang moves whole to a node with room for both ranks, never split across two.
    sched.release(on_a)
    sched.resize([s for s in slots if s.node == "a"])
    moved = sched.refit(on_b)
    assert moved is not None and [s.node for s in moved] == ["a", "a"]


def test_on_a_cluster_a_gang_no_node_has_room_for_spans_the_fewest_nodes_grouped_by_node():
    # 3 free slots on a, 2 on b, 1 on c, in the node-by-node order a cluster's slots come in
    slots = [Slot(f"cpu{i}", "cpu", None, 1, node=n) for i, n in enumerate("abcaba")]
    sched = Scheduler(slots)
    sched.enqueue("gang", 0, 0, need=4)
    [(_, taken)] = sched.allocate()
    assert [s.node for s in taken] == ["a", "a", "a", "b"]  # two nodes, not three; rank 0's node first
    envs = [gangs.rank_env(r, 4, 29500, 0, 3, "r", "10.0.0.1", [s.node for s in taken]) for r in range(4)]
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) for e in envs] == [
        ("0", "3", "0", "2"), ("1", "3", "0", "2"), ("2", "3", "0", "2"), ("0", "1", "1", "2")]
    assert {e["MASTER_ADDR"] for e in envs} == {"10.0.0.1"} and [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    # Nodes b and c leave: 3 slots are left, so the gang waits; node d joins with 2, and the gang's own
    # live slots on a (which it held) count as room for it: it moves to a + d.
    live = [s for s in slots if s.node == "a"]
    sched.resize(live)
    assert sched.refit(taken) is None
    sched.resize(live + [Slot("cpu9", "cpu", None, 1, node="d"), Slot("cpu10", "cpu", None, 1, node="d")])
    moved = sched.refit(taken)
    assert moved is not None and sorted(s.node for s in moved) == ["a", "a", "a", "d"]


def test_a_node_that_left_under_any_rank_is_the_gangs_cause_so_no_restart_is_spent():
    gang, (r0, r1) = ranks(2)
    r1.cause = Intent.NODE_LEFT  # rank 1's node left; rank 0's collective failed first
    r0.exit(1)
    r1.exit(-signal.SIGKILL)
    assert gang.poll() is not None and gang.cause == Intent.NODE_LEFT


def ranks(n: int) -> tuple[gangs.GangHandle, list[FakeHandle]]:
    fakes = [FakeHandle(1000 + r) for r in range(n)]
    return gangs.GangHandle(fakes, linger=60.0, grace=5.0), fakes


def test_the_first_rank_to_fail_brings_the_others_down_and_is_the_gangs_exit():
    gang, (r0, r1) = ranks(2)
    assert gang.poll() is None and gang.pids == (1000, 1001)
    r1.exit(-signal.SIGKILL)
    assert gang.poll() is None and r0.signals == [signal.SIGTERM]  # rank 0 took the polite signal at once
    assert gang.poll() == -signal.SIGKILL and gang.failed_rank == 1 and gang.exit_rank == 1


def test_of_two_ranks_failing_together_the_one_whose_error_came_first_is_the_cause():
    # Regression: both exits seen in one pass named rank 0, whose "Connection closed by peer" was the echo.
    gang, (r0, r1) = ranks(2)
    gang.attach(lambda events: None)
    r1.on_events([WorkerError(pipeline="p", error="ValueError: bad sample", where="train", step=7)])
    r0.on_events([WorkerError(pipeline="p", error="RuntimeError: Connection closed by peer", where="train")])
    r0.code = r1.code = 1
    assert gang.poll() == 1 and gang.failed_rank == 1 and gang.errors[1].error == "ValueError: bad sample"


def test_what_every_rank_says_is_said_once():
    gang, (r0, r1) = ranks(2)
    got = []
    gang.attach(got.extend)
    nan = "training loss is nan at epoch 1 step 4 (step report)"
    r0.on_events([Notice(pipeline="p", level="warning", text=nan)])
    r1.on_events([Notice(pipeline="p", level="warning", text=nan),
                  Notice(pipeline="p", level="warning", text="only rank 1 says this")])
    assert [e.text for e in got] == [nan, "rank 1: only rank 1 says this"]


@pytest.mark.slow  # a pause of 2.4 s
def test_a_paused_gang_does_not_count_the_pause_against_max_time(monkeypatch):
    # Regression: rank 0 judged max_time in the last pause round, before the pause was credited.
    import torch.distributed as dist
    from multiprocessing import Pipe

    import torch

    from torchherd.engine.protocol.channel import ControlReceiver, encode_command
    from torchherd.engine.worker.control import WorkerControl
    from torchherd.engine.runners.task.distributed import Gang
    from torchherd.engine.protocol.messages import Pause, Unpause

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(gangs.take_port()))
    ours, theirs = Pipe()
    control = WorkerControl("p", sender=None, control=ControlReceiver(ours))
    gang = Gang.join(0, 1, torch.device("cpu"), timeout=30)
    try:
        # Seconds of training allowed, and a longer pause: what runs besides the pause (a loaded machine's
        # delays included) must stay under the budget, and the pause alone would spend it.
        budget, started = 2.0, time.monotonic()
        theirs.send_bytes(encode_command(Pause()))  # as a ChannelHandle sends commands down
        threading.Timer(2.4, lambda: theirs.send_bytes(encode_command(Unpause()))).start()
        time_up = gang.agree(control, save=lambda reason: None,
                             time_up=lambda: time.monotonic() - started - control.paused_time >= budget)
        assert control.paused_time >= 2.0 and not time_up
    finally:
        dist.destroy_process_group()


def test_a_signal_death_is_the_root_cause_over_its_peers_errors():
    gang, (r0, r1) = ranks(2)
    got = []
    gang.attach(got.extend)
    r0.on_events([WorkerError(pipeline="p", error="RuntimeError: Connection closed by peer", where="train")])
    r0.code, r1.code = 1, -signal.SIGKILL  # both seen in one pass: rank 0's error is the echo
    assert gang.poll() == -signal.SIGKILL and gang.failed_rank == 1 and gang.exit_rank == 1
    assert got == [] and gang.errors[0].error.startswith("RuntimeError")  # held until the cause is known
    cause, echoes = gang.told_errors()
    assert cause == [] and [n.text for n in echoes] == [
        "rank 0 failed after rank 1: RuntimeError: Connection closed by peer (a consequence; its log has the "
        "traceback)"]


def test_a_rank_that_finishes_gives_the_others_linger_seconds_then_they_are_ended():
    fakes = [FakeHandle(1), FakeHandle(2)]
    gang = gangs.GangHandle(fakes, linger=0.0, grace=5.0)
    fakes[1].exit(0)
    assert gang.poll() is None  # noticed: rank 0 has until linger to follow
    assert gang.poll() == -signal.SIGTERM and gang.failed_rank == 0  # it did not: ended, and that is a failure


def test_only_rank_0_speaks_for_the_pipeline_other_ranks_errors_and_notices_say_which_rank():
    gang, (r0, r1) = ranks(2)
    got = []
    gang.attach(got.extend)
    r1.on_events([StepMetrics(pipeline="p", epoch=0, step=1, loss=1.0, lr=0.1, samples_per_s=1.0),
                  Notice(pipeline="p", level="warning", text="checkpoint: none yet")])
    r0.on_events([StepMetrics(pipeline="p", epoch=0, step=1, loss=1.0, lr=0.1, samples_per_s=1.0)])
    assert [type(e).__name__ for e in got] == ["Notice", "StepMetrics"]
    assert got[0].text == "rank 1: checkpoint: none yet"
    gang.send("Stop")  # every rank hears it: a script gang's ranks obey each on their own
    assert r0.sent == r1.sent == ["Stop"]


def test_live_gangs_never_share_a_port():
    ports = [gangs.take_port() for _ in range(50)]
    try:
        assert len(set(ports)) == 50
    finally:
        for p in ports:
            gangs.release_port(p)


def test_rank_env_is_what_torchrun_sets():
    env = gangs.rank_env(1, 2, 29511, restarts=3, max_restarts=5, run_id="r")
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")} == {
        "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511", "TORCHELASTIC_RESTART_COUNT": "3"}


def test_a_gangs_slots_fit_the_device_column():
    from torchherd.tui.formats import fmt_device

    assert [fmt_device(d) for d in ("cpu1", "cpu0,cpu1", "gpu0,gpu1,gpu2,gpu3", "cpu10,cpu11", "gpu0,gpu2")] == \
        ["cpu1", "cpu0-1", "gpu0-3", "2×cpu", "2×gpu"]


def test_check_refuses_a_gang_larger_than_the_machine(tmp_path):
    toml = tmp_path / "big.toml"
    toml.write_text('[defaults]\ntask = "regression"\n[[pipelines]]\nname = "big"\nranks = 3\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 2\n')
    report = check_config(toml, inventory=inventory())
    assert not report.ok
    [problem] = report.problems
    assert problem.key == "pipelines[0].ranks" and "3 ranks need 3 device slots" in problem.message
    assert "big.toml" in str(problem)


def test_check_says_where_each_rank_goes(tmp_path):
    toml = tmp_path / "ok.toml"
    toml.write_text('[defaults]\ntask = "regression"\n[[pipelines]]\nname = "g"\nranks = 2\n'
                    '[[pipelines]]\nname = "after"\n[devices]\nplacement = "cpu"\ncpu_slots = 2\n')
    report = check_config(toml, inventory=inventory())
    assert report.ok, report.render()
    text = report.render()
    assert "g: task regression" in text and "a gang of 2 ranks on cpu0" in text
    assert "after: task regression" in text and "queued (#1), waiting for 1 CPU slot: cpu0, cpu1 held by this run (g)" in text


# ------------------------------------------------------------ real gangs

def checksums(run_dir: Path, name: str) -> dict[int, tuple[str, str]]:
    """rank -> (step, checksum) from the last line each rank's log printed about its weights."""
    out = {}
    for log in sorted((run_dir / name).glob("log*.txt")):
        for line in log.read_text().splitlines():
            m = CHECKSUM.search(line)
            if m:
                step = re.search(r"step (\d+)", line)
                out[int(m.group(1))] = (step.group(1) if step else "", m.group(2))
    return out


async def run_to_end(sup: Supervisor, timeout: float = 180.0) -> dict[str, str]:
    await sup.start()
    try:
        return await asyncio.wait_for(sup.wait(), timeout)
    finally:
        await sup.shutdown()


@pytest.mark.slow
async def test_a_task_gang_trains_on_both_ranks_and_ends_with_identical_weights(tmp_path):
    cfg = make_config(tmp_path, [{"name": "g", "ranks": 2, "max_epochs": 3, "params": {"samples": 256}}],
                      validation={"mode": "off"})
    sup = Supervisor(cfg, inventory=inventory())
    assert await run_to_end(sup) == {"g": "completed"}
    events = read_events(sup.run_dir)
    [started] = [e for e in events if isinstance(e, WorkerStarted)]
    assert started.device == "cpu0,cpu1" and len(started.pids) == 2
    ends = [e for e in events if isinstance(e, EpochEnd)]
    assert [e.step for e in ends] == [4, 8, 12]  # 256 samples, 2 ranks of 32-sample batches: 4 steps an epoch
    assert ends[-1].train_loss < ends[0].train_loss
    sums = checksums(sup.run_dir, "g")
    assert set(sums) == {0, 1} and sums[0] == sums[1]
    assert (sup.run_dir / "g" / "log-rank1.txt").exists()


@pytest.mark.slow
async def test_an_unmodified_ddp_script_runs_as_a_gang_as_under_torchrun(tmp_path):
    cfg = make_config(tmp_path, [{"name": "s", "ranks": 2, "script": DDP_SCRIPT, "args": ["--epochs", "2"],
                                  "metrics": EPOCH_LOSS}], validation={"mode": "off"}, defaults={"task": None})
    sup = Supervisor(cfg, inventory=inventory())
    assert await run_to_end(sup) == {"s": "completed"}
    events = read_events(sup.run_dir)
    # On a busy shared machine another process can take the rendezvous port between our look and rank 0's
    # bind; the gang then comes back and the script, which does not resume, trains again from the start.
    starts = [i for i, e in enumerate(events) if isinstance(e, WorkerStarted)]
    ends = [e for e in events[starts[-1]:] if isinstance(e, EpochEnd)]
    exits = [(e.rank, e.reason, e.exit_code) for e in events if isinstance(e, WorkerExited)]
    assert len(ends) == 2 and ends[1].train_loss < ends[0].train_loss, exits  # rank 0's lines only, once each
    sums = checksums(sup.run_dir, "s")
    assert set(sums) == {0, 1} and sums[0][1] == sums[1][1]


@pytest.mark.slow
async def test_killing_any_rank_brings_the_gang_down_and_back_until_it_completes(tmp_path):
    kills = 3
    cfg = make_config(tmp_path, [
        {"name": "g", "ranks": 2, "max_epochs": 6, "params": {"samples": 512, "delay": 0.004}},
        # solo trains until the test ends (shutdown kills it): on a loaded machine 200 epochs ran out mid-test
        {"name": "solo", "max_epochs": 1_000_000, "params": {"samples": 64, "delay": 0.002}},
    ], validation={"mode": "off"}, devices={"cpu_slots": 3}, restart={"max_restarts": kills + 1})
    sup = Supervisor(cfg, inventory=inventory(3))
    stream = sup.subscribe()
    rng = random.Random(7)
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted) and e.pipeline == "g", 120)
        for i in range(kills):
            await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "g", 120)
            rank = rng.randrange(2)
            os.kill(started.pids[rank], signal.SIGKILL)
            exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited) and e.pipeline == "g", 60)
            assert (exited.rank, exited.signal, exited.reason) == (rank, "SIGKILL", "crashed")
            assert exited.pid == started.pids[rank]
            assert not still_alive(list(started.pids), timeout=10.0)  # no rank left blocked in a collective
            # The solo pipeline trains on while the gang is down and coming back (in either order).
            seen: dict[str, object] = {}

            def restarted_and_solo_stepped(e) -> bool:
                if isinstance(e, WorkerStarted) and e.pipeline == "g":
                    seen["restart"] = e
                elif isinstance(e, StepMetrics) and e.pipeline == "solo":
                    seen["solo"] = e
                return len(seen) == 2

            await wait_for(stream, restarted_and_solo_stepped, 120)
            started = seen["restart"]
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 180)
        assert done.status == "completed" and done.step == 6 * 8  # 512 samples, 2 ranks of 32: 8 steps an epoch
    finally:
        await sup.shutdown(graceful=False)
    sums = checksums(sup.run_dir, "g")
    assert sums[0] == sums[1]


@pytest.mark.slow
async def test_a_stopped_rank_is_caught_as_a_hang_with_every_ranks_stack_in_the_logs(tmp_path):
    cfg = make_config(tmp_path, [{"name": "g", "ranks": 2, "max_epochs": 50, "params": {"samples": 512}}],
                      # not shorter: a 2-rank start on a loaded CI machine overran 3x 3 s and was "hung"
                      validation={"mode": "off"}, restart={"hang_timeout": 6.0, "max_restarts": 0})
    sup = Supervisor(cfg, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), 120)
        await wait_for(stream, lambda e: isinstance(e, StepMetrics), 120)
        os.kill(started.pids[1], signal.SIGSTOP)
        await wait_for(stream, lambda e: isinstance(e, WorkerStateChanged) and e.state == "hung", 60)
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited), 60)
        assert exited.reason == "hung"
        assert not still_alive(list(started.pids), timeout=10.0)
    finally:
        await sup.shutdown(graceful=False)
    for log in ("log.txt", "log-rank1.txt"):  # faulthandler's dump: "Thread 0x... (most recent call first)"
        assert "most recent call first" in (sup.run_dir / "g" / log).read_text(), log


@pytest.mark.slow
async def test_stop_lands_on_the_same_step_on_every_rank_and_resume_is_exact(tmp_path):
    pipe = {"name": "g", "ranks": 2, "max_epochs": 3, "params": {"samples": 512, "delay": 0.002}}
    whole = Supervisor(make_config(tmp_path / "whole", [pipe], validation={"mode": "off"}), inventory=inventory())
    assert await run_to_end(whole) == {"g": "completed"}

    cfg = make_config(tmp_path / "halves", [pipe], validation={"mode": "off"})
    sup = Supervisor(cfg, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= 10, 120)
        sup.checkpoint("g")
        saved = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request", 60)
        assert saved.step % 2 == 0  # taken where the ranks agree: a report step (log_every_n_steps = 2)
        sup.stop("g")
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), 60)
        assert done.status == "stopped" and 0 < done.step < 24
    finally:
        await sup.shutdown()
    stopped = checksums(sup.run_dir, "g")
    assert stopped[0] == stopped[1] and stopped[0][0] == str(done.step)  # same step, same weights

    again = Supervisor.resume_run(sup.run_dir, inventory=inventory())
    assert await run_to_end(again) == {"g": "completed"}
    assert checksums(again.run_dir, "g") == checksums(whole.run_dir, "g")  # as if never stopped


@pytest.mark.slow
async def test_two_gangs_train_at_once_on_ports_of_their_own(tmp_path):
    cfg = make_config(tmp_path, [{"name": f"g{i}", "ranks": 2, "max_epochs": 2, "params": {"samples": 128}}
                                 for i in range(2)], validation={"mode": "off"}, devices={"cpu_slots": 4})
    sup = Supervisor(cfg, inventory=inventory(4))
    assert await run_to_end(sup) == {"g0": "completed", "g1": "completed"}
    for name in ("g0", "g1"):
        assert '"world_size": 2' in (sup.run_dir / name / "worker.json").read_text()
        assert checksums(sup.run_dir, name)[0] == checksums(sup.run_dir, name)[1]


@pytest.mark.slow
async def test_a_paused_gang_reports_no_steps_raises_no_hang_alarm_and_resumes(tmp_path):
    cfg = make_config(tmp_path, [{"name": "g", "ranks": 2, "max_epochs": 2, "params": {"samples": 512, "delay": 0.002}}],
                      validation={"mode": "off"}, restart={"hang_timeout": 6.0, "max_restarts": 0})
    sup = Supervisor(cfg, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics), 120)
        sup.pause("g")
        await wait_for(stream, lambda e: isinstance(e, WorkerStateChanged) and e.state == "paused", 10)
        # Reports already on their way may land; then nothing for 1.5x hang_timeout, and no alarm.
        later: list = []

        def note(event) -> bool:  # never satisfied: collects what arrives while paused
            if isinstance(event, (StepMetrics, WorkerStateChanged)):
                later.append(event)
            return False

        with pytest.raises(asyncio.TimeoutError):
            await wait_for(stream, note, timeout=9.0)
        assert not [e for e in later if isinstance(e, WorkerStateChanged)], later  # no hang alarm
        assert len(later) <= 1, later  # at most the report that was on its way
        sup.unpause("g")
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), 120)
        assert done.status == "completed"
    finally:
        await sup.shutdown()
    sums = checksums(sup.run_dir, "g")
    assert sums[0] == sums[1]


@pytest.mark.slow
def test_a_sigkilled_torchherd_takes_every_rank_of_a_gang_with_it(tmp_path):
    from tests.faults.support import HeadlessCli, is_alive, write_toml

    toml = write_toml(tmp_path / "gang.toml", f"""
[[pipelines]]
name = "g"
task = "{Path(__file__).parent.as_posix()}/tasks/tiny.py:build"
ranks = 2
max_epochs = 1000
params = {{ samples = 512, delay = 0.002 }}
[devices]
placement = "cpu"
cpu_slots = 2
[telemetry]
enabled = false
""")
    cli = HeadlessCli(toml, tmp_path / "runs")
    try:
        started = cli.wait_records(lambda recs: [r for r in recs if r["type"] == "worker_started"], 120,
                                   "the gang to start")[0]
        cli.wait_records(lambda recs: any(r["type"] == "step" for r in recs), 120, "a step")
        ranks = [p for p in cli.known if p.pid in started["pids"]]
        assert len(ranks) == 2
        cli.kill_supervisor()
        assert not still_alive([p.pid for p in ranks], timeout=5.0)
        assert not [p for p in ranks if is_alive(p)]
    finally:
        leftovers = cli.cleanup()
    assert not leftovers
