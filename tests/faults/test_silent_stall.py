"""A pipeline that makes no step is flagged even with no `hang_timeout` (nothing killed), every process of it
writes its Python stacks to its log on request (a script too, unchanged), and the flag clears when it steps."""
from __future__ import annotations

import asyncio
import textwrap

import pytest

from torchherd.engine.protocol.messages import PipelineFinished, Stalled, StepMetrics
from torchherd.engine.protocol.states import WorkerState
from tests.conftest import TASKS, make_config, wait_for
from tests.faults.support import finish, poll_until, supervised
from torchherd.engine.supervise.supervisor import Supervisor

pytestmark = pytest.mark.slow

QUICK = {"stall_warning": 1.0}  # seconds: the default is a minute (five before the first step)


async def log_shows(path, text: str, timeout: float = 30.0) -> None:
    """Wait until the pipeline's log holds `text`."""
    await asyncio.to_thread(poll_until, lambda: path.exists() and text in path.read_text(errors="replace"),
                            timeout, f"{text!r} in {path}")


# Regression: a script stuck at start (Lightning waiting for a rank that never came) sat silent for 300 s with
# nothing flagged, since hang_timeout was unset; and the stack dump reached only torchherd's side of it.
async def test_a_silent_script_is_flagged_and_dumps_its_own_stack_without_being_killed(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import time

        print("step 1 loss 0.5", flush=True)


        def wait_for_the_other_rank():
            time.sleep(600)


        wait_for_the_other_rank()
        """))
    config = make_config(tmp_path, [{"name": "s", "script": str(script),
                                     "metrics": r"step (?P<step>\d+) loss (?P<loss>\S+)"}], restart=QUICK)
    sup = Supervisor(config)
    async with supervised(sup) as stream:
        flagged = await wait_for(stream, lambda e: isinstance(e, Stalled) and e.quiet > 0)
        assert flagged.pipeline == "s" and not flagged.first_step
        assert sup.view("s").state == WorkerState.RUNNING  # flagged, not killed
        sup.stacks("s")
        await log_shows(sup.run_dir / "s" / "log.txt", "in wait_for_the_other_rank")
        await log_shows(sup.run_dir / "s" / "log.txt", "in _supervise")  # the worker's side of it too
        assert sup.view("s").state == WorkerState.RUNNING
        sup.kill("s")
        await wait_for(stream, lambda e: isinstance(e, PipelineFinished))


async def test_a_task_that_stops_stepping_is_flagged_and_the_flag_clears_when_it_steps_again(tmp_path):
    gate = tmp_path / "go-on"
    config = make_config(tmp_path, [{"name": "a", "params": {"gate_file": str(gate), "gate_at_call": 3}}],
                         defaults={"task": f"{TASKS / 'faulty.py'}:build", "max_epochs": 1}, restart=QUICK)
    sup = Supervisor(config)
    async with supervised(sup) as stream:
        # (a loaded machine may flag its start-up too: 5 s before the first step here)
        await wait_for(stream, lambda e: isinstance(e, Stalled) and e.quiet > 0 and not e.first_step)
        sup.stacks("a")
        await log_shows(sup.run_dir / "a" / "log.txt", "_wait_at_gate")
        gate.touch()
        await wait_for(stream, lambda e: isinstance(e, Stalled) and e.quiet == 0)
        await wait_for(stream, lambda e: isinstance(e, StepMetrics))
        assert await finish(sup, timeout=120) == {"a": "completed"}
