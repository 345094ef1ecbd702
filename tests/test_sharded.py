"""Sharded (`fsdp`) Task gangs: FSDP2 over real gloo ranks on the CPU, DCP checkpoints that reshard on resume.

Logic first (sharding a model, the optimizer over its shards, `check`), then real gangs: the same loss
as DDP, background validation of gathered weights, a SIGKILLed rank, 4 -> 2 -> 4 ranks.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import torch

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import (CheckpointSaved, EpochEnd, Notice, PipelineFinished, Resumed,
                                                StepMetrics, ValResult, WorkerStarted)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import make_config, wait_for

TASKS = Path(__file__).parent / "tasks"
LAYERED = f"{TASKS / 'layered.py'}:build"
CHECKSUM = re.compile(r"rank (\d+) step (\d+) weights checksum (\S+) \((\d+) parameters held\)")
# FSDP2 reduce-scatters the gradients DDP all-reduces: the same sums, in another order (float32)
LOSS_TOLERANCE = 1e-5  # relative
EPOCH_LOSS = r"Epoch (?P<epoch>\d+), Loss: (?P<loss>[-+.\deE]+)"


def inventory(cores: int = 2) -> Inventory:
    return Inventory(cpu_count=cores, note="no NVIDIA GPU (test inventory)")


def held(run_dir: Path, name: str) -> dict[int, tuple[int, float, int]]:
    """rank -> (step, weights checksum, parameters it held) from the last such line of each rank's log."""
    out = {}
    for log in sorted((run_dir / name).glob("log*.txt")):
        for m in CHECKSUM.finditer(log.read_text()):
            out[int(m.group(1))] = (int(m.group(2)), float(m.group(3)), int(m.group(4)))
    return out


async def run_to_end(sup: Supervisor, timeout: float = 240.0) -> dict[str, str]:
    await sup.start()
    try:
        return await asyncio.wait_for(sup.wait(), timeout)
    finally:
        await sup.shutdown()


def fsdp(name: str = "f", ranks: int = 2, **extra) -> dict:
    return {"name": name, "task": LAYERED, "ranks": ranks, "strategy": "fsdp", **extra}


# ------------------------------------------------------------ logic

def test_each_child_with_parameters_becomes_a_unit_and_the_optimizer_follows_the_shards():
    from torchherd.engine.runners.task.sharded import default_units, optimizer_over

    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    assert default_units(net) == [net[0], net[2]]  # the ReLU holds nothing to shard
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    names = {id(p): n for n, p in net.named_parameters()}
    net[0].weight = torch.nn.Parameter(net[0].weight.detach().clone())  # as fully_shard replaces parameters
    assert optimizer_over(opt, net, names).param_groups[0]["params"][0] is net[0].weight
    made = optimizer_over(lambda ps: torch.optim.Adam(ps), net, names)
    assert isinstance(made, torch.optim.Adam) and len(made.param_groups[0]["params"]) == 4


def test_a_shard_that_is_not_module_classes_or_a_function_is_refused_saying_what_it_must_be():
    from torchherd.engine.runners.task.api import Task, TaskError, check_task

    net = torch.nn.Linear(2, 1)
    task = Task(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), train_data=[], loss_fn=len,
                shard=["Linear"])
    with pytest.raises(TaskError, match=r"build returned a Task whose shard is neither a list of torch.nn.Module"):
        check_task("layered.py:build", task)
    check_task("layered.py:build", Task(model=net, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                        train_data=[], loss_fn=len, shard=[torch.nn.Linear]))


def test_check_takes_fsdp_for_a_task_gang_on_cpu_and_says_how_it_validates(tmp_path):
    report = check_gang(tmp_path, LAYERED, "fsdp", mode="background")
    assert report.ok, report.problems
    plan = "\n".join(report.lines)
    assert "sharded by FSDP2" in plan and "gathers the whole weights to rank 0" in plan


def test_a_checkpoint_folder_counts_only_once_whole_and_a_temporary_one_never(tmp_path):
    from torchherd.engine.runners.task.sharded_checkpoint import find_latest

    def folder(name: str, *files: str) -> Path:
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("{\"world_size\": 2}")
        return tmp_path / name

    whole = (".metadata", "__0_0.distcp", "trainer.pt", "torchherd.json")
    folder(".last.dcp.12.tmp", *whole)  # every rank wrote, but rank 0 was killed before the rename
    assert find_latest(tmp_path) is None
    prev = folder("prev.dcp", *whole)
    folder("last.dcp", "__0_0.distcp", "trainer.pt", "torchherd.json")  # no DCP metadata: not every rank finished
    assert find_latest(tmp_path) == prev


