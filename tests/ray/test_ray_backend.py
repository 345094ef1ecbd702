"""The Ray backend end to end on a local two-node cluster: placement, completion, faults, commands.

Each test runs a real supervisor in this process against the module's cluster; workers are Ray
actors' children on its nodes, reporting over the dial-back connection.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import psutil
import pytest

from torchherd.engine.protocol.messages import (CheckpointSaved, Notice, PipelineFinished, Resumed, RunFinished,
                                                StepMetrics, TrainingStarted, WorkerExited, WorkerStarted,
                                                WorkerStateChanged)
from torchherd.engine.protocol.telemetry import TelemetrySnapshot
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, wait_for
from tests.ray.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def node_of(sup: Supervisor, name: str, attempt: int = 1) -> str:
    """The node a pipeline's attempt ran on, as its log's header names it."""
    log = (sup.run_dir / name / "log.txt").read_text()
    return re.search(rf"attempt {attempt} on (\S+) \(Ray\)", log).group(1)


def worker_process(pipeline_dir: Path) -> psutil.Process:
    """The running child whose spec lives in `pipeline_dir` (a descendant of this test's cluster)."""
    spec = str(pipeline_dir / "worker.json")
    for p in psutil.Process().children(recursive=True):
        try:
            if spec in p.cmdline():
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no worker process for {pipeline_dir}")


async def test_pipelines_land_on_both_nodes_and_complete(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a"}, {"name": "b"}], cluster.address,
                        defaults={"max_epochs": 2}, validation={"mode": "inline"})
    sup = Supervisor(config)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 120)
    finally:
        await sup.shutdown(graceful=False)
    assert statuses == {"a": "completed", "b": "completed"}
    assert node_of(sup, "a") != node_of(sup, "b")
    events = read_events(sup.run_dir)
    assert isinstance(events[-1], RunFinished) and events[-1].ok
    assert "torchherd worker pid" in (sup.run_dir / "a" / "log.txt").read_text()
    started = {e.pipeline: e for e in events if isinstance(e, WorkerStarted)}
    assert all(e.pid > 0 for e in started.values())  # the child's pid, not the 0 of an actor not started yet
    # The head is this process's node: shown as "" there; the other node by its label.
    assert sorted(bool(e.node) for e in started.values()) == [False, True]


async def test_sigkill_of_the_actor_process_restarts_from_the_checkpoint(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a", "params": {"delay": 0.004}}], cluster.address,
                        defaults={"max_epochs": 4}, restart={"min_uptime": 0.0}, validation={"mode": "inline"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "epoch")
        child = worker_process(sup.run_dir / "a")
        actor = child.parent()
        assert "ChildHost" in " ".join(actor.cmdline())
        os.kill(actor.pid, signal.SIGKILL)  # the Ray worker process: the child goes with it
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
        assert exited.signal == "SIGKILL" and exited.reason == "crashed"
        resumed = await wait_for(stream, lambda e: isinstance(e, Resumed))
        assert resumed.epoch >= 1  # from its checkpoint, not from scratch
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished))
        assert finished.status == "completed"
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    finally:
        await sup.shutdown(graceful=False)


async def test_pause_checkpoint_now_and_stop_reach_a_ray_worker(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a", "params": {"delay": 0.002}}], cluster.address,
                        defaults={"max_epochs": 50}, validation={"mode": "inline"})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        sup.pause("a")
        sup.checkpoint("a")
        first = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        sup.checkpoint("a")
        second = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "request")
        assert second.step == first.step  # paused: no optimizer step between the two
        sup.unpause("a")
        await wait_for(stream, lambda e: isinstance(e, StepMetrics) and e.step > second.step)
        sup.stop("a")
        saved = await wait_for(stream, lambda e: isinstance(e, CheckpointSaved) and e.reason == "stop")
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
        assert exited.exit_code == 10 and exited.reason == "stopped"
        assert saved.step > second.step
        assert (await asyncio.wait_for(sup.wait(), 30)) == {"a": "stopped"}
    finally:
        await sup.shutdown(graceful=False)


async def test_a_hung_ray_worker_is_caught_with_a_stack_dump(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "stuck", "task": f"{TASKS / 'faulty.py'}:build",
                                    "params": {"samples": 256, "delay": 0.002, "fault": "hang",
                                               "fault_at_call": 12}}],
                        cluster.address, defaults={"max_epochs": 3}, validation={"mode": "off"},
                        restart={"hang_timeout": 4.0, "max_restarts": 0, "kill_grace": 2.0})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        await wait_for(stream, lambda e: isinstance(e, WorkerStateChanged) and e.state == "hung")
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited))
        assert exited.reason == "hung"
        await asyncio.wait_for(sup.wait(), 30)
    finally:
        await sup.shutdown(graceful=False)
    log = (sup.run_dir / "stuck" / "log.txt").read_text()
    assert re.search(r"most recent call first\):(.|\n)*?faulty\.py\", line \d+ in forward", log), log[-2000:]


async def test_removing_a_node_moves_its_pipeline_to_another(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a", "params": {"delay": 0.004}}, {"name": "b", "params": {"delay": 0.004}}],
                        cluster.address, defaults={"max_epochs": 4}, validation={"mode": "inline"},
                        restart={"min_uptime": 0.0, "max_restarts": 0})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    extra = None
    try:
        for _ in range(2):
            await wait_for(stream, lambda e: isinstance(e, TrainingStarted))
        head = cluster.head_node
        gone = next(n for n in cluster.list_all_nodes() if n is not head)
        victim = next(name for name in ("a", "b") if node_of(sup, name).endswith(gone.node_id[:6]))
        cluster.remove_node(gone)
        extra = cluster.add_node(num_cpus=2, num_gpus=1)  # the module's later tests want two nodes again
        # Ray's health checks find the node gone; on a machine whose cores are busy that can take minutes.
        notice = await wait_for(stream, lambda e: isinstance(e, Notice) and e.pipeline == victim
                                and "left the cluster" in e.text, timeout=240)
        assert notice.level == "error"
        exited = await wait_for(stream, lambda e: isinstance(e, WorkerExited) and e.pipeline == victim, timeout=120)
        assert exited.reason == "restarted"  # moved, not crashed: no restart spent
        statuses = await asyncio.wait_for(sup.wait(), 120)
        assert statuses == {"a": "completed", "b": "completed"}
        assert node_of(sup, victim, 2) != node_of(sup, victim, 1)
        assert sup.view(victim).restarts == 0
    finally:
        await sup.shutdown(graceful=False)
    assert extra is not None



async def test_telemetry_shows_the_worker_on_the_other_node(tmp_path, cluster):
    config = ray_config(tmp_path, [{"name": "a"}, {"name": "b"}], cluster.address,
                        defaults={"max_epochs": 200}, validation={"mode": "inline"},
                        telemetry={"enabled": True, "interval": 0.2})
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        # One pipeline per node: the non-driver node's worker comes from that node's sampler actor.
        snap = await wait_for(stream, lambda e: isinstance(e, TelemetrySnapshot)
                              and any(p.node for p in e.processes), timeout=90)
        remote = [p for p in snap.processes if p.node]
        assert len(remote) == 1 and remote[0].pid > 0 and remote[0].rss
        assert remote[0].node == node_of(sup, remote[0].pipeline)
        started = {e.pipeline: e for e in read_events(sup.run_dir) if isinstance(e, WorkerStarted)}
        assert remote[0].pid == started[remote[0].pipeline].pid
    finally:
        await sup.shutdown(graceful=False)
