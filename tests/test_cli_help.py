"""The command line: clean help for the app and each command, and a headless run that says at once that it
is checking the tasks, how long that took, and counts its clock from the start of the command."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchherd.tui.cli import main
from tests.conftest import repo_env

TASKS = Path(__file__).resolve().parent / "tasks"


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 0
    return capsys.readouterr().out


# Regression: `torchherd run --help` ran the app's four-line usage into argparse's own.
@pytest.mark.parametrize("command, usage", [
    ("run", "usage: torchherd run [-h] [--headless] [--detach] [--runs-dir DIR] [--json] CONFIG"),
    ("attach", "usage: torchherd attach [-h] [--headless] [--from-start] [--read-only] [--runs-dir DIR] [--json] [RUN]"),
    ("ls", "usage: torchherd ls [-h] [--runs-dir DIR] [--json]"),
    ("kill", "usage: torchherd kill [-h] [--runs-dir DIR] [--json] RUN [NAME]"),
    ("pause", "usage: torchherd pause [-h] [--runs-dir DIR] [--json] RUN NAME"),
    ("resume", "usage: torchherd resume [-h] [--runs-dir DIR] [--headless] [--detach] [--only NAME] [--json] RUN"),
    ("check", "usage: torchherd check [-h] [--probe] [--json] CONFIG"),
])
def test_each_command_has_its_own_clean_help(capsys, command: str, usage: str):
    text = help_text(capsys, command, "--help")
    assert " ".join(text.split("\n\n")[0].split()) == usage  # argparse wraps long usages
    assert "[DIR|CONFIG]" not in text and "usage:" not in text.split("\n", 1)[1]


def test_top_level_help_lists_the_apps_options_and_the_commands(capsys):
    text = help_text(capsys, "--help")
    assert text.startswith("usage: torchherd [DIR|CONFIG] [--runs-dir DIR] [--version]\n")
    assert re.search(r"^  --runs-dir DIR ", text, re.M)  # the app's own option, documented
    for command in ("run CONFIG", "attach \\[RUN\\]", "ls", "resume RUN_DIR", "check CONFIG"):
        assert re.search(rf"^  {command} ", text, re.M), command


# Regression: there was no `torchherd --version`; `attach`'s help named a default that was not its behaviour.
def test_version_names_torchherd_torch_and_python_and_attach_says_its_default(capsys):
    assert re.fullmatch(r"torchherd \S+ \(torch \S+, Python 3\.\d+\.\d+\)\n", help_text(capsys, "--version"))
    for text in (help_text(capsys, "--help"), help_text(capsys, "attach", "--help")):
        assert "newest live run, wherever it was started" in " ".join(text.split()), text


@pytest.mark.slow  # starts the CLI
def test_output_into_a_pipe_its_reader_closed_ends_quietly(tmp_path: Path):
    # Regression: `torchherd ls | head -1` ended in a BrokenPipeError traceback.
    read, write = os.pipe()
    os.close(read)  # the reader has gone before a byte is written
    try:
        done = subprocess.run([sys.executable, "-m", "torchherd", "ls", "--runs-dir", str(tmp_path)], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=repo_env(), timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")


def start(config: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(config), "--headless", "--runs-dir",
                             str(cwd / "runs")], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gated(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """A config whose task import waits for `gate`: the check (its worker's build) is visibly under way until the
    test opens it."""
    gate = tmp_path / "gate"
    (tmp_path / "gated.py").write_text(textwrap.dedent(f"""
        import os
        import sys
        import time

        while not os.path.exists({str(gate)!r}):
            time.sleep(0.02)  # held here until the test opens the gate
        sys.path.insert(0, {str(TASKS)!r})
        """) + body)
    config = tmp_path / "run.toml"
    config.write_text('[[pipelines]]\nname = "a"\ntask = "gated.py:build"\nmax_epochs = 1\nparams = { samples = 64 }\n\n'
                      '[devices]\nplacement = "cpu"\ncpu_slots = 1\n\n[validation]\nmode = "inline"\n')
    return config, gate


@pytest.mark.slow  # starts the CLI, its service and a worker
# Regression: headless printed nothing while it built the tasks (about 9 s), and its clock started after.
def test_headless_says_at_once_that_it_checks_and_refuses_a_task_that_does_not_build(tmp_path: Path):
    config, gate = gated(tmp_path, "def build(params):\n    raise ValueError('no data')\n")
    proc = start(config, tmp_path)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # arrives while the probe is still held at the gate
        assert re.fullmatch(r"\[ +\d+\.\ds\] checking 1 task: each worker builds its own and holds before its "
                            r"first step until all built\n", first)
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 2
    assert "checking failed after" in out and "every pipeline stopped before its first step" in out
    assert "run.toml: pipelines[0].task: task factory gated.py:build raised ValueError: no data (its params: " \
           "samples = 64)" in err  # the factory's call, often the cause
    # The factory's own frames, not torchherd's that called it; no run directory named: none is kept.
    assert "raise ValueError('no data')" in out and "call_factory" not in out and "TaskError" not in out, out
    assert "run directory:" not in out and not list((tmp_path / "runs").glob("*")), out
    records = [json.loads(line) for path in (tmp_path / "runs").glob("*/events.jsonl")
               for line in path.read_text().splitlines()]
    assert not [r for r in records if r["type"] in ("step", "training_started")]  # its worker trained nothing


@pytest.mark.slow
def test_headless_reports_the_check_time_and_counts_from_the_start(tmp_path: Path):
    config, gate = gated(tmp_path, "from tiny import build\n")
    gate.touch()
    proc = subprocess.run([sys.executable, "-m", "torchherd", "run", str(config), "--headless", "--runs-dir",
                           str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("checking 1 task: each worker builds its own and holds before its first step until "
                             "all built")
    started = [i for i, line in enumerate(lines) if re.fullmatch(r"\[ *[\d.]+s\] run .*", line)]
    built = [i for i, line in enumerate(lines) if re.fullmatch(r"\[ *[\d.]+s\] 1 task built in [\d.]+s", line)]
    assert started and built and started[0] < built[0], lines  # the run starts at once: its worker builds
    # One clock for the check and the run, from the start of the command.
    clock = [float(re.match(r"\[ *([\d.]+)s\]", line).group(1)) for line in lines if line.startswith("[")]
    assert clock == sorted(clock), lines
