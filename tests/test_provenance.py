"""Which code a run ran: a config in a git repository records the commit `git rev-parse HEAD` names, whether the
tree was dirty and its diff in the run folder (`ls --json` shows them, the app's header too); a config in no
repository says so once and records nothing; a diff too long is cut and says so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchherd.engine.hardware.devices import Inventory
from torchherd.engine.protocol.messages import Notice, RunStarted
from torchherd.engine.rundir import provenance
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from torchherd.tui.runstate import commit_label
from tests.conftest import make_config, repo_env
from tests.scripted import ScriptedLauncher, until

TASK = ("from torchherd.engine.runners.task.builtin import regression\n\n\n"
        "def build(params):\n    return regression(params)\n")
CONFIG = ('[[pipelines]]\nname = "a"\ntask = "task.py:build"\nmax_epochs = 1\nparams = { samples = 64 }\n\n'
          '[devices]\nplacement = "cpu"\ncpu_slots = 1\n\n[validation]\nmode = "off"\n\n[telemetry]\nenabled = false\n')


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def dirty_repo(tmp_path: Path) -> Path:
    """A repository holding a config and its task, committed, then the task changed and not committed."""
    repo = tmp_path / "project"
    repo.mkdir()
    (repo / "task.py").write_text(TASK)
    (repo / "run.toml").write_text(CONFIG)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    (repo / "task.py").write_text(TASK + "\n# tuned by hand\n")
    return repo


@pytest.mark.slow  # the CLI, its service and a worker that trains
def test_a_run_of_a_dirty_repository_records_its_commit_and_its_diff(tmp_path):
    repo = dirty_repo(tmp_path)
    runs = str(tmp_path / "runs")
    proc = subprocess.run([sys.executable, "-m", "torchherd", "run", "run.toml", "--headless", "--runs-dir", runs],
                          cwd=repo, capture_output=True, text=True, timeout=100, env=repo_env())
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "no git repository" not in proc.stdout
    listed = subprocess.run([sys.executable, "-m", "torchherd", "ls", "--json", "--runs-dir", runs], cwd=repo,
                            capture_output=True, text=True, timeout=60, env=repo_env())
    (run,) = json.loads(listed.stdout)
    (code,) = run["code"]
    assert code["commit"] == git(repo, "rev-parse", "HEAD") and code["dirty"] is True
    assert code["repo"] == str(repo.resolve()) and code["diff_cut"] is False
    diff = Path(code["diff"])
    assert diff.parent.parent == Path(run["path"]) and "+# tuned by hand" in diff.read_text()


async def test_a_config_in_no_repository_says_so_once_and_records_nothing(tmp_path):
    launcher = ScriptedLauncher()
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], defaults={"task": "regression"},
                         telemetry={"enabled": False})
    sup = Supervisor(config, launcher=launcher, inventory=Inventory(cpu_count=2), tick=0.005)
    await sup.start()
    await until(lambda: len(launcher.handles) == 2)
    await sup.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    assert started.code == ()
    said = [e.text for e in events if isinstance(e, Notice) and "git" in e.text]
    assert said == [f"{tmp_path} is in no git repository (or git could not read it): no commit recorded for it "
                    "(said once)"]
    assert not (sup.run_dir / provenance.FOLDER).exists()


def test_a_diff_longer_than_kept_is_cut_and_says_so(tmp_path, monkeypatch):
    repo = dirty_repo(tmp_path)
    monkeypatch.setattr(provenance, "MAX_DIFF", 40)
    config = make_config(repo, [{"name": "a", "task": "task.py:build"}])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    found = provenance.record([config], run_dir)
    (code,) = found.commits
    assert found.notice == "" and code.dirty and code.diff_cut and code.diff == "code/project.diff"
    text = (run_dir / code.diff).read_text()
    assert text.endswith("# torchherd: the diff was cut at 40 bytes\n") and len(text.split("\n# torchherd")[0]) == 40
    assert commit_label(found.commits) == f"@{code.commit[:7]}*"
    git(repo, "commit", "-q", "-am", "second")  # clean now: a commit and no diff
    (clean,) = provenance.record([config], run_dir).commits
    assert not clean.dirty and clean.diff == "" and clean.commit == git(repo, "rev-parse", "HEAD")


def test_a_hostile_repositorys_config_runs_none_of_its_commands(tmp_path):
    repo = dirty_repo(tmp_path)
    ran = tmp_path / "ran"
    touch = f"touch {ran}"
    for key, value in (("core.fsmonitor", touch), ("core.hooksPath", str(tmp_path)), ("diff.external", touch),
                       ("filter.evil.clean", touch), ("filter.evil.process", touch), ("filter.evil.required", "true"),
                       ("diff.evil.textconv", touch), ("diff.evil.command", touch)):
        git(repo, "config", key, value)
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    git(repo, "add", ".gitattributes")
    (repo / "task.py").write_text(TASK + "\n# changed again\n")
    config = make_config(repo, [{"name": "a", "task": "task.py:build"}])
    ran.unlink(missing_ok=True)  # the test's own git ran them (fsmonitor at `add`)
    (code,) = provenance.record([config], tmp_path).commits
    assert code.dirty and "+# changed again" in (tmp_path / code.diff).read_text()
    assert not ran.exists()
