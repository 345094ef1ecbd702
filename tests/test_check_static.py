"""The task check: factories read from task files with ast (no import), the probe in a fresh process,
one problem per bad [defaults] task, one path style, a cache that notices edits, and cancellation."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from torchherd.engine.preflight.check import check_config
from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.preflight.probe import ProbeCancelled, pending_jobs, probe_tasks
from tests.conftest import children

NO_GPU = Inventory(cpu_count=2, note="no NVIDIA GPU (test inventory)")
TWO_PIPELINES = """
[[pipelines]]
name = "a"
params = { lr = 0.1 }

[[pipelines]]
name = "b"
params = { lr = 0.2 }
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A project folder that is the working directory, with a task file defining `build`."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "task.py", """
        import math
        from torchherd import Task

        def build(params):
            raise ValueError(f"bad lr {params['lr']}")
        """)
    return tmp_path


# Regression: `task = "cnn_digits.py:biuld"` passed `torchherd check` (and the picker) and both workers
# failed 13 s after launch with "has no 'biuld'"; the file was never read before building the task.
def test_check_without_probe_finds_a_missing_factory(project: Path):
    config = write(project / "run.toml", '[[pipelines]]\nname = "a"\ntask = "task.py:biuld"\n')
    report = check_config(config, inventory=NO_GPU)
    assert not report.ok
    assert [str(p) for p in report.problems] == [
        "run.toml: pipelines[0].task: task.py has no 'biuld' (did you mean 'build'?)"]


# Regression: a bad defaults.task was reported once per pipeline.
def test_a_bad_defaults_task_is_reported_once_at_defaults_task(project: Path):
    config = write(project / "run.toml", '[defaults]\ntask = "task.py:biuld"\n' + TWO_PIPELINES)
    report = check_config(config, inventory=NO_GPU)
    assert [(p.key, p.message) for p in report.problems] == \
        [("defaults.task", "task.py has no 'biuld' (did you mean 'build'?)")]


def test_a_module_task_is_read_from_its_source_file(project: Path, monkeypatch):
    write(project / "lib" / "thtask_static_mod.py", "def build(params):\n    return None\n")
    monkeypatch.syspath_prepend(str(project / "lib"))
    config = write(project / "run.toml", '[[pipelines]]\nname = "a"\ntask = "thtask_static_mod:buidl"\n')
    problems = check_config(config, inventory=NO_GPU).problems
    assert [p.message for p in problems] == ["thtask_static_mod has no 'buidl' (did you mean 'build'?)"]


@pytest.mark.parametrize("source", [
    "if True:\n    def build(params): pass\n",
    "try:\n    from os import path as build\nexcept ImportError:\n    build = None\n",
    "def make(): pass\nbuild = make()\n",
    "from os.path import *\n",  # could define anything: only the probe can tell
    "def __getattr__(name): pass\n",
    "globals()['build'] = print\n",
])
def test_no_false_alarm_when_the_name_may_exist(project: Path, source: str):
    write(project / "other.py", source)
    config = write(project / "run.toml", '[[pipelines]]\nname = "a"\ntask = "other.py:build"\n')
    report = check_config(config, inventory=NO_GPU)
    assert report.ok, report.render()


def test_a_syntax_error_needs_no_probe(project: Path):
    write(project / "broken.py", "def build(params)\n    pass\n")
    config = write(project / "run.toml", '[[pipelines]]\nname = "a"\ntask = "broken.py:build"\n')
    problems = check_config(config, inventory=NO_GPU).problems
    assert len(problems) == 1 and problems[0].message.startswith("syntax error in broken.py line 1")


@pytest.mark.slow  # starts a probe process
# Regression: config problems showed the path as written, probe problems the absolute path.
def test_probe_problems_use_the_same_path_style_as_config_problems(project: Path):
    config = write(project / "configs" / "run.toml", '[defaults]\ntask = "../task.py:build"\n' + TWO_PIPELINES)
    report = check_config(config, probe=True, inventory=NO_GPU)
    assert [str(p) for p in report.problems] == [
        "configs/run.toml: pipelines[0].task: task factory task.py:build raised ValueError: bad lr 0.1 (its params: "
        "lr = 0.1)",
        "configs/run.toml: pipelines[1].task: task factory task.py:build raised ValueError: bad lr 0.2 (its params: "
        "lr = 0.2)"]
    assert str(project) not in report.render()


@pytest.mark.slow  # starts a probe process
def test_probe_reports_a_defaults_task_failing_alike_once(project: Path):
    write(project / "task.py", "raise RuntimeError('no GPU driver')\n\ndef build(params):\n    pass\n")
    config = write(project / "run.toml", '[defaults]\ntask = "task.py:build"\n' + TWO_PIPELINES)
    problems = check_config(config, probe=True, inventory=NO_GPU).problems
    assert [(p.key, p.message) for p in problems] == \
        [("defaults.task", "importing task.py raised RuntimeError: no GPU driver")]


@pytest.mark.slow  # starts a probe process
def test_probe_verdicts_are_cached_until_the_task_file_changes(project: Path):
    config_path = write(project / "run.toml", '[defaults]\ntask = "task.py:build"\n' + TWO_PIPELINES)
    config = check_config(config_path, inventory=NO_GPU).config
    assert config is not None and len(pending_jobs(config)) == 2
    first = probe_tasks(config)
    assert pending_jobs(config) == []
    assert probe_tasks(config, cancelled=lambda: pytest.fail("a cached verdict started a probe")) == first
    stat = os.stat(project / "task.py")
    os.utime(project / "task.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # an edit
    assert len(pending_jobs(config)) == 2


def test_a_cancelled_probe_kills_its_process(project: Path):
    write(project / "slow.py", "def build(params):\n    pass\n")
    config = check_config(write(project / "run.toml", '[[pipelines]]\nname = "a"\ntask = "slow.py:build"\n'),
                          inventory=NO_GPU).config
    assert config is not None
    seen: list[psutil.Process] = []

    def cancelled() -> bool:
        seen.extend(children())  # the test session's forking process is no probe's
        return True

    with pytest.raises(ProbeCancelled):
        probe_tasks(config, cancelled=cancelled)
    assert seen, "the probe process had not started"
    gone, alive = psutil.wait_procs(seen, timeout=10)
    assert alive == [], [(p.pid, p.cmdline()) for p in alive]
    assert len(pending_jobs(config)) == 1  # nothing cached from a cancelled probe


# Regression: a missing task file in one pipeline hid an undefined factory in another until the first was fixed; check now reports every problem in one pass.
def test_check_reports_every_problem_at_once(project: Path):
    config = write(project / "run.toml", """
        [[pipelines]]
        name = "a"
        task = "missing.py:build"

        [[pipelines]]
        name = "b"
        task = "task.py:biuld"

        [[pipelines]]
        name = "c"
        task = "task.py:build"
        lr = "fast"
        """)
    report = check_config(config, inventory=NO_GPU)
    assert [str(p) for p in report.problems] == [
        "run.toml: pipelines[0].task: task file not found: missing.py",
        "run.toml: pipelines[2].lr: unknown key (task parameters go in the pipeline's params table)",
        "run.toml: pipelines[1].task: task.py has no 'biuld' (did you mean 'build'?)"]


def test_a_bad_defaults_task_beside_a_bad_key_is_still_one_problem(project: Path):
    config = write(project / "run.toml", '[defaults]\ntask = "task.py:biuld"\n' + TWO_PIPELINES
                   + '\n[[pipelines]]\nname = "c"\nepochs = 3\n')
    problems = [str(p) for p in check_config(config, inventory=NO_GPU).problems]
    assert "run.toml: defaults.task: task.py has no 'biuld' (did you mean 'build'?)" in problems
    assert not [p for p in problems if ".task:" in p and "defaults" not in p]


PARENT = """
import sys, threading
from torchherd.engine.preflight.check import check_config
from torchherd.engine.preflight.probe import probe_tasks
config = check_config(sys.argv[1]).config
# As the app does: the probe is started from a thread, which may end long before its process.
threading.Thread(target=probe_tasks, args=(config,)).start()
"""


@pytest.mark.slow  # a stand-in app, the probe and what the task starts: three interpreters
def test_the_probe_and_what_it_started_die_with_the_process_that_started_it(project: Path):
    # Regression: the probe (a session of its own) outlived a killed app by seconds at a full core.
    from tests.faults.support import kill_all, poll_until, wait_gone

    pids = project / "pids"
    write(project / "hang.py", f"""
        import os, subprocess, sys, threading

        def build(params):  # a task that starts a process and never finishes building
            child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
            with open({str(pids)!r} + ".tmp", "w") as f:
                f.write(f"{{os.getpid()}} {{child.pid}}")
            os.replace({str(pids)!r} + ".tmp", {str(pids)!r})
            threading.Event().wait()
        """)
    config = write(project / "run.toml", '[[pipelines]]\nname = "a"\ntask = "hang.py:build"\n')
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(config)])
    try:
        probe, grandchild = (psutil.Process(int(pid)) for pid in
                             poll_until(lambda: pids.exists() and pids.read_text().split(), 120, "the task to build"))
        assert probe.ppid() == parent.pid and "torchherd.engine.preflight.probe" in " ".join(probe.cmdline())
    finally:
        parent.kill()
        parent.wait()
    left = wait_gone([probe, grandchild], timeout=1.0)
    kill_all(left)
    assert left == [], "the probe (or what it started) outlived its caller by over a second"


def test_check_says_no_validator_starts_for_scripts_with_nothing_to_score(project: Path):
    # Regression: a config of plain scripts (no validate factory) started no validator, yet check said
    # "validation: background on cpu".
    config = write(project / "scripts.toml", """
        [[pipelines]]
        name = "s"
        script = "train.py"
        [validation]
        mode = "auto"
    """)
    (project / "train.py").write_text("print('training')\n")
    text = check_config(config, inventory=NO_GPU, probe=False).render()
    # issue 52: worded alike for one script and for several (once "inline ..., best by val_loss (min)")
    assert "validation: none: no pipeline reports val_loss (a script reports one with `val_metrics`" in text, text
    scored = write(project / "task.toml", '[[pipelines]]\nname = "a"\ntask = "task.py:build"\n')
    assert "validation: background on cpu" in check_config(scored, inventory=NO_GPU, probe=False).render()


def test_scripts_that_validate_themselves_are_worded_alike_one_or_several(project: Path):
    # Regression (issue 52): one such script read "no validator: ...", two read "inline (no spare core ...)".
    (project / "train.py").write_text("print('training')\n")
    pipeline = ('[[pipelines]]\nname = "{}"\nscript = "train.py"\nmetrics = \'loss (?P<loss>\\S+)\'\n'
                'val_metrics = \'val (?P<val_loss>\\S+)\'\n')
    said = []
    for names in (["a"], ["a", "b"]):
        config = write(project / f"{len(names)}.toml", "".join(pipeline.format(n) for n in names))
        text = check_config(config, inventory=NO_GPU, probe=False).render()
        said += [line.strip() for line in text.splitlines() if line.strip().startswith("validation:")]
    assert said == ["validation: each script's own (its val_metrics lines; no validator), best by val_loss (min)"] * 2
