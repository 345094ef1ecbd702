"""Which rank of a gang is behind: each rank's own pace (`RankPace`), judged against the median of its peers.

A rank whose time per batch is at least `ratio` times the median of the others', by at
least `FLOOR` seconds, for `RUNS` reports running is a straggler (`Straggler`); it keeps
pace again after as many reports under the ratio. A rank slowed while the host's cores are all busy (`crowded`)
is not blamed: a neighbour's load, not the rank, made it slow. Pure logic, fed by the health watch.
"""
from __future__ import annotations

import statistics

from ...protocol.health import RankPace, Straggler
from ...protocol.telemetry import TelemetrySnapshot

RUNS = 3  # reports running that make (or unmake) a straggler: one slow window is noise
FLOOR = 0.002  # seconds per batch a straggler must lag by, besides the ratio: a 1 ms step is all noise
CROWDED_PERCENT = 90.0  # host CPU percent (of all cores) from which its cores count as all busy


class GangPace:
    """The newest pace of each rank of one pipeline's gang, and which rank is flagged as a straggler."""

    def __init__(self, world: int, ratio: float):
        self.world, self.ratio = world, ratio
        self.times: dict[int, float] = {}  # rank -> seconds per batch, its newest report
        self.slow_runs: dict[int, int] = {}  # rank -> reports running at or over the ratio
        self.fast_runs = 0  # reports running of the flagged rank under the ratio
        self.flagged: int | None = None

    def take(self, pace: RankPace, crowded: bool = False) -> Straggler | None:
        """Note one rank's report; the Straggler event when that flags a rank, or clears the flagged one.
        `crowded`: the host's cores were all busy at the newest telemetry, so a slow report counts for nothing."""
        self.times[pace.rank] = pace.step_time
        if len(self.times) < self.world or self.world < 2:
            return None
        others = [t for r, t in self.times.items() if r != pace.rank]
        median = statistics.median(others)
        mine = pace.step_time
        slow = mine >= self.ratio * median and mine - median >= FLOOR and not crowded
        ratio = mine / median if median > 0 else float("inf")
        if self.flagged == pace.rank:
            self.fast_runs = 0 if slow else self.fast_runs + 1
            if self.fast_runs >= RUNS:
                self.flagged, self.slow_runs[pace.rank] = None, 0
                return Straggler(pipeline=pace.pipeline, rank=pace.rank, ratio=0.0, median=median, slowest=mine)
            return None
        self.slow_runs[pace.rank] = self.slow_runs.get(pace.rank, 0) + 1 if slow else 0
        if self.flagged is None and self.slow_runs[pace.rank] >= RUNS:
            self.flagged, self.fast_runs = pace.rank, 0
            return Straggler(pipeline=pace.pipeline, rank=pace.rank, ratio=ratio, median=median, slowest=mine)
        return None


def crowded(snapshot: TelemetrySnapshot, cores: int) -> bool:
    """Whether every core of the host was busy at `snapshot`: a CPU gang's rank slowed then shares its core."""
    if snapshot.host_cpu_percent is not None and snapshot.host_cpu_percent >= CROWDED_PERCENT:
        return True
    return snapshot.load1 is not None and snapshot.load1 >= cores


class StragglerWatch:
    """Every gang's pace in a session, by pipeline; a new attempt of a pipeline starts its pace afresh."""

    def __init__(self, ratio: float):
        self.ratio = ratio
        self.gangs: dict[str, tuple[int, GangPace]] = {}  # pipeline -> (attempt, its pace)

    def take(self, pace: RankPace, attempt: int, world: int, crowded: bool = False) -> Straggler | None:
        held = self.gangs.get(pace.pipeline)
        if held is None or held[0] != attempt:
            held = self.gangs[pace.pipeline] = (attempt, GangPace(world, self.ratio))
        return held[1].take(pace, crowded)
