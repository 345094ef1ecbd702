"""The real `torchherd` CLI on bad configs: exit status 2, the file and key on stderr, nothing launched."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "configs"


def torchherd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchherd", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


# Each starts the CLI in a process of its own; the same checks run in-process in test_config.py,
# so only the cheapest stays in the fast tier.
@pytest.mark.parametrize("name, key, substring", [
    ("toml_syntax", "", "TOML syntax error"),
    pytest.param("gpu_missing", "devices.placement[0]", "GPU 7 does not exist", marks=pytest.mark.slow),
    pytest.param("task_factory_raises", "pipelines[0].task", "ValueError: no data at /nonexistent/path",
                 marks=pytest.mark.slow),  # the probe imports torch: seconds
])
def test_run_refuses_bad_config(tmp_path: Path, name: str, key: str, substring: str):
    config = CONFIGS / "bad" / f"{name}.toml"
    runs = tmp_path / "runs"
    proc = torchherd("run", str(config), "--headless", "--runs-dir", str(runs), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    where = f"{config}: {key}: " if key else f"{config}: "
    assert any(line.startswith(where) and substring in line for line in proc.stderr.splitlines()), proc.stderr
    if name == "task_factory_raises":  # its worker's build was the check: stopped before its first step
        assert not [p for p in runs.glob("*/events.jsonl") if '"type":"step"' in p.read_text()]
    else:
        assert not runs.exists()


def test_check_good_config_says_ok(tmp_path: Path):
    proc = torchherd("check", str(CONFIGS / "good" / "validation_off.toml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "ok"
    assert "digits-only" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("how", ["under_a_file", "read_only_folder"])
def test_run_refuses_a_runs_folder_it_cannot_write_and_builds_nothing(tmp_path: Path, how: str):
    # Regression: check said ok, then headless printed a raw PermissionError traceback and exited 1.
    import os

    if how == "under_a_file":
        (tmp_path / "taken").write_text("a file where the runs folder would go")
        runs = tmp_path / "taken" / "runs"
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write any folder")
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o555)
        runs = shared / "runs"
    config = CONFIGS / "good" / "validation_off.toml"
    proc = torchherd("run", str(config), "--headless", "--runs-dir", str(runs), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if ": runs_dir: " in line]
    assert line.startswith(f"{config}: runs_dir: cannot create run directories in ") and "--runs-dir" in line
    assert "checking" not in proc.stdout and "Traceback" not in proc.stderr  # no task built, no traceback


def test_restart_of_a_pipeline_whose_run_has_ended_says_how_to_start_it_again(tmp_path: Path):
    # Regression: after `kill RUN NAME` ended a one-pipeline run, `restart RUN NAME` said only "no torchherd
    # supervisor is running it".
    import io

    from torchherd.tui.verbs import act_command

    run_dir = tmp_path / "runs" / "20260101-000000-x"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("")
    err = io.StringIO()
    assert act_command("restart", str(run_dir), "a", tmp_path / "runs", io.StringIO(), err) != 0
    assert "no torchherd supervisor is running it" in err.getvalue()
    assert f"to start a again: torchherd resume {run_dir} --only a" in err.getvalue()
