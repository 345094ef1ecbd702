"""The decisions of a sweep's schedulers, apart from any process: ASHA (asynchronous successive halving, stopping
or promoting) and the median stopping rule, each fed a trial's validation results as (progress, value) and
answering with a `Verdict` (go on, prune or pause, and why) when the result is one the rule judges.

Pure and standard library only: `supervise/sweeping.py` feeds them `val_result` events and acts on them.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

EPS = 1e-9  # progress is a float (steps / steps per epoch); a rung at 2 is reached at 1.9999999999


@dataclass(frozen=True)
class Verdict:
    """What a scheduler says of one result: prune it or let it go on, and why (for events.jsonl)."""

    prune: bool
    rung: float  # the milestone judged, in the sweep's unit
    value: float
    cutoff: float | None  # the value it had to match; None when there was nothing to compare with
    reason: str
    pause: bool = False  # promoting ASHA: it waits at the rung (checkpointed, its slot freed) to be promoted
    at: float | None = None  # how far the weights scored had trained (the rung unit); None: at the rung


def worse(value: float, than: float, mode: str) -> bool:
    """`value` is strictly worse than `than` under `mode` ("min": lower is better); NaN is worse than any."""
    if not math.isfinite(value):
        return True
    return value > than if mode == "min" else value < than


def percentile(values: Iterable[float], q: float) -> float:
    """The `q` percentile (0-100) by linear interpolation, as numpy's default (Ray Tune's ASHA cut)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _at(metric: str, value: float, unit: str, t: float) -> str:
    """'val_loss 0.31 at epoch 4'; where the weights scored were handed off mid-epoch, 'after 2.25 epochs'."""
    if unit == "epoch" and t != int(t):
        return f"{metric} {value:.4g} after {t:.3g} epochs"
    return f"{metric} {value:.4g} at {unit} {t:g}"


class Asha:
    """Asynchronous successive halving (Li et al. 2018, as Ray Tune's ASHAScheduler): the first time a trial
    reaches a rung, it goes on only if its value is within the best 1/reduction_factor of the values that
    trials recorded at that rung before it; it never waits for the rung to fill."""

    def __init__(self, rungs: list[int], reduction_factor: int, metric: str, mode: str, unit: str = "epoch"):
        self.rungs = sorted(rungs)
        self.reduction_factor = reduction_factor
        self.metric, self.mode, self.unit = metric, mode, unit
        self.recorded: dict[int, dict[str, float]] = {r: {} for r in self.rungs}
        # how far each recorded result had trained, so every later word on it names the same epoch (or step)
        self.at: dict[int, dict[str, float]] = {r: {} for r in self.rungs}

    def said(self, rung: int, trial: str) -> str:
        """'val_loss 0.31 at epoch 2': `trial`'s result recorded at `rung`, as its first verdict there said it."""
        return _at(self.metric, self.recorded[rung][trial], self.unit, self.at[rung].get(trial, rung))

    def cutoff(self, rung: int) -> float | None:
        """The value a trial must match at `rung` now: the edge of the best 1/reduction_factor so far."""
        values = [v for v in self.recorded[rung].values() if math.isfinite(v)]
        if not values:
            return None
        share = 100.0 / self.reduction_factor
        return percentile(values, share if self.mode == "min" else 100.0 - share)

    def result(self, trial: str, t: float, value: float) -> Verdict | None:
        """A validation result of `trial` after `t` epochs (or steps): judged at the highest rung it has
        reached and not been judged at yet; None when it reached no new rung."""
        for rung in reversed(self.rungs):
            if t + EPS < rung or trial in self.recorded[rung]:
                continue
            cut = self.cutoff(rung)
            prune = (cut is not None and worse(value, cut, self.mode)) or not math.isfinite(value)
            self.recorded[rung][trial], self.at[rung][trial] = value, t
            said = self.said(rung, trial)
            if cut is None:
                reason = f"{said}, first at rung {rung}"
            else:
                reason = f"{said}, rung cut {cut:.4g}" + ("" if prune else f" (kept: best 1/{self.reduction_factor})")
            return Verdict(prune, rung, value, cut, reason, at=t)
        return None


class MedianRule:
    """The median stopping rule (Golovin et al. 2017, Vizier): after `grace_period`, a trial whose best value
    so far is worse than the median of the other trials' bests at the same point is pruned, once
    `min_trials` others have got that far."""

    def __init__(self, grace_period: int, min_trials: int, metric: str, mode: str, unit: str = "epoch"):
        self.grace_period, self.min_trials = grace_period, min_trials
        self.metric, self.mode, self.unit = metric, mode, unit
        self.history: dict[str, list[tuple[float, float]]] = {}

    def _best(self, results: list[tuple[float, float]], t: float) -> float | None:
        values = [v for at, v in results if at <= t + EPS and math.isfinite(v)]
        if not values:
            return None
        return min(values) if self.mode == "min" else max(values)

    def result(self, trial: str, t: float, value: float) -> Verdict | None:
        """Judge `trial`'s result after `t` epochs (or steps); None before the grace period or while
        too few others have got that far."""
        own = self.history.setdefault(trial, [])
        own.append((t, value))
        if t + EPS < self.grace_period:
            return None
        bests = [self._best(r, t) for name, r in self.history.items()
                 if name != trial and r and max(at for at, _ in r) + EPS >= t]
        others = [b for b in bests if b is not None]
        if len(others) < self.min_trials:
            return None
        median = statistics.median(others)
        best = self._best(own, t)
        prune = best is None or worse(best, median, self.mode)
        said = _at(self.metric, best if best is not None else value, self.unit, t)
        return Verdict(prune, t, best if best is not None else value, median,
                       f"{said}, median of {len(others)} others {median:.4g}")


