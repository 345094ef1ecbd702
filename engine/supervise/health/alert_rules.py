"""The alert rules: what in the events a session emits is worth interrupting a person for, and how often.

`AlertRules.take(event)` returns the alerts an event raises: a NaN or infinite loss, a
loss spike (a robust z-score over the recent step reports), a stall, a straggler, an
out-of-memory crash; `idle(snapshot)` a running pipeline's GPU idle for minutes (NVML's
utilisation in telemetry); the validator falling behind; `disk(free, total)` the runs folder's disk
almost full. One alert per rule and pipeline per `interval`; the next one counts those held back. Pure logic.
"""
from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right, insort
from collections import deque
from dataclasses import dataclass
from math import isfinite

from ...config.alerts import AlertsConfig
from ...protocol.health import Alert, Straggler
from ...protocol.messages import (
    Event,
    Notice,
    SnapshotTaken,
    Stalled,
    StepMetrics,
    ValResult,
    WorkerError,
    WorkerExited,
    pipeline_of,
)
from ...protocol.names import ValidationMode
from ...protocol.telemetry import OWNER_OTHER, OWNER_UNKNOWN, TelemetrySnapshot

MAD_SCALE = 1.4826  # the MAD of normal data times this is its standard deviation
MIN_SPREAD = 1e-6  # a window of identical losses: a spike must still exceed them by this much (relative)
STARTUP_GRACE = 60.0  # seconds: snapshots before the validator's first score of a pipeline count only after this


def spread(window: list[float]) -> tuple[float, float]:
    """The window's median and its robust standard deviation (the MAD scaled, floored)."""
    median = statistics.median(window)
    mad = statistics.median(abs(x - median) for x in window) * MAD_SCALE
    return median, max(mad, abs(median) * MIN_SPREAD, 1e-12)


def robust_z(value: float, window: list[float]) -> float:
    """How many robust standard deviations `value` lies above the window's median (MAD, floored)."""
    median, scale = spread(window)
    return (value - median) / scale


@dataclass(slots=True)
class Rise:
    """A pipeline's loss that lay `spike` robust z-scores above its window: it is a spike once it stays there."""

    level: float  # the window's median plus `spike` robust standard deviations, when it was judged
    reports: int  # reports in a row at or above the level, the first included
    first: str  # what the first one was: its loss and step, how far above which median


def may_spike(value: float, ordered: list[float], spike: float) -> bool:
    """False when robust_z(value, window) >= spike cannot hold, `ordered` being the window sorted; True when it may.

    From the sorted window in O(log n): the median directly, then whether more than half the losses lie so close
    to it that the MAD is below what a z of `spike` needs (two bisects, margins for rounding). A step report at or
    under the median, and any but a real outlier, is judged here without robust_z's two sorts."""
    n = len(ordered)
    half = n // 2
    median = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2  # as statistics.median
    if not value > median:
        return False  # z <= 0 < spike
    reach = (value - median) / (spike * MAD_SCALE) * (1 + 4e-9) + 1e-300  # a MAD above this: z < spike
    near = bisect_right(ordered, median + reach) - bisect_left(ordered, median - reach)
    return near > (n - 1) // 2  # at most that many deviations within reach: the MAD (their median) exceeds it


def is_nan_text(text: str) -> bool:
    return "training loss is nan" in text or "training loss is inf" in text or "training loss is -inf" in text


def is_oom(text: str) -> bool:
    return "out of memory" in text.lower() or "OutOfMemoryError" in text


