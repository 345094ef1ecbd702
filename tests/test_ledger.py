"""The machine-wide ledger and the grant decision: leases that die with their holder, requests for several GPUs
or a share of one, foreign processes, keep_free, and requests no state of the machine could grant.

The grant logic is tested on hand-made slots (it does no I/O); the ledger on real files, locks and a real
process that dies holding a lease.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from torchherd.engine.config.problems import display_path
from torchherd.engine.hardware.devices import GpuInfo
from torchherd.engine.hardware.grants import Policy, Request, Wait, grant, leases_for, request_of
from torchherd.engine.hardware.ledger import Lease, Ledger
from torchherd.engine.hardware.occupancy import NVLINK, Foreign, GpuOccupancy
from torchherd.engine.preflight.plan import gang_problems
from torchherd.engine.hardware.slots import Slot
from tests.conftest import REPO, make_config, repo_env

GiB = 1 << 30


def gpu_pool(count: int = 4, memory: int = 80 * GiB) -> list[Slot]:
    return [Slot(f"gpu{i}", "cuda", GpuInfo(i, "NVIDIA A100", f"GPU-{i}", memory), 1) for i in range(count)]


def cpu_pool(count: int = 2) -> list[Slot]:
    return [Slot(f"cpu{i}", "cpu", None, 1) for i in range(count)]


def lease(device: str, run: str = "other", memory: int | None = None, pipeline: str = "p") -> Lease:
    return Lease(device=device, run=run, pipeline=pipeline, memory=memory)


FOREIGN = {1: GpuOccupancy(1, 80 * GiB, 31 * GiB, (Foreign(4242, 30 * GiB, "bob"),))}


# ------------------------------------------------------------ the grant


def test_cpu_slots_another_run_holds_are_not_granted_and_the_wait_names_the_run():
    got = grant(Request(ranks=2), cpu_pool(), [lease("cpu0", run="20261128-0408-a")], run="mine")
    assert isinstance(got, Wait)
    assert got.why == "waiting for 2 CPU slots: cpu0 held by run 20261128-0408-a (you)"
    assert [s.name for s in grant(Request(ranks=1), cpu_pool(), [lease("cpu0")], run="mine")] == ["cpu1"]


def test_whole_gpu_requests_skip_a_gpu_a_foreign_process_holds():
    got = grant(Request(ranks=3), gpu_pool(), [], "mine", FOREIGN)
    assert [s.name for s in got] == ["gpu0", "gpu2", "gpu3"]
    wait = grant(Request(ranks=4), gpu_pool(), [], "mine", FOREIGN)
    assert isinstance(wait, Wait) and "gpu1 held by pid 4242 (user bob, 30 GiB)" in wait.why


def test_memory_shares_pack_on_the_foreign_gpu_up_to_its_free_memory():
    pool = gpu_pool(2)
    held = [lease("gpu0")]  # gpu0 is another run's, whole: only gpu1's 50 GiB remain for shares
    for name in ("a", "b"):
        share = grant(Request(memory=20 * GiB), pool, held, "mine", FOREIGN)
        assert [(s.name, s.memory) for s in share] == [("gpu1", 20 * GiB)]
        held += leases_for(share, "mine", name, 0)
    # a gang's ranks never share one GPU (NCCL refuses two ranks on one): the second rank has nowhere to go
    assert isinstance(grant(Request(ranks=2, memory=GiB), pool, held[:1], "mine", FOREIGN), Wait)
    wait = grant(Request(memory=20 * GiB), pool, held, "mine", FOREIGN)  # 10 GiB left on gpu1
    assert isinstance(wait, Wait) and "gpu1 10.0 GiB free" in wait.why
    assert "pid 4242" in wait.why and "gpu0 held by run other (you)" in wait.why
    assert grant(Request(memory=10 * GiB), pool, held, "mine", FOREIGN)[0].name == "gpu1"


def test_a_share_takes_the_tightest_fit_so_whole_gpus_stay_whole():
    pool = gpu_pool(3)
    held = [lease("gpu2", memory=60 * GiB)]
    [slot] = grant(Request(memory=10 * GiB), pool, held, "mine")
    assert slot.name == "gpu2"
    assert grant(Request(gpus=1), pool, held + leases_for([slot], "mine", "s", 0), "mine")[0].name == "gpu0"


def test_share_exclusive_keeps_shares_off_a_gpu_someone_else_uses():
    got = grant(Request(memory=GiB), gpu_pool(2), [lease("gpu0")], "mine", FOREIGN, policy=Policy(share="exclusive"))
    assert isinstance(got, Wait)


def test_keep_free_leaves_gpus_wholly_free_for_others():
    got = grant(Request(ranks=3), gpu_pool(4), [], "mine", policy=Policy(keep_free=2))
    assert isinstance(got, Wait) and "keep_free = 2" in got.why
    assert len(grant(Request(ranks=2), gpu_pool(4), [], "mine", policy=Policy(keep_free=2))) == 2


def test_two_gpus_per_rank_go_to_nvlink_pairs():
    # NVLink joins 0-2 and 1-3; every other pair crosses the CPUs
    links = {(0, 2): NVLINK, (1, 3): NVLINK, (0, 1): 50, (0, 3): 50, (1, 2): 50, (2, 3): 50}
    slots = grant(Request(ranks=2, gpus=2), gpu_pool(4), [], "mine", links=links)
    assert [[g.index for g in s.gpus] for s in slots] == [[0, 2], [1, 3]]
    assert [s.name for s in slots] == ["gpu0+gpu2", "gpu1+gpu3"]
    held = leases_for(slots[:1], "mine", "a", 0)
    assert {x.device for x in held} == {"gpu0", "gpu2"}
    [alone] = grant(Request(gpus=2), gpu_pool(4), held, "mine", links=links)
    assert [g.index for g in alone.gpus] == [1, 3]


def test_requests_no_state_of_the_machine_could_grant_are_config_errors(tmp_path):
    pool = gpu_pool(2)
    config = make_config(tmp_path, [{"name": "wide", "gpus_per_rank": 3}, {"name": "big", "gpu_memory": "100GiB"},
                                    {"name": "both", "gpus_per_rank": 2, "gpu_memory": 0.5},
                                    {"name": "fits", "gpus_per_rank": 2, "gpu_memory": None}])
    problems = {p.key: p.message for p in gang_problems(config, pool)}
    assert set(problems) == {"pipelines[0].gpus_per_rank", "pipelines[1].gpu_memory", "pipelines[2].gpu_memory"}
    assert "need 3 GPUs at once; this machine gives 2 (gpu0, gpu1)" in problems["pipelines[0].gpus_per_rank"]
    assert "100.0 GiB is more than the largest GPU here has (80.0 GiB)" in problems["pipelines[1].gpu_memory"]
    on_cpu = {p.key: p.message for p in gang_problems(config, cpu_pool())}
    assert "asks for GPUs, but this run has CPU slots only" in on_cpu["pipelines[0].gpus_per_rank"]


def test_gpu_memory_reads_bytes_or_a_fraction_and_refuses_anything_else(tmp_path):
    from torchherd.engine.config.load import parse_config
    from torchherd.engine.config.problems import ConfigError

    pool = gpu_pool(2, memory=40 * GiB)
    config = make_config(tmp_path, [{"name": "a", "gpu_memory": "6GiB"}, {"name": "b", "gpu_memory": 0.25}])
    assert [request_of(p, pool).memory for p in config.pipelines] == [6 * GiB, 10 * GiB]
    with pytest.raises(ConfigError) as info:
        parse_config({"pipelines": [{"name": "a", "task": "regression", "gpu_memory": "6 parsecs"}]},
                     str(tmp_path / "bad.toml"), tmp_path)
    [problem] = info.value.problems
    assert problem.key == "pipelines[0].gpu_memory" and "'6GiB'" in problem.message
    assert display_path(tmp_path / "bad.toml") in str(problem)


# ------------------------------------------------------------ the ledger on files


def test_two_ledgers_on_one_folder_see_each_others_leases_until_given_back(tmp_path):
    folder = tmp_path / "ledger"
    a, b = Ledger(folder), Ledger(folder)
    assert folder.stat().st_mode & 0o777 == 0o700  # the user's alone
    with a.locked() as held:
        assert held == []
        a.take([lease("cpu0", run="a")])
    with b.locked() as held:
        assert [x.device for x in held] == ["cpu0"]
    a.give_back([lease("cpu0", run="a")])
    with b.locked() as held:
        assert held == []


HOLD = """
import sys, time
from torchherd.engine.hardware.ledger import Lease, Ledger
ledger = Ledger(sys.argv[1])
with ledger.locked():
    ledger.take([Lease(device="cpu0", run="doomed", pipeline="p")])
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_lease_dies_with_the_process_that_held_it(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=repo_env(), cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        ours = Ledger(tmp_path)
        assert [x.run for x in ours.leases()] == ["doomed"]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
        with ours.locked() as held:
            assert held == []  # the kernel dropped the lock with the process; the file went with this grant
        assert not list(Path(tmp_path).glob("*.lease"))
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------ the order across runs


def test_across_runs_the_higher_priority_waiter_gets_the_freed_slot_first(tmp_path):
    from torchherd.engine.supervise.scheduler import Scheduler

    folder = tmp_path / "ledger"
    holder, low, high = (Scheduler(cpu_pool(), Ledger(folder), run) for run in ("holder", "low", "high"))
    try:
        holder.enqueue("h1", 0, 0)
        holder.enqueue("h2", 0, 1)
        assert [k for k, _ in holder.allocate()] == ["h1", "h2"]
        low.enqueue("l", priority=0, order=0)
        assert low.allocate() == [] and low.waits["l"] == "waiting for 1 CPU slot: cpu0, cpu1 held by run holder (you)"
        high.enqueue("h", priority=5, order=0)
        assert high.allocate() == []  # announced: it waits too
        [(_, slots)] = [(k, s) for k, s in holder._grants.items() if k == "h1"]
        holder.release(slots, "h1")
        assert low.allocate() == [] and low.waits["l"] == "waiting behind h of run high (you, priority 5)"
        assert [(k, [s.name for s in got]) for k, got in high.allocate()] == [("h", ["cpu0"])]
    finally:
        for s in (holder, low, high):
            s.close()


def test_a_waiter_for_other_devices_is_no_rival(tmp_path):
    from torchherd.engine.supervise.scheduler import Scheduler

    folder = tmp_path / "ledger"
    pool = gpu_pool(2)
    first, second = Scheduler(pool[:1], Ledger(folder), "first"), Scheduler(pool[1:], Ledger(folder), "second")
    blocker = Ledger(folder)
    try:
        with blocker.locked():
            blocker.take([lease("gpu0", run="blocker")])
        first.enqueue("a", priority=9, order=0)
        assert first.allocate() == []  # gpu0 is held: it waits, announced
        second.enqueue("b", priority=0, order=0)
        assert [k for k, _ in second.allocate()] == ["b"]  # gpu1 is none of first's business
    finally:
        for s in (first, second):
            s.close()
        blocker.close()


def test_a_run_waiting_for_its_own_pipelines_only_is_a_queue_and_says_no_more(tmp_path):
    # A sweep's 48 trials on 8 slots would otherwise tell every trial's wait again at every grant.
    from torchherd.engine.supervise.scheduler import Scheduler

    sched = Scheduler(cpu_pool(1), Ledger(tmp_path / "ledger"), "mine")
    try:
        for i in range(3):
            sched.enqueue(f"t{i}", 0, i)
        assert [k for k, _ in sched.allocate()] == ["t0"]
        assert sched.waits == {} and sched.position("t1") == 1
    finally:
        sched.close()


def test_a_waiter_that_leaves_the_queue_holds_up_no_other_run(tmp_path):
    # A run shutting down dequeues its waiters without another grant pass: they must not stay announced.
    from torchherd.engine.supervise.scheduler import Scheduler

    folder = tmp_path / "ledger"
    holder, first, second = (Scheduler(cpu_pool(1), Ledger(folder), run) for run in ("holder", "first", "second"))
    try:
        holder.enqueue("h", 0, 0)
        holder.allocate()
        first.enqueue("f", priority=5, order=0)
        first.allocate()
        second.enqueue("s", priority=0, order=0)
        holder.release(holder._grants["h"], "h")
        assert second.allocate() == [] and "waiting behind f of run first" in second.waits["s"]
        first.dequeue("f")
        assert [k for k, _ in second.allocate()] == ["s"]
    finally:
        for s in (holder, first, second):
            s.close()