def check_gang(tmp_path: Path, task: str, strategy: str, mode: str = "inline", extra: str = ""):
    from torchherd.engine.preflight.check import check_config

    config = tmp_path / "c.toml"
    config.write_text(f'[devices]\nplacement = "cpu"\ncpu_slots = 2\n[validation]\nmode = "{mode}"\n'
                      f'[[pipelines]]\nname = "g"\ntask = "{task.replace(os.sep, "/")}"\nranks = 2\n'
                      f'strategy = "{strategy}"\n{extra}')
    return check_config(config, inventory=inventory())


@pytest.mark.parametrize("task,strategy,why", [
    (f"lightning:{TASKS / 'lit_gang.py'}:LitRegression", "deepspeed", "needs CUDA GPUs"),
    (f"lightning:{TASKS / 'lit_gang.py'}:LitRegression", "fsdp", "FSDPStrategy refuses accelerator='cpu'"),
    (LAYERED, "deepspeed", "is Lightning's"),
])
def test_check_refuses_what_cannot_train_here_naming_the_key(tmp_path, task, strategy, why):
    report = check_gang(tmp_path, task, strategy)
    assert not report.ok
    [problem] = report.problems
    assert problem.key == "pipelines[0].strategy" and why in problem.message, problem


@pytest.mark.parametrize("strategy,group,why", [("fsdp", 3, "3 does not divide ranks = 2"),
                                                ("ddp", 2, "only with strategy = \"fsdp\"")])
def test_a_shard_group_that_cannot_be_is_refused_naming_the_key(tmp_path, strategy, group, why):
    report = check_gang(tmp_path, LAYERED, strategy, extra=f"shard_group = {group}\n")
    [problem] = report.problems
    assert problem.key == "pipelines[0].shard_group" and why in problem.message, problem


# ------------------------------------------------------------ real gangs

def score(state: dict, val_data) -> float:
    """The mean squared error of the layered model with weights `state` over `val_data`, per sample."""
    sys.path.insert(0, str(TASKS))
    from layered import model

    net = model()
    net.load_state_dict(state)
    with torch.no_grad():
        x = torch.stack([val_data[i][0] for i in range(len(val_data))])
        y = torch.stack([val_data[i][1] for i in range(len(val_data))])
        return float(torch.nn.functional.mse_loss(net(x), y))


@pytest.mark.slow
async def test_an_fsdp_gang_holds_half_the_weights_each_trains_to_the_ddp_loss_and_is_validated_whole(tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    same = {"max_epochs": 2, "params": {"samples": 128}}
    cfg = make_config(tmp_path, [fsdp("f", **same), {"name": "d", "task": LAYERED, "ranks": 2, **same}],
                      validation={"mode": "background"}, devices={"cpu_slots": 4})
    sup = Supervisor(cfg, inventory=inventory(4))
    assert await run_to_end(sup) == {"f": "completed", "d": "completed"}
    events = read_events(sup.run_dir)
    losses = {n: [e.train_loss for e in events if isinstance(e, EpochEnd) and e.pipeline == n] for n in "fd"}
    assert len(losses["f"]) == 2 and losses["f"][1] < losses["f"][0]
    assert losses["f"] == pytest.approx(losses["d"], rel=LOSS_TOLERANCE)
    shards, whole = held(sup.run_dir, "f"), held(sup.run_dir, "d")
    total = whole[0][2]  # DDP: every rank holds every parameter
    assert set(shards) == {0, 1} and sum(s[2] for s in shards.values()) == total
    assert all(0.4 * total <= s[2] <= 0.6 * total for s in shards.values()), shards
    assert shards[0][1] == pytest.approx(whole[0][1], rel=LOSS_TOLERANCE)
    # The validator scored rank 0's gathered weights: the same number as scoring the final weights here.
    [val] = [e for e in events if isinstance(e, ValResult) and e.pipeline == "f" and e.step == 4]
    ckpt = sup.run_dir / "f" / "checkpoints" / "last.dcp"
    assert json.loads((ckpt / "torchherd.json").read_text())["world_size"] == 2
    dcp_to_torch_save(str(ckpt), str(tmp_path / "plain.pt"))  # the README's one-liner
    state = torch.load(tmp_path / "plain.pt", weights_only=True)["model"]
    sys.path.insert(0, str(TASKS))
    from tiny import Slow

    assert val.metrics["val_loss"] == pytest.approx(score(state, Slow(64, 0.0, 2)), rel=1e-6)


RESUMED = re.compile(r"resumed at step (\d+) with weights checksum (\S+)")


def resumed_at(run_dir: Path, name: str) -> list[tuple[int, float]]:
    """(step, weights checksum) of each resume rank 0's log tells of, in order."""
    return [(int(m.group(1)), float(m.group(2))) for m in RESUMED.finditer((run_dir / name / "log.txt").read_text())]


@pytest.mark.slow
async def test_a_sigkilled_rank_brings_the_gang_back_from_its_sharded_checkpoint(tmp_path):
    cfg = make_config(tmp_path, [fsdp(max_epochs=4, params={"samples": 512, "delay": 0.002})],
                      validation={"mode": "off"}, restart={"max_restarts": 2})
    sup = Supervisor(cfg, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), 120)
        saved = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch", 120)
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step > saved.step, 60)  # mid-epoch
        os.kill(started.pids[1], signal.SIGKILL)
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed), 120)
        assert resumed.path.endswith("last.dcp") and resumed.step >= saved.step  # at most one interval lost
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), 180)
        assert done.status == "completed" and done.step == 4 * 8  # 512 samples, 2 ranks of 32: 8 steps an epoch
    finally:
        await sup.shutdown(graceful=False)
    assert resumed_at(sup.run_dir, "f")[0][0] == resumed.step


