"""What each process loads: importing a package pays for no sibling, and a worker child loads its own runner only.

A worker starts once per attempt, so whatever it imports and does not use (the supervisor, the
check, Textual, another kind's runner) is start-up time its pipeline waits through.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TASKS, make_config

NOT_IN_A_WORKER = ("textual", "rich", "lightning", "pytorch_lightning", "torchherd.tui", "torchherd.engine.supervise",
                   "torchherd.engine.preflight", "torchherd.engine.serve", "torchherd.engine.telemetry",
                   "torchherd.engine.rundir")


def loaded(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def modules_after(code: str) -> list[str]:
    """sys.modules of a fresh interpreter that has run `code`."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_importing_the_engine_package_loads_none_of_its_sub_packages():
    mods = modules_after("import torchherd.engine")
    assert loaded(mods, ("torchherd.engine",)) == ["torchherd.engine"]
    assert loaded(mods, ("pydantic", "torch", "textual")) == []


def test_a_name_of_the_engine_package_loads_its_module_on_first_use():
    mods = modules_after("from torchherd.engine import WorkerState, Supervisor")
    assert "torchherd.engine.supervise.supervisor" in mods and "torchherd.engine.preflight.check" not in mods
    with pytest.raises(AttributeError, match="no_such_name"):
        import torchherd.engine

        torchherd.engine.no_such_name  # noqa: B018


def test_a_script_worker_loads_neither_torch_nor_the_task_runner():
    # What launch/child.py and runners/run.py import for a worker, then the script runner itself.
    mods = modules_after("import torchherd.engine.launch.child, torchherd.engine.runners.run\n"
                         "from torchherd.engine.runners.registry import runner_for\n"
                         "import torchherd.engine.config.schema, torchherd.engine.worker.control\n"
                         "runner_for('script'); import torchherd.engine.runners.script.runner")
    assert "torchherd.engine.runners.script.runner" in mods
    assert loaded(mods, ("torch", "torchherd.engine.runners.task", "torchherd.engine.runners.lightning",
                         *NOT_IN_A_WORKER)) == []


@pytest.mark.slow  # a real run: a worker process and torch
async def test_a_task_worker_loads_its_runner_and_nothing_of_the_supervisor_or_the_screen(tmp_path):
    import asyncio

    from torchherd.engine.supervise.supervisor import Supervisor

    out = tmp_path / "modules.json"  # written by the task's build, in the worker, after its start-up
    config = make_config(tmp_path, [{"name": "a", "task": f"{TASKS / 'modules.py'}:build",
                                     "params": {"modules_file": str(out), "samples": 32}}], defaults={"max_epochs": 1})
    sup = Supervisor(config)
    await sup.start()
    try:
        assert await asyncio.wait_for(sup.wait(), 120) == {"a": "completed"}
    finally:
        await sup.shutdown(graceful=False)
    mods = json.loads(out.read_text())
    assert "torch" in mods and "torchherd.engine.runners.task" in mods
    assert loaded(mods, ("torchherd.engine.runners.script", *NOT_IN_A_WORKER)) == []


def test_the_app_up_to_its_first_screen_loads_no_engine_past_the_protocol():
    # What `torchherd` imports before the picker draws: the command line, the app, the picker. The config
    # schema (pydantic), the check, the run directory and the supervisor load after the first frame, in the
    # picker's thread workers or when a run is shown.
    mods = modules_after("from torchherd.tui import cli\ncli.parsers()\n"
                         "import torchherd.tui.app, torchherd.tui.screens.picker")
    assert loaded(mods, ("pydantic", "torch", "psutil", "pygments", "torchherd.engine.config",
                         "torchherd.engine.preflight", "torchherd.engine.rundir", "torchherd.engine.supervise",
                         "torchherd.engine.serve", "torchherd.engine.launch", "torchherd.tui.headless",
                         "torchherd.tui.screens.dashboard")) == []
