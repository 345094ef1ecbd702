"""`torchherd ls` and `torchherd attach` from any folder: the user's live runs are found through the runtime
folder beside their control sockets, wherever they were started; finished ones under the runs folder."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import TASKS, repo_env, service_of, still_alive

pytestmark = pytest.mark.slow
PLAIN = TASKS / "scripts" / "plain_loop.py"


@pytest.fixture
def runtime(private_runtime):
    """The test's own runtime folder (conftest's private_runtime), named for what it is here."""
    return private_runtime


def torchherd(cwd: Path, runtime: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchherd", *args], capture_output=True, text=True, cwd=cwd,
                          env=repo_env(XDG_RUNTIME_DIR=str(runtime)), stdin=subprocess.DEVNULL, timeout=300)


def test_ls_and_attach_find_a_live_run_started_in_another_folder(tmp_path, runtime):
    # Regression: from another folder `torchherd ls` said "no runs under runs" and `attach --headless` said
    # "runs: no live run", though two runs were live: the README promises "come back from any shell".
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "run.toml").write_text(
        f'name = "far-{uuid.uuid4().hex[:6]}"\n[[pipelines]]\nname = "s"\nscript = "{PLAIN}"\n'
        'args = ["--epochs", "100000", "--delay", "0.2"]\nmetrics = \'Epoch (?P<epoch>\\d+), Loss: (?P<loss>\\S+)\'\n'
        '[devices]\nplacement = "cpu"\ncpu_slots = 1\n[telemetry]\nenabled = false\n')
    started = torchherd(project, runtime, "run", "run.toml", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    [run_dir] = list((project / "runs").iterdir())
    service = service_of(run_dir)
    try:
        listed = torchherd(home, runtime, "ls", "--json")
        assert listed.returncode == 0, listed.stderr
        [entry] = json.loads(listed.stdout)
        assert (Path(entry["path"]), entry["live"]) == (run_dir.resolve(), True)
        assert run_dir.name in torchherd(home, runtime, "ls").stdout
        follower = subprocess.Popen([sys.executable, "-m", "torchherd", "attach", "--headless"], cwd=home,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=repo_env(XDG_RUNTIME_DIR=str(runtime)), stdin=subprocess.DEVNULL)
        first = follower.stdout.readline()  # it follows the run (a long one: however loaded the machine is)
        assert f"following run {run_dir.name}" in first, first + follower.stderr.read()
        assert torchherd(home, runtime, "stop", str(run_dir)).returncode == 0
        out, err = follower.communicate(timeout=120)
        assert follower.returncode == 3 and "s: stopped" in out, first + out + err
        # Regression: the paths shown were the run's own, relative to the folder it was started from.
        shown = [first.split("(", 1)[1].split(")", 1)[0]]
        shown += [line.split("run directory: ", 1)[1] for line in out.splitlines() if "run directory: " in line]
        assert len(shown) == 2 and all((home / path).resolve() == run_dir.resolve() for path in shown), shown
        gone = torchherd(home, runtime, "attach", "--headless")
        assert gone.returncode == 2 and "no live run of yours" in gone.stderr
    finally:
        if service.is_running():
            service.terminate()
        assert still_alive([service.pid], timeout=60) == []
    assert not list(runtime.glob("torchherd/*.run.json"))  # the finished run withdrew its entry