def set_ranks(run_dir: Path, ranks: int) -> None:
    """Edit `ranks` in the run's resolved config, as a person does before `torchherd resume`."""
    path = run_dir / "config.json"
    configs = json.loads(path.read_text())
    configs[0]["pipelines"][0]["ranks"] = ranks
    path.write_text(json.dumps(configs))


async def stop_after(sup: Supervisor, steps: int) -> tuple[PipelineFinished, list[StepMetrics]]:
    """Start `sup`, stop its pipeline once `steps` more steps are reported; (how it ended, its reports)."""
    stream = sup.subscribe()
    await sup.start()
    reports: list[StepMetrics] = []
    try:
        first = await wait_for(stream, lambda e: isinstance(e, StepMetrics), 180)
        reports.append(first)
        later = await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step >= first.step + steps, 120)
        reports.append(later)
        sup.stop("f")
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), 120)
    finally:
        await sup.shutdown()
    return done, reports


@pytest.mark.slow
async def test_a_sharded_checkpoint_of_4_ranks_resumes_on_2_and_back_on_4_where_it_stopped(tmp_path):
    from tests.test_resume import cli

    cfg = make_config(tmp_path, [fsdp(ranks=4, max_epochs=3, params={"samples": 512, "delay": 0.002})],
                      validation={"mode": "off"}, devices={"cpu_slots": 4})
    sup = Supervisor(cfg, inventory=inventory(4))
    first, reports = await stop_after(sup, 4)  # 4 ranks of 32: 4 steps an epoch, so it stops mid-epoch 2
    assert first.status == "stopped"
    stopped = held(sup.run_dir, "f")
    assert len(stopped) == 4 and json.loads(
        (sup.run_dir / "f" / "checkpoints" / "last.dcp" / "torchherd.json").read_text())["world_size"] == 4

    set_ranks(sup.run_dir, 2)
    two = Supervisor.resume_run(sup.run_dir, inventory=inventory(4))
    second, _ = await stop_after(two, 2)
    events = read_events(sup.run_dir)
    [resumed] = [e for e in events if isinstance(e, Resumed)]
    assert resumed.step == first.step and resumed.note == "resharded: written by 4 ranks, loaded by 2"
    assert any(isinstance(e, Notice) and "f from its last sharded checkpoint (written by 4 ranks, resharded to 2)"
               in e.text for e in events)  # the resume plan says so before anything starts
    assert resumed_at(sup.run_dir, "f")[0] == (first.step, pytest.approx(stopped[0][1], rel=1e-9))
    assert any(isinstance(e, WorkerStarted) and e.device == "cpu0,cpu1" for e in events)

    stopped_two = held(sup.run_dir, "f")
    assert stopped_two[0][0] == second.step
    set_ranks(sup.run_dir, 4)
    again = cli("resume", str(sup.run_dir), "--headless")
    text, _ = again.communicate(timeout=240)
    assert again.returncode == 0, text
    events = read_events(sup.run_dir)
    resumes = [e for e in events if isinstance(e, Resumed)]
    assert resumes[-1].step == second.step and "written by 2 ranks, loaded by 4" in resumes[-1].note
    assert resumed_at(sup.run_dir, "f")[-1] == (second.step, pytest.approx(stopped_two[0][1], rel=1e-9))
    done = [e for e in events if isinstance(e, PipelineFinished)][-1]
    assert done.status == "completed" and done.epoch == 3
    # No restart from scratch: every report after a resume is well below the run's first one.
    after = [e.loss for e in events if isinstance(e, StepMetrics) and e.step > first.step]
    assert after and max(after) < reports[0].loss


