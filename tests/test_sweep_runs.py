"""Sweeps with real worker processes: 12 trials on 2 CPU slots pruned by ASHA (the worst at their first rung,
the best to the end, its checkpoint loads), and a sweep cut short by Ctrl-C that `torchherd resume` carries on
for exactly the trials that had not ended well."""
from __future__ import annotations

import asyncio
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from torchherd.engine.protocol.messages import (PipelineFinished, RunFinished, TrainingStarted, TrialDecision,
                                                WorkerStarted)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config
from tests.test_resume_stopped import cli

pytestmark = pytest.mark.slow

# Best first: on tiny.py (a linear fit) a larger step learns faster, and lr 0 never learns. Started in this
# order, every trial after the first few meets a rung whose cut is set by better ones.
LRS = [0.1, 0.05, 0.03, 0.02, 0.01, 0.005, 0.003, 0.002, 0.001, 0.0003, 0.0001, 0.0]
SWEEP = {"space": {"params": {"lr": LRS}}, "scheduler": "asha", "mode": "stop", "grace_period": 1,
         "reduction_factor": 2}


async def test_asha_prunes_the_worst_at_their_first_rung_and_the_best_runs_to_the_end(tmp_path):
    # 1 ms a sample (a quarter of a second an epoch): the worst's first rung verdict reaches it before it has
    # trained on to its end, however loaded the machine (an epoch of milliseconds raced it).
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 4, "params": {"delay": 0.001}},
                         sweep=SWEEP, telemetry={"enabled": False})
    assert len(config.pipelines) == 12
    sup = Supervisor(config)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 240)
    finally:
        await sup.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    names = [p.name for p in config.pipelines]
    best, worst = names[0], names[-1]
    assert {e.pipeline for e in events if isinstance(e, WorkerStarted)} == set(names)  # every trial started
    pruned = {e.pipeline: e for e in events if isinstance(e, TrialDecision) and e.action == "prune"}
    assert pruned[worst].rung == 1 and "rung cut" in pruned[worst].reason
    assert statuses[worst] == "pruned" and statuses[best] == "completed"
    assert sum(s == "pruned" for s in statuses.values()) >= 6
    finished = {e.pipeline: e for e in events if isinstance(e, PipelineFinished)}
    assert finished[worst].reason.startswith("val_loss") and finished[worst].epoch < 4
    assert [e for e in events if isinstance(e, RunFinished)][-1].ok  # pruned is a success
    # Regression: the app's last words on a sweep were its states in config order; headless ranks them.
    from torchherd.tui.bridge import run_end

    lines = run_end(sup.run_dir).lines
    assert lines[1] == "  sweep: 12 trials ranked by val_loss" and lines[3].split()[:2] == ["1", best], lines
    assert any(line.startswith(f"  best: {best} ") for line in lines), lines
    # The best trial's best checkpoint loads into its model.
    from tests.tasks.tiny import build
    state = torch.load(sup.run_dir / best / "checkpoints" / "best.pt", weights_only=False)
    build({"lr": LRS[0]}).model.load_state_dict(state["model"])
    assert (sup.run_dir / worst / "checkpoints").is_dir()  # a pruned trial keeps its checkpoints


def lines_of(proc: subprocess.Popen) -> queue.Queue:
    """The process's stdout, a line at a time, read on a thread (so a wait can time out)."""
    out: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            out.put(line)
        out.put(None)
    threading.Thread(target=pump, daemon=True).start()
    return out


