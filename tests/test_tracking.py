"""MLflow and W&B, read back with their own clients after real runs of Task pipelines: one tracker run per
pipeline with its params, every logged step's train loss, its validation metric and its end; a resumed run writes
on into the same tracker runs; a sweep's trials are nested under one MLflow run of the session."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchherd.engine.protocol.messages import StepMetrics
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, wait_for

pytestmark = pytest.mark.slow
mlflow = pytest.importorskip("mlflow")  # the dev extra installs both trackers: CI runs these
pytest.importorskip("wandb")


def client(db: Path):
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")


def losses(run_dir: Path, pipeline: str) -> dict[int, float]:
    """Every step report's loss of `pipeline`, by step (the newest at a step a resume trained again)."""
    return {e.step: e.loss for e in read_events(run_dir) if isinstance(e, StepMetrics) and e.pipeline == pipeline}


async def first_run(tmp_path: Path, db: Path) -> Path:
    """Pipelines a and b; b is stopped mid-epoch (it waits at its sixth step for the stop), a completes."""
    gate = tmp_path / "stop-asked"
    config = make_config(tmp_path, [{"name": "a"}, {"name": "b", "params": {"gate_file": str(gate),
                                                                              "gate_at_call": 6, "lr": 0.02}}],
                         defaults={"max_epochs": 2, "task": f"{TASKS / 'faulty.py'}:build"},
                         telemetry={"enabled": False}, name="tracked",
                         tracking={"mlflow": f"sqlite:///{db}", "wandb": "offline", "project": "herd",
                                   "points_per_s": 0})  # its steps come far faster than 20 a second
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.pipeline == "b" and e.step >= 4)
        sup.stop("b")
        gate.touch()
        statuses = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown()
    assert statuses == {"a": "completed", "b": "stopped"}
    return sup.run_dir


def wandb_history(run_dir: Path, pipeline: str) -> tuple[dict, list[dict]]:
    """W&B's own reader (`wandb leet inspect --json`) over the pipeline's newest offline run file: its summary,
    and its history records."""
    kept = json.loads((run_dir / "tracking" / "wandb.json").read_text())["runs"][pipeline]
    files = sorted((run_dir / "tracking" / "wandb").glob(f"offline-run-*-{kept}/run-{kept}.wandb"))
    leet = [sys.executable, "-m", "wandb", "leet", "inspect", "--json"]
    summary = json.loads(subprocess.run([*leet, "--summary", str(files[-1])], capture_output=True, text=True,
                                        timeout=120, check=True).stdout)
    out = subprocess.run([*leet, str(files[0])], capture_output=True, text=True, timeout=120, check=True).stdout
    history = [r["history"]["item"] for r in map(json.loads, out.splitlines()) if r.get("type") == "history"]
    return summary, history


async def test_each_pipeline_is_one_mlflow_and_one_wandb_run_and_a_resume_writes_on_into_them(tmp_path):
    db = tmp_path / "mlflow.db"
    run_dir = await first_run(tmp_path, db)
    mlf = client(db)
    [experiment] = [e for e in mlf.search_experiments() if e.name == "tracked"]
    runs = {r.info.run_name: r for r in mlf.search_runs([experiment.experiment_id])}
    assert set(runs) == {"a", "b"}
    a, b = runs["a"], runs["b"]
    assert (a.info.status, b.info.status) == ("FINISHED", "KILLED")
    assert b.data.params["params.lr"] == "0.02" and a.data.params["max_epochs"] == "2"
    assert a.data.tags["torchherd.state"] == "completed" and a.data.tags["torchherd.run_id"] == run_dir.name
    history = {m.step: m.value for m in mlf.get_metric_history(a.info.run_id, "train/loss")}
    assert history == pytest.approx(losses(run_dir, "a"))  # every logged step, as events.jsonl has them
    assert "val/val_loss" in a.data.metrics and a.data.tags["torchherd.best_checkpoint"].endswith("best.pt")
    summary, rows = wandb_history(run_dir, "a")
    assert summary["state"] == "finished" and summary["summary"]["state"] == "completed"
    assert summary["config"]["max_epochs"] == 2 and summary["config"]["torchherd.run_id"] == run_dir.name
    assert {r["trainer/step"]: r["train/loss"] for r in rows if "train/loss" in r} == pytest.approx(losses(run_dir, "a"))

    stopped_at = max(losses(run_dir, "b"))
    sup = Supervisor.resume_run(run_dir)
    await sup.start()
    try:
        assert await asyncio.wait_for(sup.wait(), 120) == {"a": "completed", "b": "completed"}
    finally:
        await sup.shutdown()
    again = {r.info.run_name: r for r in mlf.search_runs([experiment.experiment_id])}
    assert set(again) == {"a", "b"} and again["b"].info.run_id == b.info.run_id  # the same MLflow run, written on
    assert again["b"].info.status == "FINISHED"
    steps = {m.step for m in mlf.get_metric_history(b.info.run_id, "train/loss")}
    assert max(steps) > stopped_at and min(steps) <= stopped_at
    summary, _ = wandb_history(run_dir, "b")
    assert summary["state"] == "finished" and summary["run_id"] == json.loads(
        (run_dir / "tracking" / "wandb.json").read_text())["runs"]["b"]


async def test_a_sweeps_trials_are_mlflow_runs_nested_under_one_run_of_the_session(tmp_path):
    db = tmp_path / "mlflow.db"
    config = make_config(tmp_path, [{"name": "t"}], defaults={"max_epochs": 1}, telemetry={"enabled": False},
                         sweep={"space": {"params": {"lr": [0.01, 0.02, 0.03, 0.04]}}}, name="swept",
                         tracking={"mlflow": f"sqlite:///{db}"})
    sup = Supervisor(config)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 180)
    finally:
        await sup.shutdown()
    assert len(statuses) == 4 and set(statuses.values()) == {"completed"}
    mlf = client(db)
    [experiment] = [e for e in mlf.search_experiments() if e.name == "swept"]
    runs = mlf.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.info.run_name == sup.run_id]
    trials = [r for r in runs if r is not parent]
    assert sorted(r.info.run_name for r in trials) == sorted(statuses)
    assert {r.data.tags.get("mlflow.parentRunId") for r in trials} == {parent.info.run_id}
    assert sorted(r.data.params["params.lr"] for r in trials) == ["0.01", "0.02", "0.03", "0.04"]
    assert parent.info.status == "FINISHED" and {r.info.status for r in trials} == {"FINISHED"}
