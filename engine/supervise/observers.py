"""The session's observers beside the run directory, each tapped on its events when it starts: a sweep's pruner
(`sweeping.py`) or PBT (`exploiting.py`), the TensorBoard event files (`rundir/tensorboard.py`, unless
`tensorboard = false`), the warning about a validation metric never reported (`metric_watch.py`), and the watch
on stragglers, stalls and alerts (`health.py`). The policies among them read a `SessionView` and send decisions to
an `Outbox`."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.messages import StepMetrics
from ..rundir.tensorboard import FOLDER, TensorBoardTap
from .bus import StepsTap, Tap
from .decisions import Outbox, SessionView
from .health.metric_watch import MetricWatch
from .health.watch import HealthWatch
from .sweep.exploiting import PbtController
from .sweep.sweeping import SweepPruner

__all__ = ["HealthWatch", "Observers", "PbtController", "SweepPruner", "observers_of"]

@dataclass
class Observers:
    """What watches a session: its taps (each with the step-run form it takes, if any) and its sweep, if any."""

    taps: list[tuple[Tap, StepsTap | None]] = field(default_factory=list)
    sweep: SweepPruner | PbtController | None = None
    health: HealthWatch | None = None  # its summary goes out just before run_finished (`[alerts] on_finish`)


def observers_of(session: SessionView, out: Outbox) -> Observers:
    """The observers of `session`'s config: TensorBoard files, the metric watch, the health watch, and the sweep's
    pruner (or PBT's controller), its state rebuilt from the run folder."""
    found = Observers()
    if session.config.tensorboard:
        tensorboard = TensorBoardTap(session.run_dir / FOLDER, session.config, session.code)
        found.taps.append((tensorboard.on_event, tensorboard.on_steps))
    watch = MetricWatch(session, out)
    found.taps.append((watch.on_event, watch.on_steps))
    health = HealthWatch(session, out)  # stragglers, the triage of a stall, alerts
    found.taps.append((health.on_event, health.on_steps))
    found.health = health
    found.sweep = PbtController.attach(session, out, session.run_dir) or SweepPruner.attach(session, out,
                                                                                            session.run_dir)
    if found.sweep is not None:  # it judges results and ends, never a step report
        found.taps.append((found.sweep.on_event, _no_steps))
    return found


def _no_steps(steps: list[StepMetrics], lines: list[bytes]) -> None:
    """The step-run form of a tap that has nothing to do with step reports."""