class PromotingAsha(Asha):
    """ASHA as its paper gives it (Li et al. 2018, arXiv 1810.05934): a trial reaching a rung goes on only
    while it is among the best floor(n / reduction_factor) of the n trials recorded there; otherwise it waits
    there (paused) and is promoted when the rung has filled enough for it to qualify. Nothing is cut for good
    until the sweep can make no more progress (`unpromoted`)."""

    def __init__(self, rungs: list[int], reduction_factor: int, metric: str, mode: str, unit: str = "epoch"):
        super().__init__(rungs, reduction_factor, metric, mode, unit)
        self.promoted: dict[int, set[str]] = {r: set() for r in self.rungs}  # went on from each rung
        self.paused: dict[str, int] = {}  # trial -> the rung it waits at

    def top(self, rung: int) -> list[str]:
        """The trials a rung lets go on now: its best floor(n / reduction_factor), best first."""
        sign = 1.0 if self.mode == "min" else -1.0
        ranked = sorted((sign * v, name) for name, v in self.recorded[rung].items() if math.isfinite(v))
        return [name for _, name in ranked[:len(self.recorded[rung]) // self.reduction_factor]]

    def _edge(self, rung: int) -> float | None:
        """The value of the last trial the rung lets go on; None while it lets none."""
        top = self.top(rung)
        return self.recorded[rung][top[-1]] if top else None

    def result(self, trial: str, t: float, value: float) -> Verdict | None:
        """Judge `trial` at the highest rung it reached and was not judged at: it goes on when among the best
        1/reduction_factor of the rung so far, else it pauses there; None when it reached no new rung, or it
        is paused (a result of the steps it trained while its pause took effect: judged once it is promoted)."""
        if trial in self.paused:
            return None
        for rung in reversed(self.rungs):
            if t + EPS < rung or trial in self.recorded[rung]:
                continue
            self.recorded[rung][trial], self.at[rung][trial] = value, t
            n, said = len(self.recorded[rung]), self.said(rung, trial)
            best = n // self.reduction_factor
            if trial in self.top(rung):
                self.promoted[rung].add(trial)
                return Verdict(False, rung, value, self._edge(rung), f"{said}, among the best {best} of {n}", at=t)
            self.paused[trial] = rung
            where = (f"waits for more trials at rung {rung:g} (the best 1 of every {self.reduction_factor:g} "
                     f"go on; {n} so far)" if best == 0 else f"not among the best {best} of {n} at rung {rung:g}")
            return Verdict(False, rung, value, self._edge(rung), f"{said}, {where}", pause=True, at=t)
        return None

    def promotions(self) -> list[tuple[str, Verdict]]:
        """The paused trials that qualify now (highest rung first), each taken off `paused` as promoted."""
        out = []
        for rung in reversed(self.rungs):
            top = self.top(rung)
            for name in top:
                if self.paused.get(name) == rung:
                    del self.paused[name]
                    self.promoted[rung].add(name)
                    value, n = self.recorded[rung][name], len(self.recorded[rung])
                    out.append((name, Verdict(False, rung, value, self._edge(rung),
                                              f"{self.said(rung, name)}, now among the best {len(top)} of {n}: "
                                              "promoted", at=self.at[rung].get(name))))
        return out

    def last_promotion(self) -> list[tuple[str, Verdict]]:
        """Nothing else can run: the highest rung that let no trial go on (it holds fewer than
        reduction_factor) promotes its best paused trial, so the sweep trains one trial to its end."""
        for rung in reversed(self.rungs):
            waiting = [n for n, r in self.paused.items() if r == rung and math.isfinite(self.recorded[rung][n])]
            if waiting and not self.promoted[rung]:
                sign = 1.0 if self.mode == "min" else -1.0
                name = min(waiting, key=lambda n: (sign * self.recorded[rung][n], n))
                del self.paused[name]
                self.promoted[rung].add(name)
                value, n = self.recorded[rung][name], len(self.recorded[rung])
                said = f"{self.said(rung, name)}, the best of the {n} that reached the rung, and no other can"
                return [(name, Verdict(False, rung, value, value, f"{said}: promoted", at=self.at[rung].get(name)))]
        return []

    def forget(self, trial: str) -> None:
        """`trial` waits no more: it ended otherwise, or a person promoted it."""
        rung = self.paused.pop(trial, None)
        if rung is not None:
            self.promoted[rung].add(trial)

    def unpromoted(self) -> list[tuple[str, Verdict]]:
        """The sweep can make no more progress: every trial still paused is cut, each with why."""
        out = []
        for name, rung in sorted(self.paused.items()):
            n, value = len(self.recorded[rung]), self.recorded[rung][name]
            best = n // self.reduction_factor
            out.append((name, Verdict(True, rung, value, self._edge(rung),
                                      f"{self.said(rung, name)}, never among the best {best} of the {n} trials "
                                      f"that reached rung {rung}", at=self.at[rung].get(name))))
        self.paused.clear()
        return out
