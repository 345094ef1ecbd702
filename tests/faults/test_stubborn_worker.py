"""Fault: a worker (and its DataLoader worker) ignores SIGTERM.

`kill` escalates to SIGKILL after `kill_grace` and the whole process group goes.
"""
from __future__ import annotations

import os

import pytest

from torchherd.engine.protocol.messages import PipelineFinished, StepMetrics, WorkerExited, WorkerStarted, WorkerStateChanged
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import wait_for
from tests.faults.support import faulty_config, is_alive, of, run_events, supervised, tree, wait_gone

pytestmark = pytest.mark.slow

KILL_GRACE = 1.5  # seconds


def ignores_sigterm(pid: int) -> bool:
    """SIGTERM is in the process's ignored-signals mask (/proc/PID/status SigIgn)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (15 - 1)))
    return False


async def test_kill_escalates_to_sigkill_and_takes_the_group(tmp_path):
    config = faulty_config(tmp_path, [{"name": "mule", "num_workers": 1,
                                       "params": {"samples": 256, "delay": 0.01, "ignore_sigterm": True}}],
                           defaults={"max_epochs": 100}, restart={"kill_grace": KILL_GRACE})
    sup = Supervisor(config)
    async with supervised(sup) as stream:
        started = await wait_for(stream, lambda e: isinstance(e, WorkerStarted))
        await wait_for(stream, lambda e: isinstance(e, StepMetrics))
        group = tree(started.pid)
        assert len(group) >= 2, "no DataLoader worker"
        assert all(ignores_sigterm(p.pid) for p in group), "the knob did not make every process stubborn"
        assert {os.getpgid(p.pid) for p in group} == {started.pid}  # one process group, led by the worker
        sup.kill("mule")
        finished = await wait_for(stream, lambda e: isinstance(e, PipelineFinished), timeout=KILL_GRACE + 30)
        assert finished.status == "killed"
        # Reaped at once after the SIGKILL: nothing of the group may linger.
        assert not wait_gone(group, timeout=2.0)
    events = run_events(sup)
    exited = of(events, WorkerExited, "mule")[0]
    assert exited.signal == "SIGKILL" and exited.reason == "killed"  # SIGTERM alone did not end it
    assert exited.uptime > 0
    states = [e.state for e in of(events, WorkerStateChanged, "mule")]
    assert states[-2:] == ["killing", "killed"]
    assert not [p for p in group if is_alive(p)]