def test_ctrl_c_then_resume_carries_on_exactly_the_unfinished_trials(tmp_path):
    toml = tmp_path / "sweep.toml"
    lrs = ", ".join(map(str, LRS[:8]))
    toml.write_text(f"""
runs_dir = "{tmp_path / 'runs'}"
[defaults]
task = "{TASKS / 'tiny.py'}:build"
max_epochs = 4
params = {{ delay = 0.003 }}
[[pipelines]]
name = "t"
[devices]
placement = "cpu"
cpu_slots = 2
[validation]
mode = "inline"
[telemetry]
enabled = false
[sweep]
scheduler = "asha"
mode = "stop"
[sweep.space]
params.lr = [{lrs}]
""")
    proc = subprocess.Popen([sys.executable, "-m", "torchherd", "run", str(toml), "--headless"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        out = lines_of(proc)
        while True:  # interrupt once some trial was pruned, while others train or wait
            line = out.get(timeout=180)
            assert line is not None, "".join(seen)
            seen.append(line)
            if ": pruned (" in line:
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 3, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [run_dir] = list((tmp_path / "runs").iterdir())
    before = {e.pipeline: e.status for e in read_events(run_dir) if isinstance(e, PipelineFinished)}
    unfinished = {n for n, s in before.items() if s not in ("completed", "pruned", "early_stopped")}
    assert "pruned" in before.values() and unfinished, before
    count = len(read_events(run_dir))
    again = cli("resume", str(run_dir), "--headless")
    assert again.returncode == 0, again.stdout + again.stderr
    later = read_events(run_dir)[count:]
    assert {e.pipeline for e in later if isinstance(e, TrainingStarted)} == unfinished
    last = [e for e in later if isinstance(e, RunFinished)][-1]
    assert all(last.statuses[n] == s for n, s in before.items() if n not in unfinished)  # pruned stay pruned


def test_the_sample_sweep_prunes_and_prints_the_ranked_table(tmp_path):
    sample = Path(__file__).resolve().parent.parent / "sample_configs" / "sweep.toml"
    proc = subprocess.run([sys.executable, "-m", "torchherd", "run", str(sample), "--headless",
                           "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=540)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert ": pruned (val_loss" in out and "never among the best" in out and ": waiting at rung 1 (val_loss" in out
    table = out[out.index("sweep: 8 trials ranked by val_loss"):]
    assert "#  trial" in table and "best: reg-lr" in table and "best.pt" in table


async def test_a_script_sweep_hands_each_trial_its_own_values(tmp_path):
    # Regression: `args = ["--epochs", "{params.epochs}"]` reached the script as the text '{params.epochs}';
    # argparse refused it and every trial failed.
    from torchherd.engine.protocol.messages import EpochEnd
    from tests.test_engine_runs import run_to_end

    config = make_config(tmp_path, [{"name": "s", "script": str(TASKS / "scripts" / "plain_loop.py"),
                                     "args": ["--epochs", "{params.epochs}", "--delay", "0"],
                                     "metrics": r"Epoch (?P<epoch>\d+), Loss: (?P<loss>[-+.\deE]+)"}],
                         sweep={"space": {"params": {"epochs": [1, 2]}}}, validation={"mode": "off"},
                         telemetry={"enabled": False})
    sup = Supervisor(config)
    assert await run_to_end(sup) == {"s-epochs1": "completed", "s-epochs2": "completed"}
    ends = [e.pipeline for e in read_events(sup.run_dir) if isinstance(e, EpochEnd)]
    assert (ends.count("s-epochs1"), ends.count("s-epochs2")) == (1, 2)


async def test_a_lightning_sweep_over_datamodule_params_trains_different_trials(tmp_path):
    # Regression: a sweep over batch_size did nothing for a Lightning pipeline: the DataModule's own batch_size
    # won and every trial had the same steps per epoch and results.
    from torchherd.engine.protocol.messages import EpochEnd
    from tests.test_engine_runs import run_to_end

    config = make_config(tmp_path, [{"name": "lit", "task": f"lightning:{TASKS / 'lit_tiny.py'}:LitTiny",
                                     "datamodule": f"{TASKS / 'lit_gang.py'}:RegressionData",
                                     "datamodule_params": {"samples": 128}}],
                         defaults={"max_epochs": 1}, sweep={"space": {"datamodule_params": {"batch_size": [16, 64]}}},
                         validation={"mode": "off"}, telemetry={"enabled": False})
    sup = Supervisor(config)
    assert await run_to_end(sup, timeout=300) == {"lit-batch_size16": "completed", "lit-batch_size64": "completed"}
    per_epoch = {e.pipeline: e.steps_per_epoch for e in read_events(sup.run_dir) if isinstance(e, EpochEnd)}
    assert per_epoch == {"lit-batch_size16": 8, "lit-batch_size64": 2}