class AlertRules:
    """Every alert rule of one session, with its rate limit."""

    def __init__(self, config: AlertsConfig):
        self.config = config
        self.losses: dict[str, deque[float]] = {}  # pipeline -> its recent step losses
        self.ordered: dict[str, list[float]] = {}  # pipeline -> the same losses, sorted
        self.rises: dict[str, Rise] = {}  # pipeline -> its loss's rise above its window, while it lasts
        self.last: dict[tuple[str, str], float] = {}  # (rule, pipeline) -> when its last alert went out
        self.held: dict[tuple[str, str], int] = {}  # (rule, pipeline) -> alerts held back since then
        self.idle_since: dict[str, float] = {}  # pipeline -> when its GPUs last went idle
        # pipeline -> seq -> when it was handed off, of the snapshots newer than the newest the validator scored
        self.unscored: dict[str, dict[int, float]] = {}
        self.scored_seq: dict[str, int] = {}  # pipeline -> the newest snapshot the validator scored
        self.scored: set[str] = set()  # pipelines the validator has scored: it is up and reading theirs

    def take(self, event: Event) -> list[Alert]:
        """The alerts `event` raises (after the rate limit: [] when one went out for its rule lately)."""
        found = self._judge(event)
        return [a for a in (self._limit(alert, event.time) for alert in found) if a is not None]

    def take_steps(self, events: list[StepMetrics]) -> list[Alert]:
        """`take` of each of a run of step reports, in order: the bulk of a worker's batch, in one call."""
        return [a for a in (self._limit(alert, at) for alert, at in self._spikes(events)) if a is not None]

    def _judge(self, event: Event) -> list[Alert]:
        name = pipeline_of(event)
        if isinstance(event, StepMetrics):
            return self._step(event)
        if isinstance(event, (SnapshotTaken, ValResult)):
            return self._behind(event)
        if isinstance(event, Notice) and is_nan_text(event.text):
            return [self._alert("nan", name, f"{name}: loss is not finite", event.text)]
        if isinstance(event, WorkerError) and "NonFiniteLoss" in event.error:
            return [self._alert("nan", name, f"{name}: loss is not finite", event.error)]
        if isinstance(event, (WorkerError, WorkerExited)) and is_oom(event.error):
            return [self._alert("oom", name, f"{name}: out of memory", event.error)]
        if isinstance(event, Stalled) and event.quiet > 0:
            return [self._alert("stall", name, f"{name} stalled",
                                f"no training step for {int(event.quiet)} s (nothing is killed)")]
        if isinstance(event, Straggler) and event.ratio > 0:
            return [self._alert("straggler", name, f"{name}: straggler rank {event.rank}",
                                f"{event.ratio:.1f}x its peers' time per batch "
                                f"({event.slowest * 1e3:.0f} ms vs {event.median * 1e3:.0f} ms)")]
        return []

    def _step(self, event: StepMetrics) -> list[Alert]:
        return [alert for alert, _ in self._spikes([event])]

    def _spikes(self, events: list[StepMetrics]) -> list[tuple[Alert, float]]:
        """The loss spike rule over a run of step reports (the time of each alert's report beside it): each judged
        against the window before it, then added to it. A report `spike` robust z-scores above its window starts
        a rise; the rise alerts once `spike_persist` reports in a row (that one first) stayed at or above the
        level it crossed, and ends at the first report under it: one outlier batch, however far out, is no spike,
        and a loss that jumped and stays up is one alert. The window is kept sorted as well, so that may_spike
        rules out all but a near-outlier in O(log n) before the median and MAD's two sorts; a flood of reports
        costs little each."""
        found = []
        spike, size, persist, name = self.config.spike, self.config.spike_window, self.config.spike_persist, None
        least = min(10, size)  # reports in the window before the rule judges
        rises = self.rises
        for event in events:
            if event.pipeline != name:
                name = event.pipeline
                if name not in self.losses:
                    self.losses[name], self.ordered[name] = deque(maxlen=size), []
                window, ordered = self.losses[name], self.ordered[name]
            loss = event.loss
            if not isfinite(loss):
                continue  # the NaN policy's notice or error says it
            rise = rises.get(name) if rises else None  # rarely any: no lookup per report
            if rise is not None and not loss >= rise.level:
                del rises[name]  # back under: that rise is over (an outlier, if it alerted not)
                rise = None
            if rise is not None:
                rise.reports += 1
            elif ((n := len(ordered)) >= least and loss > ordered[(n - 1) >> 1]  # over the median
                  and may_spike(loss, ordered, spike)):
                median, scale = spread(list(window))
                if (z := (loss - median) / scale) >= spike:
                    rises[name] = rise = Rise(median + spike * scale, 1, (
                        f"loss {loss:.4g} at step {event.step} is {z:.0f} robust z-scores above the last "
                        f"{n} reports' median {median:.4g}"))
            if rise is not None and rise.reports == persist:
                stayed = "" if persist == 1 else (
                    f", and stayed above {rise.level:.4g} for {persist} reports, to step {event.step}")
                found.append((self._alert("spike", name, f"{name}: loss spike", rise.first + stayed), event.time))
            if len(ordered) == size:  # the deque's maxlen
                del ordered[bisect_left(ordered, window[0])]  # the one the append drops
            window.append(loss)
            insort(ordered, loss)
        return found

    def _behind(self, event: SnapshotTaken | ValResult) -> list[Alert]:
        """The validator-behind alert once `validator_behind` snapshots wait since the pipeline's last score.

        Before its first score of a pipeline the validator is starting (torch, CUDA, the model): short epochs
        hand off several snapshots meanwhile, which is no lag, so they count only after STARTUP_GRACE seconds.

        A score settles its snapshot and every older one, whichever report is read first: after a pause of the
        supervisor both wait in their channels, and a hand-off read after the score that overtook it is no lag."""
        name = event.pipeline
        unscored = self.unscored.setdefault(name, {})
        if isinstance(event, ValResult):
            if event.mode == ValidationMode.BACKGROUND:
                self.scored.add(name)
                if event.seq:
                    self.scored_seq[name] = last = max(self.scored_seq.get(name, 0), event.seq)
                    self.unscored[name] = {seq: at for seq, at in unscored.items() if seq > last}
                else:  # which snapshot it scored is not said: every one waiting is settled
                    unscored.clear()
            return []
        if event.seq <= self.scored_seq.get(name, 0):
            return []  # a newer one (or this one) was scored already
        unscored[event.seq] = event.time
        waiting = len(unscored)
        starting = name not in self.scored and event.time - next(iter(unscored.values())) < STARTUP_GRACE
        if not self.config.validator_behind or waiting < self.config.validator_behind or starting:
            return []
        return [self._alert("validator", name, f"{name}: validator behind", (
            f"{waiting} snapshots handed off since the validator last scored {name}'s weights (at step "
            f"{event.step} now): its results lag training"))]

    def idle(self, snapshot: TelemetrySnapshot, paused: frozenset[str] = frozenset()) -> list[Alert]:
        """The idle-GPU alert for each pipeline (but the `paused` ones) whose GPUs, those NVML lists its processes
        on, all ran kernels less than `idle_gpu` percent of the time for `idle_minutes`."""
        if not self.config.idle_gpu:
            return []
        busiest: dict[str, int] = {}  # pipeline -> the highest utilisation among its GPUs
        for gpu in snapshot.gpus:
            if gpu.util_gpu is None:
                continue
            for proc in gpu.processes or ():
                if proc.owner not in (OWNER_OTHER, OWNER_UNKNOWN, *paused):
                    busiest[proc.owner] = max(busiest.get(proc.owner, 0), gpu.util_gpu)
        now, found = snapshot.time, []
        for name in [n for n in self.idle_since if busiest.get(n, 100) >= self.config.idle_gpu]:
            del self.idle_since[name]  # busy again, or no longer on a GPU
        for name, used in busiest.items():
            if used >= self.config.idle_gpu:
                continue
            quiet = now - self.idle_since.setdefault(name, now)
            if quiet >= self.config.idle_minutes * 60:
                alert = self._limit(self._alert("idle", name, f"{name}: GPU idle", (
                    f"its GPU ran kernels {used}% of the time for {quiet / 60:.1f} min while it runs "
                    "(stuck on data, or waiting on something?)")), now)
                found += [alert] if alert is not None else []
        return found

    def disk(self, free: int, total: int, path: str, now: float) -> list[Alert]:
        """The disk alert when the runs folder's disk has less than `disk_free` of `total` bytes free."""
        share = self.config.disk_free
        if not share or not total or free >= share * total:
            return []
        alert = self._alert("disk", "", "torchherd: disk almost full", (
            f"{free / (1 << 30):.1f} GiB free of {total / (1 << 30):.0f} GiB ({free / total:.0%}) where the "
            f"runs are written ({path}); a checkpoint that cannot be written stops the run"))
        return [a for a in [self._limit(alert, now)] if a is not None]

    def _alert(self, rule: str, pipeline: str, title: str, message: str) -> Alert:
        return Alert(pipeline=pipeline, rule=rule, title=title, message=message, bell=self.config.bell)

    def _limit(self, alert: Alert, now: float) -> Alert | None:
        """`alert` if none of its rule and pipeline went out within `interval`, counting the held ones."""
        key = (alert.rule, alert.pipeline)
        last = self.last.get(key)
        if last is not None and now - last < self.config.interval:
            self.held[key] = self.held.get(key, 0) + 1
            return None
        self.last[key] = now
        count = 1 + self.held.pop(key, 0)
        if count == 1:
            return alert
        return Alert(pipeline=alert.pipeline, rule=alert.rule, title=alert.title, count=count, bell=alert.bell,
                     message=f"{alert.message} ({count} times since the last alert)")