@pytest.mark.slow
async def test_hsdp_on_4_ranks_as_2_groups_of_2_trains_and_resumes(tmp_path):
    cfg = make_config(tmp_path, [fsdp(ranks=4, shard_group=2, max_epochs=2, params={"samples": 512})],
                      validation={"mode": "off"}, devices={"cpu_slots": 4})
    sup = Supervisor(cfg, inventory=inventory(4))
    first, _ = await stop_after(sup, 2)
    assert first.status == "stopped"
    stopped = held(sup.run_dir, "f")
    sys.path.insert(0, str(TASKS))
    from layered import model

    total = sum(p.numel() for p in model().parameters())
    # Two copies, each sharded over a group of two: every rank holds about half, and all end alike.
    assert len(stopped) == 4 and all(0.4 * total <= s[2] <= 0.6 * total for s in stopped.values()), stopped
    assert len({s[1] for s in stopped.values()}) == 1

    again = Supervisor.resume_run(sup.run_dir, inventory=inventory(4))
    assert await run_to_end(again) == {"f": "completed"}
    [resumed] = [e for e in read_events(sup.run_dir) if isinstance(e, Resumed)]
    assert resumed.step == first.step and resumed.note == ""
    assert resumed_at(sup.run_dir, "f")[0] == (first.step, pytest.approx(stopped[0][1], rel=1e-9))


@pytest.mark.slow
async def test_mixed_precision_is_fsdp2s_policy_and_trains_in_bf16_and_fp16(tmp_path):
    both = {"max_epochs": 2, "params": {"samples": 128}}
    cfg = make_config(tmp_path, [fsdp("b", precision="bf16-mixed", **both), fsdp("h", precision="16-mixed", **both),
                                 fsdp("f", **both)], validation={"mode": "off"}, devices={"cpu_slots": 6})
    sup = Supervisor(cfg, inventory=inventory(6))
    assert await run_to_end(sup) == {"b": "completed", "h": "completed", "f": "completed"}
    events = read_events(sup.run_dir)
    losses = {n: [e.train_loss for e in events if isinstance(e, EpochEnd) and e.pipeline == n] for n in "bhf"}
    assert losses["b"][1] < losses["b"][0] and losses["h"][1] < losses["h"][0]
    # bf16 compute, float32 shards and gradient reduction: within bf16's 3 significant digits of float32
    assert losses["b"] == pytest.approx(losses["f"], rel=1e-2)


@pytest.mark.slow
async def test_a_script_using_fsdp2_and_dcp_itself_runs_unchanged_and_resumes_on_more_ranks(tmp_path):
    script = str(TASKS / "scripts" / "fsdp_dcp.py")
    cfg = make_config(tmp_path, [{"name": "s", "ranks": 2, "script": script, "metrics": EPOCH_LOSS,
                                  "args": ["--epochs", "3", "--checkpoint", "{checkpoint_dir}",
                                           "--fail-once", str(tmp_path / "failed")],
                                  "resume_args": ["--resume"]}],
                      validation={"mode": "off"}, defaults={"task": None}, devices={"cpu_slots": 4},
                      restart={"max_restarts": 0})
    sup = Supervisor(cfg, inventory=inventory(4))
    assert await run_to_end(sup) == {"s": "failed"}  # on purpose, after its first epoch's checkpoint
    set_ranks(sup.run_dir, 4)
    again = Supervisor.resume_run(sup.run_dir, inventory=inventory(4))
    assert await run_to_end(again) == {"s": "completed"}
    log = (sup.run_dir / "s" / "log.txt").read_text()
    assert "fsdp_dcp: resumed after epoch 0 on 4 ranks" in log, log[-2000:]
    epochs = [e.epoch for e in read_events(sup.run_dir) if isinstance(e, EpochEnd)]
    assert epochs == [0, 1, 2], epochs  # epoch 0 once: the resumed gang went on from its checkpoint
