"""How often the loss-spike alert cries wolf, and how soon it catches a real divergence, at several settings.

Runs every sample config in sample_configs/ headless (the larger ones shrunk to a few epochs) and the scripts
and tasks of tests/tasks that report a training loss, beside tests/tasks/scripts/spiky_loop.py twice: healthy
with the same hard batch (loss x20) at step 100 of every epoch, and diverging (at step 300 the loss jumps x5
and stays up). Then replays each pipeline's step reports from events.jsonl through the real AlertRules at each
setting (`interval` 0: every firing counts) and prints, per setting, the false alarms of each healthy pipeline
and how many reports after the jump the diverging one alerts.
Usage: python benchmarks/spike_alarms.py [--quick] [--keep DIR] [--replay DIR] [--full]
(--quick: the spiky pair alone; --keep: leave the runs there; --replay: only replay the runs under DIR;
--full: the sample configs at their own sizes.)
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchherd.engine.config.alerts import AlertsConfig  # noqa: E402
from torchherd.engine.protocol.messages import StepMetrics  # noqa: E402
from torchherd.engine.rundir.directory import read_events  # noqa: E402
from torchherd.engine.supervise.health.alert_rules import AlertRules  # noqa: E402

SAMPLES = ROOT / "sample_configs"
TASKS = ROOT / "tests" / "tasks"
SCRIPTS = TASKS / "scripts"
TIMEOUT = 900  # seconds one config may run
# Keys to shrink, per sample config, so that all of them run in minutes on a laptop CPU (--full: none).
SHRINK = {"regression.toml": {"max_epochs": "2", "samples": "40000"},
          "gang.toml": {"max_epochs": "3", "samples": "20000"},
          "background_validation.toml": {"max_epochs": "3", "samples": "20000"}}
DIVERGE_AT = 300  # the diverging pipelines' step where the loss jumps
DIVERGING = "diverging"  # the names of the diverging pipelines begin so; every other pipeline is healthy
SPIKY = r"epoch (?P<epoch>\d+) step (?P<step>\d+) loss (?P<loss>\S+)"
# name -> spiky_loop.py's arguments (4 epochs of 150 steps each)
SPIKY_RUNS = {"outlier": ["--outlier-at", "100"],
              "outlier-running-mean": ["--outlier-at", "100", "--running-mean"],
              f"{DIVERGING}-x5": ["--diverge-at", str(DIVERGE_AT)],
              f"{DIVERGING}-x2": ["--diverge-at", str(DIVERGE_AT), "--diverge-x", "2"]}
SPIKY_PAIR = "".join(f'''
[[pipelines]]
name = "{name}"
script = "{SCRIPTS / 'spiky_loop.py'}"
metrics = '{SPIKY}'
args = {json.dumps(["--epochs", "4", *extra])}
''' for name, extra in SPIKY_RUNS.items())
HEAD = '''
[defaults]
max_epochs = 4

[devices]
placement = "cpu"
cpu_slots = 2

[validation]
mode = "off"
'''
TESTS = f'''
[[pipelines]]
name = "tiny"
task = "{TASKS / 'tiny.py'}:build"
params = {{ samples = 2048 }}
batch_size = 32
log_every_n_steps = 2

[[pipelines]]
name = "gpt_like"
script = "{SCRIPTS / 'gpt_like.py'}"
metrics = 'iter (?P<step>\\d+): loss (?P<loss>[-+.\\deE]+)'
args = ["--out_dir={{checkpoint_dir}}", "--max_iters=400", "--delay=0"]

[[pipelines]]
name = "client_loop"
script = "{SCRIPTS / 'client_loop.py'}"
args = ["--epochs", "5", "--steps", "40"]

[[pipelines]]
name = "ddp_loop"
script = "{SCRIPTS / 'ddp_loop.py'}"
ranks = 2
metrics = 'step (?P<step>\\d+) loss (?P<loss>[-+.\\deE]+)'
args = ["--epochs", "5", "--samples", "2048"]

[[pipelines]]
name = "plain_loop"
script = "{SCRIPTS / 'plain_loop.py'}"
args = ["--epochs", "20", "--delay", "0"]
'''


def settings() -> list[dict]:
    """The settings tried: thresholds, and (where this torchherd has it) how many reports a spike must last."""
    if "spike_persist" not in AlertsConfig.model_fields:
        return [{"spike": s} for s in (5.0, 10.0, 20.0, 50.0, 100.0)]
    return [{"spike": s, "spike_persist": p} for p in (1, 2, 3) for s in (5.0, 10.0, 20.0, 50.0)]


def label(setting: dict) -> str:
    return " ".join(f"{k}={v:g}" for k, v in setting.items())


def run(config: Path, runs: Path, name: str) -> str:
    """Run `config` headless into runs/name; '' when it ran, else why not (one line)."""
    proc = subprocess.run([sys.executable, "-m", "torchherd", "run", str(config), "--headless", "--runs-dir",
                           str(runs / name)], cwd=config.parent, capture_output=True, text=True, timeout=TIMEOUT)
    if proc.returncode in (0, 3):
        return ""
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return f"exit {proc.returncode}: {tail[-1] if tail else ''}"


def record(runs: Path, quick: bool, full: bool) -> None:
    """Run the sources into runs/<source>/<run id>/, saying what did not run."""
    work = Path(tempfile.mkdtemp(prefix="spike-alarms-"))
    try:
        (work / "tests.toml").write_text(HEAD + SPIKY_PAIR + ("" if quick else TESTS))
        todo = [(work / "tests.toml", "tests")]
        if not quick:
            shutil.copytree(SAMPLES, work / "samples")
            for config in sorted((work / "samples").glob("*.toml")):
                text = config.read_text()
                for key, value in ({} if full else SHRINK.get(config.name, {})).items():
                    text = re.sub(rf"^{key} = \S+", f"{key} = {value}", text, flags=re.M)
                config.write_text(text)
                todo.append((config, config.stem))
        for config, name in todo:
            why = run(config, runs, name)
            print(f"ran {name}" + (f": {why}" if why else ""), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pipelines(runs: Path) -> dict[str, list[StepMetrics]]:
    """source/pipeline -> its step reports in the order the supervisor read them, of every run under `runs`."""
    out: dict[str, list[StepMetrics]] = {}
    for events in sorted(runs.glob("*/*/events.jsonl")):
        source = events.parent.parent.name
        for e in read_events(events.parent):
            if isinstance(e, StepMetrics):
                out.setdefault(f"{source}/{e.pipeline}", []).append(e)
    return out


def alarms(steps: list[StepMetrics], setting: dict) -> list[int]:
    """The indexes of the reports that raised a spike alert, at `setting`, every firing counted."""
    rules = AlertRules(AlertsConfig(interval=0.0, **setting))
    return [i for i, e in enumerate(steps) for a in rules.take(e) if a.rule == "spike"]


def verdict(hits: list[int], steps: list[StepMetrics]) -> str:
    """What the alerts on a diverging pipeline came to: how many reports after the jump the first was (false
    ones before it counted)."""
    jump = next(i for i, e in enumerate(steps) if e.step >= DIVERGE_AT)
    early = sum(1 for i in hits if i < jump)
    late = [i - jump for i in hits if i >= jump]
    said = f"+{late[0]} reports" if late else "missed"
    return f"{said}, {early} false" if early else said


def table(runs: dict[str, list[StepMetrics]]) -> None:
    tried = settings()
    healthy = [name for name in runs if not name.split("/")[-1].startswith(DIVERGING)]
    diverging = [name for name in runs if name not in healthy]
    found = {name: [alarms(steps, s) for s in tried] for name, steps in runs.items()}
    print(f"\nreplayed {len(healthy)} healthy pipelines ({sum(len(runs[n]) for n in healthy)} step reports): "
          + ", ".join(f"{n} ({len(runs[n])})" for n in healthy))
    print(f"diverging: {', '.join(diverging) or 'none'} (the loss jumps at step {DIVERGE_AT} and stays up)")
    heads = ["setting", "healthy alarmed", "false alarms", "where", *(n.split("/")[-1] for n in diverging)]
    rows = []
    for k, s in enumerate(tried):
        hit = {n: len(found[n][k]) for n in healthy if found[n][k]}
        rows.append([label(s), f"{len(hit)} of {len(healthy)}", str(sum(hit.values())),
                     ", ".join(f"{n} {c}" for n, c in hit.items()) or "-",
                     *(verdict(found[n][k], runs[n]) for n in diverging)])
    widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
    for r in [heads, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    default = AlertsConfig()
    print(f"the default: {label({k: getattr(default, k) for k in tried[0]})}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the spiky pair alone (CI: it still runs)")
    ap.add_argument("--full", action="store_true", help="the sample configs at their own sizes")
    ap.add_argument("--keep", type=Path, help="run into this folder and leave the runs there")
    ap.add_argument("--replay", type=Path, help="replay the runs already under this folder; run nothing")
    args = ap.parse_args()
    if args.replay:
        runs = args.replay
    else:
        runs = args.keep or Path(tempfile.mkdtemp(prefix="spike-runs-"))
        record(runs, args.quick, args.full)
    try:
        table(pipelines(runs))
    finally:
        if not args.replay and not args.keep:
            shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
