"""A worker's silence is judged on all it sent and on the time the supervisor was running: the watched clock, the
read before a hang or stall is judged, and the validator-behind rule's scores read before the hand-offs they
overtook. The real run, a service stopped with SIGSTOP, is tests/faults/test_supervisor_paused.py."""
from __future__ import annotations

import signal

import pytest

from tests.scripted import FakeHandle, ScriptedLauncher, until
from tests.test_supervisor_logic import make
from torchherd.engine.config.alerts import AlertsConfig
from torchherd.engine.protocol.messages import SnapshotTaken, StepMetrics, ValResult
from torchherd.engine.protocol.states import WorkerState
from torchherd.engine.supervise.health.alert_rules import AlertRules
from torchherd.engine.supervise.watched import PAUSED_AFTER, WatchedClock


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_watched_clock_leaves_out_a_pause_and_nothing_else():
    real = Clock()
    watched = WatchedClock(0.1, real)
    start = watched()
    for _ in range(10):  # ticks on time, and late by less than a pause on a loaded machine
        real.now += 0.1 + PAUSED_AFTER / 2
        watched()
    assert watched() - start == pytest.approx(real.now - 100.0) and watched.missed == 0.0
    before = watched()
    real.now += 30.0  # stopped: the next look comes 30 s on
    assert watched() - before == pytest.approx(0.1) and watched.missed == pytest.approx(30.0 - 0.1)
    real.now += 0.1
    assert watched() - before == pytest.approx(0.2)  # and counts on from there


class Unread(FakeHandle):
    """A worker whose reports wait in its channel until the supervisor reads it itself: as after a pause of the
    supervisor, when its tick comes before its channel's reader on waking."""

    def __init__(self, pid: int):
        super().__init__(pid)
        self.waiting: list = []

    def read_waiting(self):
        waiting, self.waiting = self.waiting, []
        if waiting:
            self.on_events(waiting)


# Regression: the supervisor judged a worker hung on waking from a pause, before reading the step reports
# waiting in its channel, and killed it.
async def test_a_worker_is_judged_on_the_reports_waiting_in_its_channel(tmp_path):
    launcher = ScriptedLauncher()
    launcher.make = Unread
    sup = make(tmp_path, [{"name": "a"}], launcher,
               restart={"hang_timeout": 0.05, "start_timeout": 5.0, "max_restarts": 0})
    await sup.start()
    await until(lambda: launcher.handles)
    worker = launcher.handles[0]
    worker.started("a")
    for n in range(1, 40):  # many hang_timeouts of reports, each read only when the supervisor reads it
        worker.waiting.append(StepMetrics(pipeline="a", epoch=0, step=n, loss=1.0))
        await until(lambda: not worker.waiting or sup.view("a").state != WorkerState.RUNNING)
        assert sup.view("a").state == WorkerState.RUNNING and signal.SIGUSR1 not in worker.signals, n
    # Silent for real: still caught.
    await until(lambda: sup.view("a").state != WorkerState.RUNNING)
    assert signal.SIGUSR1 in worker.signals
    await sup.shutdown(graceful=False)


def taken(seq: int) -> SnapshotTaken:
    return SnapshotTaken(pipeline="a", seq=seq, epoch=seq, step=10 * seq, slot=0, stall_ms=1.0, nbytes=1,
                         time=float(seq))


def scored(seq: int) -> ValResult:
    return ValResult(pipeline="a", epoch=seq, step=10 * seq, metrics={}, mode="background", seq=seq)


def test_hand_offs_read_after_the_score_that_overtook_them_are_no_lag():
    rules = AlertRules(AlertsConfig(validator_behind=3))
    assert rules.take(scored(1)) == []
    # After a pause of the supervisor: the validator scored 2..6 meanwhile, read before the worker's hand-offs.
    assert [a for seq in range(2, 7) for a in rules.take(scored(seq))] == []
    assert [a for seq in range(1, 7) for a in rules.take(taken(seq))] == []
    # Newer ones than its last score still count.
    assert rules.take(taken(7)) == [] and rules.take(taken(8)) == []
    [alert] = rules.take(taken(9))
    assert alert.rule == "validator" and "3 snapshots handed off" in alert.message
    assert rules.take(scored(8)) == [] and rules.take(taken(10)) == []  # 9 and 10 wait: 2
