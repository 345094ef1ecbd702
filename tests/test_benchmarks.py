"""Every benchmark in benchmarks/ runs, in its quick mode, as a real process: exit 0 and its ratio line printed.

No figure is asserted (tests never judge wall-clock time); this only keeps a benchmark from rotting unseen.
Regression: benchmarks/service_attach.py's attach section failed on main for a while and nobody noticed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


GPU = pytest.mark.skipif(not _cuda(), reason="CUDA not available")

# name -> (arguments, environment, a pattern its ratio line matches, marks): the least that takes every path.
QUICK: dict[str, tuple[list[str], dict[str, str], str, list]] = {
    "client_cost": (["--calls", "2000", "--steps", "30", "--rounds", "1", "--imports", "1"], {},
                    r"training loop: .* ratio \d", []),
    "client_read": (["--events", "2000", "--told", "250", "--history", "8000", "--rounds", "1"], {},
                    r"history: .* ratio \d", []),
    "telemetry_cost": (["--workers", "2", "--seconds", "1", "--passes", "5"], {}, r"finding descendants: .*x\)", []),
    "handoff_gpu": ([], {"ROUNDS": "1", "MIB": "8"}, r"ratio", [GPU]),
    "spike_alarms": (["--quick"], {}, r"spike=10 spike_persist=3 +\d+ of \d+", []),
    "exporter_scrape": (["--quick"], {}, r"scrape of 8 live pipelines: .* ratio \d", []),
}
# Benchmarks with no quick mode within CI's budget yet (seconds each): each must get one and a row above;
# listed so that none is forgotten. tensorboard_cost and supervision_overhead have --quick (about 37 s each on a
# loaded 2-core box: two real runs each), service_attach --quick with small sizes about 120 s: all still too slow.
PENDING = {"tensorboard_cost", "supervision_overhead", "service_attach", "tui_cost", "first_screen",
           "sweep_restarts", "sweep_asha", "shared_box", "script_resume", "first_step", "validation_overlap",
           "fsdp_memory", "gang_overhead", "gang_restart", "fsdp_gang", "lightning_gang", "lightning_overlap",
           "ray_overhead", "ray_sweeps"}


def test_every_benchmark_has_a_quick_mode_here():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(QUICK) | PENDING, sorted(scripts ^ (set(QUICK) | PENDING))


@pytest.mark.slow  # starts the benchmark, which starts workers, runs or an app of its own
@pytest.mark.parametrize("name", [pytest.param(n, marks=QUICK[n][3]) for n in QUICK])
def test_a_benchmark_runs_in_its_quick_mode(name: str, tmp_path: Path):
    args, env, ratio, _ = QUICK[name]
    proc = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    assert re.search(ratio, proc.stdout), proc.stdout[-2000:]
