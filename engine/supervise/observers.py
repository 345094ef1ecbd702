"""The session's observers beside the run directory, attached as bus taps when it starts: a sweep's pruner
(`sweeping.py`) or PBT (`exploiting.py`), the TensorBoard event files (`rundir/tensorboard.py`, unless
`tensorboard = false`) and the warning about a validation metric never reported (`metric_watch.py`), and the
watch on stragglers, stalls and alerts (`health.py`)."""
from __future__ import annotations

from ..rundir.tensorboard import FOLDER, TensorBoardTap
from .exploiting import PbtController
from .health import HealthWatch
from .metric_watch import MetricWatch
from .observed import ObservedSession
from .sweeping import SweepPruner

__all__ = ["PbtController", "SweepPruner", "attach_observers"]


def attach_observers(supervisor: ObservedSession) -> SweepPruner | PbtController | None:
    """Tap `supervisor`'s bus for its TensorBoard files and its sweep; returns the sweep's pruner (or PBT's
    controller), if any."""
    if supervisor.config.tensorboard:
        supervisor.tap(TensorBoardTap(supervisor.run_dir / FOLDER, supervisor.config).on_event)
    watch = MetricWatch(supervisor)
    supervisor.tap(watch.on_event, watch.on_steps)
    health = HealthWatch(supervisor)  # stragglers, the triage of a stall, alerts
    supervisor.tap(health.on_event, health.on_steps)
    return PbtController.attach(supervisor, supervisor.run_dir) or SweepPruner.attach(supervisor, supervisor.run_dir)
