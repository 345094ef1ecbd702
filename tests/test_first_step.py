"""`torchherd run --headless` with Task pipelines: each task is built once, by its worker, and a task that does
not build still trains nothing (exit 2, the problem naming file and key).

Regression: a Task pipeline took 2.5x a bare script to its first step, because the run first built every task
in a throwaway probe process and its workers then built them all again.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchherd.engine.supervise.bus import Publisher
from torchherd.engine.config.load import parse_config
from torchherd.engine.protocol.messages import TaskBuilt, WorkerError
from torchherd.engine.supervise.build_check import BuildCheck

TASKS = Path(__file__).resolve().parent / "tasks"


def counted_task(tmp_path: Path) -> Path:
    """A task file whose factory writes its process id to builds.txt each time it runs."""
    (tmp_path / "counted.py").write_text(textwrap.dedent(f"""
        import os

        from torchherd.engine.runners.task.builtin import regression


        def build(params):
            with open({str(tmp_path / "builds.txt")!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            return regression(params)
        """))
    return tmp_path / "builds.txt"


def write_config(tmp_path: Path, pipelines: str, slots: int = 1) -> Path:
    config = tmp_path / "run.toml"
    config.write_text(pipelines + f'\n[devices]\nplacement = "cpu"\ncpu_slots = {slots}\n\n'
                      '[validation]\nmode = "off"\n\n[telemetry]\nenabled = false\n')
    return config


def run(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchherd", "run", str(config), "--headless", "--runs-dir",
                           str(cwd / "runs")], cwd=cwd, capture_output=True, text=True, timeout=240)


def events(runs: Path) -> list[dict]:
    return [json.loads(line) for path in runs.glob("*/events.jsonl") for line in path.read_text().splitlines()]


@pytest.mark.slow  # starts the CLI, its service and a worker
def test_a_task_is_built_once_by_its_worker_and_not_first_in_a_probe(tmp_path: Path):
    builds = counted_task(tmp_path)
    config = write_config(tmp_path, '[[pipelines]]\nname = "a"\ntask = "counted.py:build"\nmax_steps = 2\n'
                                    'params = { samples = 256 }\n')
    proc = run(config, tmp_path)
    assert proc.returncode == 0, proc.stderr
    pids = builds.read_text().split()
    workers = [str(e["pid"]) for e in events(tmp_path / "runs") if e["type"] == "worker_started"]
    assert pids == workers, (pids, workers)  # once, in the worker: no probe process built it before
    assert "1 task built in" in proc.stdout


@pytest.mark.slow
def test_a_task_that_does_not_build_stops_every_worker_before_its_first_step(tmp_path: Path):
    counted_task(tmp_path)
    config = write_config(tmp_path, '[[pipelines]]\nname = "good"\ntask = "counted.py:build"\nmax_epochs = 50\n\n'
                                    f'[[pipelines]]\nname = "bad"\ntask = "{TASKS / "factory_raises.py"}:build"\n',
                          slots=2)
    proc = run(config, tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    named = [line for line in proc.stderr.splitlines() if line.startswith("run.toml: pipelines[1].task: task factory ")]
    assert named and "raised ValueError: no data at /nonexistent/path" in named[0], proc.stderr
    assert "training_started" not in proc.stdout and "completed" not in proc.stdout, proc.stdout
    # like a bad config, it leaves no run behind for `torchherd ls` to list or `resume` to offer
    assert not list((tmp_path / "runs").glob("*")), list((tmp_path / "runs").iterdir())


def held(name: str, kind: str = "task") -> SimpleNamespace:
    """What the check reads of a pipeline's run as its first attempt launches."""
    return SimpleNamespace(name=name, plan=SimpleNamespace(config=SimpleNamespace(kind=kind)), handle=object(),
                           last_error="")


def opened(config) -> BuildCheck:
    """The check of a fresh run, as the supervisor opens it before its first wave launches."""
    check = BuildCheck(config, asked=True)
    check.open(resuming=False, background=False, publish=Publisher({}))
    return check


def test_the_check_waits_for_every_held_build_and_names_the_task_that_failed(tmp_path: Path):
    config = parse_config({"pipelines": [{"name": "a", "task": "regression"},
                                         {"name": "b", "task": "regression", "params": {"hidden": 8}}]},
                          str(tmp_path / "run.toml"), tmp_path)
    check = opened(config)
    assert check.tasks == 2 and check.admit(held("a")) and check.admit(held("b"))
    check.seal()  # both tasks are built by held workers: no probe
    assert not check.admit(held("late"))  # after the first wave nobody is held
    check.heard("a", TaskBuilt(pipeline="a"))
    assert check.verdict() is None  # b has not built yet
    check.heard("b", WorkerError(pipeline="b", error="task factory regression raised ValueError: no", where="build"))
    assert [str(p) for p in check.verdict()] == [f"{tmp_path / 'run.toml'}: pipelines[1].task: task factory "
                                                 "regression raised ValueError: no (its params: hidden = 8)"]


def test_the_check_passes_once_every_held_worker_built(tmp_path: Path):
    assert not BuildCheck(parse_config({"pipelines": [{"name": "a", "task": "regression"}]}, "run.toml", tmp_path),
                          asked=False).admit(held("a"))  # not asked (the app, a test's supervisor): nobody holds
    config = parse_config({"pipelines": [{"name": "a", "task": "regression"}, {"name": "b", "task": "regression"}]},
                          str(tmp_path / "run.toml"), tmp_path)
    check = opened(config)
    assert check.tasks == 1 and check.admit(held("a")) and check.admit(held("b"))
    check.seal()
    for name in ("a", "b"):
        assert check.verdict() is None
        check.heard(name, TaskBuilt(pipeline=name))
    assert check.verdict() == []
