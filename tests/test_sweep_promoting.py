"""Promoting ASHA with real worker processes on a grid built to trap stopping ASHA (tests/tasks/curves.py: 'fast'
leads at the first rung, 'slow' ends best): stopping ASHA cuts 'slow', promoting ASHA pauses it, promotes it as
the rung fills and ends with it best; a supervisor SIGKILLed mid-sweep resumes with its trials where they were."""
from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest

from torchherd.engine.protocol.messages import (PipelineFinished, Resumed, RunFinished, TrialDecision,
                                                WorkerStarted)
from torchherd.engine.rundir.directory import read_events, read_records
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, service_of
from tests.test_resume import cli, wait_until

pytestmark = pytest.mark.slow

SHAPES = ["fast", "slow", "bad1", "bad2"]
FAST, SLOW, BAD1, BAD2 = (f"t-shape{s}" for s in SHAPES)
# 5 ms a sample, 64 an epoch (a third of a second): a verdict reaches a trial in the epoch after its rung.
DELAY = 0.005


def sweep(mode: str) -> dict:
    return {"space": {"params": {"shape": SHAPES}}, "scheduler": "asha", "mode": mode, "grace_period": 1,
            "reduction_factor": 2}


async def _run(tmp_path, mode: str) -> tuple[dict[str, str], list, Path]:
    """The 4-trial grid on one CPU slot (trials start in grid order), under ASHA's `mode`."""
    (tmp_path / mode).mkdir()
    config = make_config(tmp_path / mode, [{"name": "t"}], sweep=sweep(mode), devices={"cpu_slots": 1},
                         defaults={"task": f"{TASKS / 'curves.py'}:build", "max_epochs": 4,
                                   "params": {"delay": DELAY}}, telemetry={"enabled": False}, tensorboard=False)
    sup = Supervisor(config)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 300)
    finally:
        await sup.shutdown(graceful=False)
    return statuses, read_events(sup.run_dir), sup.run_dir


def judged_once_per_rung(events) -> bool:
    """No trial was judged twice at a rung: none trained a rung again that it had passed."""
    seen = Counter((e.pipeline, e.rung) for e in events if isinstance(e, TrialDecision)
                   and e.action in ("continue", "pause"))
    return all(n == 1 for n in seen.values())


async def test_promoting_asha_keeps_the_slow_starter_that_stopping_asha_cuts(tmp_path):
    stopped, _, _ = await _run(tmp_path, "stop")
    assert stopped[SLOW] == "pruned" and stopped[FAST] == "completed", stopped

    statuses, events, run_dir = await _run(tmp_path, "promote")
    assert statuses == {FAST: "pruned", SLOW: "completed", BAD1: "pruned", BAD2: "pruned"}, statuses
    said = [(e.action, e.rung) for e in events if isinstance(e, TrialDecision) and e.pipeline == SLOW]
    assert said == [("pause", 1), ("promote", 1), ("continue", 2)], said
    assert judged_once_per_rung(events)
    resumed = [e for e in events if isinstance(e, Resumed) and e.pipeline == SLOW]
    assert resumed and resumed[0].epoch >= 1  # promoted: it trained on from its pause's checkpoint
    ends = {e.pipeline: e for e in events if isinstance(e, PipelineFinished)}  # the last of each
    assert ends[FAST].reason.startswith("val_loss 0.9 at epoch 2, never among the best 1 of the 2 trials"), ends[FAST]
    assert [e for e in events if isinstance(e, RunFinished)][-1].ok
    from torchherd.tui.bridge import replay_run

    assert replay_run(run_dir).ranked()[0].name == SLOW  # the sweep view ranks it first


def test_a_sigkilled_promoting_sweep_resumes_with_paused_trials_paused_and_promoted_ones_training(tmp_path):
    toml = tmp_path / "sweep.toml"
    toml.write_text(f"""
runs_dir = "{tmp_path / 'runs'}"
tensorboard = false
[defaults]
task = "{TASKS / 'curves.py'}:build"
max_epochs = 4
batch_size = 32
params = {{ delay = {DELAY} }}
[[pipelines]]
name = "t"
[devices]
placement = "cpu"
cpu_slots = 1
[validation]
mode = "inline"
[telemetry]
enabled = false
[sweep]
scheduler = "asha"
mode = "promote"
[sweep.space]
params.shape = {SHAPES!r}
""".replace("'", '"'))
    proc = cli("run", str(toml), "--headless")
    try:
        def fast_promoted_and_training():  # 'slow' waits at rung 1; 'fast', promoted, trains on
            found = list((tmp_path / "runs").glob("*/events.jsonl"))
            records = read_records(found[0]) if found else []
            promoted = [i for i, r in enumerate(records) if r.get("type") == "trial_decision"
                        and r.get("action") == "promote" and r.get("pipeline") == FAST]
            return promoted and any(r.get("type") == "training_started" and r.get("pipeline") == FAST
                                    for r in records[promoted[0]:])
        wait_until(fast_promoted_and_training, 120)
        [run_dir] = list((tmp_path / "runs").iterdir())
        service_of(run_dir).send_signal(signal.SIGKILL)
        assert proc.wait(30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = read_events(run_dir)
    last = {e.pipeline: e.action for e in before if isinstance(e, TrialDecision)}  # as the kill left them
    assert last[SLOW] == "pause", last  # 'slow' waits at rung 1 ('fast' may have paused again at rung 2)
    again = cli("resume", str(run_dir), "--headless")
    text, _ = again.communicate(timeout=240)
    assert again.returncode == 0, text
    later = read_events(run_dir)[len(before):]
    started = [e.pipeline for e in later if isinstance(e, WorkerStarted)]
    if last[FAST] == "promote":  # killed while it trained on: it trains on first
        assert started[0] == FAST, started
    for name in (n for n, action in last.items() if action == "pause"):  # paused: it waits for a promotion
        promoted = next((i for i, e in enumerate(later) if isinstance(e, TrialDecision) and e.pipeline == name
                         and e.action == "promote"), len(later))
        assert not any(isinstance(e, WorkerStarted) and e.pipeline == name for e in later[:promoted]), name
    events = read_events(run_dir)
    assert judged_once_per_rung(events)
    finals = [e for e in later if isinstance(e, RunFinished)][-1].statuses
    assert finals == {FAST: "pruned", SLOW: "completed", BAD1: "pruned", BAD2: "pruned"}, finals
