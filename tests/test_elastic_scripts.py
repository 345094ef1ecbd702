"""Elastic script gangs (ranks = "MIN:MAX" with `script`): allowed by check when the script resumes itself and
refused when nothing tells it to, `keep` refused; the resize said without batch figures torchherd does not know;
then a real 2-rank gloo script that loses a rank to a pipeline of higher priority, resumes from its own checkpoint
at WORLD_SIZE 1 and completes."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import make_config, wait_for
from tests.test_elastic import inventory
from tests.test_headless_lines import printed
from torchherd.engine.preflight.check import check_config
from torchherd.engine.protocol.messages import GangResized, PipelineFinished, StepMetrics, WorkerStarted
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.tui.screens.ranks import resize_lines

SCRIPT = str(Path(__file__).parent / "tasks" / "scripts" / "elastic_loop.py")
STEP = r"step (?P<step>\d+) loss (?P<loss>[-+.\deE]+)"
RESUME = 'resume_args = ["--resume", "{checkpoint_dir}/ckpt.pt"]'


def _check(tmp_path: Path, lines: str):
    toml = tmp_path / "elastic.toml"
    toml.write_text(f'[[pipelines]]\nname = "g"\nranks = "1:2"\nscript = "train.py"\n{lines}\n'
                    '[devices]\nplacement = "cpu"\ncpu_slots = 2\n')
    return check_config(toml, inventory=inventory())


def test_check_allows_an_elastic_script_that_resumes_itself_and_plans_it(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    report = _check(tmp_path, RESUME)
    assert report.ok, report.render()
    [line] = [ln for ln in report.lines if ln.startswith("g: script train.py")]
    assert ", restarted at each new size from its newest checkpoint -> an elastic gang of 2 ranks (1 to 2) on " \
        "cpu0" in line, line
    (tmp_path / "train.py").write_text("import torchherd.client as herd\nstate = herd.resume_from()\n")
    assert _check(tmp_path, "").ok


def test_check_refuses_an_elastic_script_that_nothing_tells_to_resume(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    [problem] = _check(tmp_path, "").problems
    assert problem.key == "pipelines[0].ranks" and "\n" not in problem.message
    assert "restarts at another size from the script's own checkpoint" in problem.message
    assert "add resume_args" in problem.message and "elastic.toml" in str(problem)


def test_check_refuses_keep_on_a_script_whose_batch_is_its_own(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    [problem] = _check(tmp_path, f'{RESUME}\nkeep = "per_rank_batch"').problems
    assert problem.key == "pipelines[0].keep" and "does not size a script's batch" in problem.message


def test_a_scripts_resize_says_its_world_size_and_no_batch_figures():
    ev = GangResized(pipeline="g", from_ranks=2, to_ranks=1, why="rank 1 killed by SIGKILL", batch_size=0,
                     accumulate_grad_batches=0, samples_per_step=0, samples_per_step_before=0, keep="")
    assert printed(ev).split("] ", 1)[-1].rstrip() == (
        "g: gang resized from 2 to 1 rank (rank 1 killed by SIGKILL): WORLD_SIZE=1; the script's batch is its own")
    assert "script's own" in resize_lines((ev,))[1] and " 0 -> 0 " not in resize_lines((ev,))[1]  # `w`'s lines


# ------------------------------------------------------------ a real gang


async def _file(path: Path, timeout: float) -> None:
    """Until `path` exists (the script's own checkpoint), failing after `timeout` seconds."""
    async def poll() -> None:
        while not path.exists():
            await asyncio.sleep(0.05)
    await asyncio.wait_for(poll(), timeout)


def _gang(steps: int, **keys) -> dict:
    return {"name": "g", "script": SCRIPT, "ranks": "1:2", "metrics": STEP,
            "args": ["--out={checkpoint_dir}", f"--steps={steps}", "--save_every=5", "--delay=0.05"],
            "resume_args": ["--resume", "{checkpoint_dir}/ckpt.pt"], **keys}


@pytest.mark.slow
async def test_a_script_gang_that_loses_a_rank_resumes_from_its_own_checkpoint_at_world_size_1(tmp_path):
    config = make_config(tmp_path, [_gang(60)], validation={"mode": "off"}, telemetry={"enabled": False},
                         restart={"max_restarts": 1})
    sup = Supervisor(config, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted), 120)
        assert len(started.pids) == 2
        await _file(sup.run_dir / "g" / "checkpoints" / "ckpt.pt", 120)
        sup.add_config(make_config(tmp_path, [{"name": "urgent", "priority": 1, "max_epochs": 2,
                                                "params": {"samples": 256, "delay": 0.002}}],
                                   validation={"mode": "off"}, telemetry={"enabled": False}))
        os.kill(started.pids[1], signal.SIGKILL)
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 240)
        assert done.status == "completed" and done.step == 60
        await sup.wait()
    finally:
        await sup.shutdown()
    events = read_events(sup.run_dir)
    [resized] = [e for e in events if isinstance(e, GangResized)]
    assert (resized.from_ranks, resized.to_ranks) == (2, 1) and "rank 1 killed by SIGKILL" in resized.why
    assert (resized.batch_size, resized.samples_per_step, resized.keep) == (0, 0, "")
    log = (sup.run_dir / "g" / "log.txt").read_text()
    assert "rank 0 runs at WORLD_SIZE 2" in log and "rank 0 done at step 60 at WORLD_SIZE 1" in log
    [resumed] = [int(ln.split("from step ")[1].split()[0]) for ln in log.splitlines() if "resumed from step" in ln]
    assert resumed >= 5 and resumed % 5 == 0
    after = [e.step for e in events[events.index(resized):] if isinstance(e, StepMetrics) and e.pipeline == "g"]
    assert after and min(after) == resumed + 1  # on from its checkpoint, not from scratch


@pytest.mark.slow
async def test_a_script_gang_on_one_slot_is_stopped_and_grows_to_two_from_its_own_checkpoint(tmp_path):
    hold = {"name": "hold", "priority": 1, "max_epochs": 50, "params": {"samples": 256, "delay": 0.01}}
    config = make_config(tmp_path, [hold, _gang(120, grow_after=0.5)], validation={"mode": "off"},
                         telemetry={"enabled": False}, restart={"max_restarts": 0})  # the growth spends none
    sup = Supervisor(config, inventory=inventory())
    stream = sup.subscribe()
    await sup.start()
    try:
        await _file(sup.run_dir / "g" / "checkpoints" / "ckpt.pt", 120)
        sup.stop("hold", reason="its slot is wanted")
        grew = await wait_for(stream, lambda e: isinstance(e, GangResized) and e.to_ranks == 2, 120)
        assert grew.from_ranks == 1 and grew.why.startswith("1 more slot free for ") and grew.batch_size == 0
        done = await wait_for(stream, lambda e: isinstance(e, PipelineFinished) and e.pipeline == "g", 240)
        assert done.status == "completed" and done.step == 120
        await sup.wait()
    finally:
        await sup.shutdown()
    log = (sup.run_dir / "g" / "log.txt").read_text()
    assert "rank 0 runs at WORLD_SIZE 1" in log and "rank 0 done at step 120 at WORLD_SIZE 2" in log
    [resumed] = [ln for ln in log.splitlines() if "resumed from step" in ln]
    assert resumed.endswith("at WORLD_SIZE 2") and "from step 0 " not in resumed
