"""One import package, `torchherd`: nothing generic is installed at top level, and a user's own
`engine.py`, `tui.py` or `torchherd.py` can neither shadow ours nor be shadowed by it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHADOWING = Path(__file__).parent / "tasks" / "shadowing"


@pytest.mark.slow
def test_a_project_with_its_own_engine_and_tui_runs(tmp_path: Path):
    # Regression: a folder with its own engine.py could not run torchherd at all
    # ("Error while finding module specification for 'engine.probe'").
    project = tmp_path / "project"
    shutil.copytree(SHADOWING, project)
    console = Path(sys.executable).parent / "torchherd"
    command = [str(console)] if console.exists() else [sys.executable, "-m", "torchherd"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([*command, "run", "run.toml", "--headless", "--runs-dir", str(tmp_path / "runs")],
                          cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    log = (run_dir / "user" / "log.txt").read_text()
    assert "Traceback" not in log, log
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["statuses"] for e in events if e["type"] == "run_finished"] == [{"user": "completed"}]


@pytest.mark.slow
def test_installed_package_exposes_only_torchherd(tmp_path: Path):
    wheels = tmp_path / "wheels"
    leftover = not (ROOT / "build").exists()  # setuptools builds in the checkout; leave it as it was
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(wheels), str(ROOT)], check=True, capture_output=True, timeout=240)
    finally:
        if leftover:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    [wheel] = wheels.glob("torchherd-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", target, str(wheel)], check=True, capture_output=True, timeout=240)
    installed = sorted(p.name for p in Path(target).iterdir() if not p.name.endswith(".dist-info") and p.name != "bin")
    assert installed == ["torchherd"], installed
    # The fresh venv has torchherd alone; its dependencies come from this interpreter's site-packages.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    code = ("import importlib.util as u, torchherd, torchherd.tui.app, torchherd.engine.supervise.supervisor; "
            "print(u.find_spec('engine'), u.find_spec('tui'), torchherd.__file__)")
    out = subprocess.run([str(python), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    engine_spec, tui_spec, where = out.stdout.split()
    assert (engine_spec, tui_spec) == ("None", "None")
    assert where.startswith(target)
    styles = list((Path(target) / "torchherd" / "tui").rglob("*.tcss"))
    assert len(styles) >= 4, styles
