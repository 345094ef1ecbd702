"""Loss histories kept as min/max bins over x, updated per point in O(1), so a chart draws in time
independent of how many points it has seen.

`LossSeries` holds one pipeline's raw history (for re-binning when the x axis or smoothing is
toggled) and the `BinnedSeries` the chart reads; `reduce_columns` maps bins onto screen columns.
"""
from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

BINS = 512  # bins per series: at least twice the widest chart, in braille dots
EMA_ALPHA = 0.1  # weight of the newest point in the smoothed curve


class BinnedSeries:
    """min, max and last y per equal-width x bin; bins double in width when x outgrows them."""

    __slots__ = ("capacity", "hi", "last", "lo", "used", "width", "x0", "x_max")

    def __init__(self, capacity: int = BINS):
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self.x0: float | None = None
        self.width = 0.0  # x units per bin; 0 until a second distinct x arrives
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.last: list[float] = []
        self.used = 0  # bins in use (index of the highest filled bin + 1)
        self.x_max = -math.inf

    def add(self, x: float, y: float) -> None:
        if not math.isfinite(y) or not math.isfinite(x):
            return
        if self.x0 is None:
            self.x0 = x
        if x > self.x_max:
            self.x_max = x
        if self.width == 0.0:
            if x > self.x0:
                self.width = x - self.x0  # the first spacing sets the scale; doubling does the rest
            else:
                self._put(0, y)
                return
        i = max(0, int((x - self.x0) / self.width))
        while i >= self.capacity:
            self._halve()
            i = max(0, int((x - self.x0) / self.width))
        self._put(i, y)

    def _put(self, i: int, y: float) -> None:
        while len(self.lo) <= i:
            self.lo.append(math.nan)
            self.hi.append(math.nan)
            self.last.append(math.nan)
        lo = self.lo[i]
        if lo != lo:  # empty bin (NaN)
            self.lo[i] = self.hi[i] = y
        else:
            if y < lo:
                self.lo[i] = y
            if y > self.hi[i]:
                self.hi[i] = y
        self.last[i] = y
        if i + 1 > self.used:
            self.used = i + 1

    def _halve(self) -> None:
        """Merge bins pairwise and double their width."""
        lo, hi, last = [], [], []
        for j in range(0, len(self.lo), 2):
            pair = slice(j, j + 2)
            los = [v for v in self.lo[pair] if v == v]
            his = [v for v in self.hi[pair] if v == v]
            lasts = [v for v in self.last[pair] if v == v]
            lo.append(min(los) if los else math.nan)
            hi.append(max(his) if his else math.nan)
            last.append(lasts[-1] if lasts else math.nan)
        self.lo, self.hi, self.last = lo, hi, last
        self.used = (self.used + 1) // 2
        self.width *= 2

    def bins(self) -> Iterator[tuple[float, float, float, float]]:
        """(x centre, lo, hi, last) of each filled bin, in x order."""
        if self.x0 is None:
            return
        half = self.width / 2
        for i in range(self.used):
            lo = self.lo[i]
            if lo == lo:
                yield self.x0 + i * self.width + half, lo, self.hi[i], self.last[i]


@dataclass(frozen=True, slots=True)
class Column:
    """One screen column of a reduced series."""

    index: int
    lo: float
    hi: float
    last: float


def reduce_columns(series: BinnedSeries, x_min: float, x_max: float, columns: int) -> list[Column]:
    """Fold bins into `columns` columns spanning [x_min, x_max]: O(bins), never O(points)."""
    out: list[Column] = []
    span = (x_max - x_min) or 1.0
    scale = (columns - 1) / span
    for xc, lo, hi, last in series.bins():
        c = min(columns - 1, max(0, int((xc - x_min) * scale + 0.5)))
        if out and out[-1].index == c:
            prev = out[-1]
            out[-1] = Column(c, min(prev.lo, lo), max(prev.hi, hi), last)
        else:
            out.append(Column(c, lo, hi, last))
    return out


class LossSeries:
    """One pipeline's train-loss history (raw and smoothed), its validation points, and its bins."""

    def __init__(self) -> None:
        self.steps = array("d")
        self.times = array("d")  # seconds since the epoch
        self.loss = array("d")
        self.smooth = array("d")
        self.val: list[tuple[float, float, float]] = []  # (step, time, value)
        self.restarts: list[tuple[float, float]] = []  # (step, time) where the steps went back
        self.bins = BinnedSeries()
        self.x_mode = "step"  # or "time"
        self.smoothed = False
        self.version = 0  # bumped on every change, so a chart can skip an unchanged series
        self._ema = math.nan

    def append(self, step: float, t: float, loss: float) -> None:
        if len(self.steps) and step < self.steps[-1]:
            self.restarts.append((step, t))  # a restart went back to an earlier checkpoint (or to the start)
        if math.isfinite(loss):
            self._ema = loss if self._ema != self._ema else EMA_ALPHA * loss + (1 - EMA_ALPHA) * self._ema
        self.steps.append(step)
        self.times.append(t)
        self.loss.append(loss)
        self.smooth.append(self._ema)
        self.bins.add(t if self.x_mode == "time" else step, self._ema if self.smoothed else loss)
        self.version += 1

    def add_val(self, step: float, t: float, value: float) -> None:
        self.val.append((step, t, value))
        self.version += 1

    def configure(self, x_mode: str, smoothed: bool) -> None:
        """Switch the x axis or smoothing; re-bins from the raw history once (O(points), per keypress)."""
        if (x_mode, smoothed) == (self.x_mode, self.smoothed):
            return
        self.x_mode, self.smoothed = x_mode, smoothed
        self.bins.clear()
        xs = self.times if x_mode == "time" else self.steps
        ys = self.smooth if smoothed else self.loss
        add = self.bins.add
        for x, y in zip(xs, ys):
            add(x, y)
        self.version += 1

    def val_points(self) -> list[tuple[float, float]]:
        """(x, value) of the validation results on the current x axis."""
        k = 1 if self.x_mode == "time" else 0
        return [(p[k], p[2]) for p in self.val]

    def restart_points(self) -> list[float]:
        """x of each point where a restart went back to an earlier step, on the current x axis."""
        k = 1 if self.x_mode == "time" else 0
        return [p[k] for p in self.restarts]

    def __len__(self) -> int:
        return len(self.loss)
