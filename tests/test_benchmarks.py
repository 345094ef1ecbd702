"""Every benchmark in benchmarks/ runs, in its quick mode, as a real process: exit 0 and its ratio line printed.

No figure is asserted (tests never judge wall-clock time); this only keeps a benchmark from rotting unseen.
Regressions: service_attach's attach section, tui_cost (its app never launched), lightning_overlap's in-process
runner and supervision_overhead's status channel each failed on main for a while and nobody noticed.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


GPU = pytest.mark.skipif(not _cuda(), reason="CUDA not available")
LIGHTNING = pytest.mark.skipif(_missing("lightning"),
                               reason='Lightning is not installed: pip install "torchherd[lightning]"')
# Ray's tier (scripts/test.sh runs `-m ray` apart): each starts a Ray of its own
RAY = [pytest.mark.ray,
       pytest.mark.skipif(_missing("ray"), reason='Ray is not installed: pip install "torchherd[ray]"')]

# name -> (arguments, environment, a pattern its ratio line matches, marks): the least that takes every path.
QUICK: dict[str, tuple[list[str], dict[str, str], str, list]] = {
    "client_cost": (["--calls", "2000", "--steps", "30", "--rounds", "1", "--imports", "1"], {},
                    r"training loop: .* ratio \d", []),
    "client_read": (["--events", "2000", "--told", "250", "--history", "8000", "--rounds", "1"], {},
                    r"history: .* ratio \d", []),
    "telemetry_cost": (["--workers", "2", "--seconds", "1", "--passes", "5"], {}, r"finding descendants: .*x\)", []),
    "handoff_gpu": ([], {"ROUNDS": "1", "MIB": "8"}, r"ratio", [GPU]),
    "spike_alarms": (["--quick"], {}, r"spike=10 spike_persist=3 +\d+ of \d+", []),
    "tensorboard_cost": (["--quick"], {}, r"run wall time: .*ratio on/off \d", []),
    "supervision_overhead": (["--quick"], {}, r"(?s)tracking sinks .*on/off.*ratio supervised/bare \d.*worker CPU per reported step", []),
    "service_attach": (["--quick", "--only", "attach,fanout,training,cpu"], {},
                       r"(?s)full screen after attach: .*ratio clients/in-process .*ratio detached/in-process \d.*"
                       r"\d clients attached, 1 rounds", []),
    "tui_cost": (["--seconds", "1", "--warmup", "0.5", "--pipelines", "2", "--history", "200", "--rate", "50"], {},
                 r"app CPU: [\d.]+% of one core", []),
    "first_screen": (["--rounds", "1"], {}, r"torchherd run CONFIG +[\d.]+ s +ratio \d", []),
    "first_step": ([], {"ROUNDS": "1"}, r"regression Task +[\d.]+s +[\d.]+x", []),
    "validation_overlap": (["--quick"], {}, r"saturated .*background/inline training time \d", []),
    "sweep_restarts": (["--trials", "2", "--epochs", "2", "--samples", "256", "--rounds", "1"], {},
                       r"promote: warm restarts / cold restarts .*x the CPU seconds", []),
    "sweep_asha": (["--quick", "--no-ray"], {}, r"(?s)ASHA promote / no pruning over 1 round.*Ray Tune: skipped", []),
    "ray_sweeps": (["--quick"], {}, r"torchherd PBT \(mean of rounds\) / Ray Tune PBT: [\d.]+x", RAY),
    "shared_box": (["--quick"], {}, r"4 runs x 2, no ledger: +wall [\d.]+x", []),
    "script_resume": (["--kills", "1"], {}, r"no_flag / resume_args \(median steps lost\): [\d.]+x", []),
    "fsdp_memory": (["--width", "64", "--layers", "2"], {}, r"checkpoint write, DCP / gather: [\d.]+x", []),
    "gang_overhead": (["--quick"], {}, r"samples/s torchherd / torchrun: \d", []),
    # torchrun's one restart may not come back in time on a loaded box: then there is no ratio, only the counts
    "gang_restart": (["--kills", "1"], {}, r"(?s)torchherd +\d/1 restarts came back.*torchrun +\d/1 restarts", []),
    "fsdp_gang": (["--quick"], {}, r"fsdp gang / plain FSDP2 under torchrun: \d", []),
    "lightning_gang": (["--quick"], {}, r"(?s)ratio [\d.]+ \(goal >= 0.97\).*sequential/train-only \d", [LIGHTNING]),
    "lightning_overlap": (["--quick"], {}, r"torchherd runner in this process .*x plain Trainer.fit", [LIGHTNING]),
    "ray_overhead": (["--quick"], {}, r"(?s)SIGKILL of the training process to its next step, ray: .*ray +node", RAY),
    "exporter_scrape": (["--quick"], {}, r"scrape of 8 live pipelines: .* ratio \d", []),
    "checkpoint_stall": (["--quick"], {}, r"ratio async/bare [\d.]+x .*ratio async/sync [\d.]+x", []),
    "recovery": (["--quick"], {}, r"(?s)kill to next step, torchherd / torchrun: [\d.]+.*cold restarts / torchrun: "
                 r"[\d.]+", []),
}
# The script a row runs, where it is not the row's own: ray_sweeps.py is Ray Tune's side of sweep_asha.py.
SCRIPT = {"ray_sweeps": "sweep_asha"}
# A module a row needs beyond its marks', tried in a child only when the row runs (importing Ray here would
# change this process's environment): torchherd[ray] brings no Ray Tune.
NEEDS = {"ray_sweeps": ("ray.tune", 'Ray Tune is not installed: pip install "ray[tune]"')}


def test_every_benchmark_has_a_quick_mode_here():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(QUICK), sorted(scripts ^ set(QUICK))


@pytest.mark.slow  # starts the benchmark, which starts workers, runs or an app of its own
@pytest.mark.parametrize("name", [pytest.param(n, marks=QUICK[n][3]) for n in QUICK])
def test_a_benchmark_runs_in_its_quick_mode(name: str):
    args, env, ratio, _ = QUICK[name]
    if name in NEEDS and subprocess.run([sys.executable, "-c", f"import {NEEDS[name][0]}"],
                                        capture_output=True).returncode != 0:
        pytest.skip(NEEDS[name][1])
    script = BENCHMARKS / f"{SCRIPT.get(name, name)}.py"
    tmp = tempfile.mkdtemp(prefix="thb-")  # short: Ray's sockets are made under it, and AF_UNIX paths are short
    try:
        proc = subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=600, env={**os.environ, **env, "TMPDIR": tmp})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    assert re.search(ratio, proc.stdout), proc.stdout[-2000:]
