"""Population-based training's decisions, apart from any process (Jaderberg et al. 2017, as Ray Tune's
PopulationBasedTraining): each time a trial's validation result reaches its next perturbation point, a trial in
the bottom quantile of the population's latest results takes over a top-quantile trial's checkpoint (exploit)
with that trial's values explored (perturbed by 0.8 or 1.2, or resampled).

Pure and standard library only: `supervise/exploiting.py` feeds it `val_result` events and acts on its `Exploit`s;
`schedules` folds the values each trial trained with, epoch by epoch, from the decisions it left.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ...config.trials import draw, numeric
from .pruning import EPS, _at, worse

FACTORS = (0.8, 1.2)  # a perturbed number is the donor's times one of these (Ray Tune's)


@dataclass(frozen=True)
class Exploit:
    """A trial in the bottom quantile takes over `donor`'s checkpoint and trains on with `values`."""

    trial: str
    donor: str
    progress: float  # how far the trial had got, in the sweep's unit
    value: float  # its metric there
    cutoff: float  # the worst metric of the top quantile
    values: dict[str, Any]  # its new values: the donor's, explored
    reason: str


def explore(values: dict[str, Any], space: dict[str, Any], how: dict[str, str], rng: random.Random) -> dict[str, Any]:
    """`values` explored key by key: 'perturb' multiplies a number by 0.8 or 1.2 (a whole number stays whole, a
    float keeps 6 significant digits: 0.08, not 0.08000000000000002),
    'resample' draws from the key's list or range, 'keep' keeps it; keys not in `how`: perturbed when numbers, else
    resampled."""
    out = dict(values)
    for key, value in values.items():
        mode = how.get(key, "perturb" if numeric(value) else "resample")
        if mode == "keep":
            continue
        if mode == "perturb" and numeric(value):
            factor = rng.choice(FACTORS)
            out[key] = max(1, round(value * factor)) if isinstance(value, int) else float(f"{value * factor:.6g}")
        elif key in space:
            out[key] = draw(rng, space[key])
    return out


def quantiles(latest: dict[str, float], fraction: float, mode: str) -> tuple[list[str], list[str]]:
    """(bottom, top) of the trials by their latest value, each ceil(n * fraction) (at most half) of them, worst
    first and best first; both empty while fewer than two trials have a result (Ray Tune's rule)."""
    finite = {n: v for n, v in latest.items() if math.isfinite(v)}
    if len(latest) < 2:
        return [], []
    sign = 1.0 if mode == "min" else -1.0
    ranked = sorted(finite, key=lambda n: (sign * finite[n], n))  # best first; NaN trials are worst of all
    ranked += sorted(set(latest) - set(finite))
    count = math.ceil(len(ranked) * fraction)
    count = min(count, len(ranked) // 2)
    return ranked[::-1][:count], ranked[:count]


class Pbt:
    """The population's latest results and each trial's last perturbation point; `result` answers with an
    `Exploit` when a trial at its perturbation point is in the bottom quantile and a top one can donate."""

    def __init__(self, space: dict[str, Any], interval: int, fraction: float, how: dict[str, str], metric: str,
                 mode: str, unit: str = "epoch", seed: int = 0):
        self.space, self.interval, self.fraction, self.how = space, interval, fraction, how
        self.metric, self.mode, self.unit = metric, mode, unit
        self.rng = random.Random(seed)
        self.latest: dict[str, float] = {}  # trial -> its newest metric
        self.last: dict[str, float] = {}  # trial -> the progress of its last perturbation point
        self.open: dict[str, float] = {}  # trial -> a point where it is due an exploit but no donor had a checkpoint
        self.values: dict[str, dict[str, Any]] = {}  # trial -> the values it trains with now

    def result(self, trial: str, t: float, value: float, can_donate: Callable[[str], bool]) -> Exploit | None:
        """A validation result of `trial` after `t` epochs (or steps); an Exploit when it is at a perturbation
        point, in the bottom quantile, and a top-quantile trial `can_donate` (has a checkpoint to copy)."""
        self.latest[trial] = value
        if t + EPS < self.last.get(trial, 0.0) + self.interval:
            return None
        bottom, top = quantiles(self.latest, self.fraction, self.mode)
        # a donor no better than the trial has nothing to give it (trials that all score alike stay as they are)
        better = [n for n in top if n != trial and worse(value, self.latest[n], self.mode)]
        donors = [n for n in better if can_donate(n)]
        if trial in bottom and better and not donors:
            # A better trial's result came before its checkpoint: the point stays open, judged again (`open`)
            # once one has a checkpoint to give, rather than passed with no exploit.
            self.open[trial] = t
            return None
        self.last[trial] = t
        self.open.pop(trial, None)
        if trial not in bottom or not donors:
            return None
        donor = self.rng.choice(donors)
        values = explore(self.values.get(donor, {}), self.space, self.how, self.rng)
        cutoff = self.latest[top[-1]]
        share = f"{self.fraction:.0%}"
        return Exploit(trial, donor, t, value, cutoff, values,
                       f"{_at(self.metric, value, self.unit, t)}, in the bottom {share} (the top {share} reach "
                       f"{cutoff:.4g}): takes over {donor}'s checkpoint with " + said(values))

    def exploited(self, trial: str, values: dict[str, Any], progress: float) -> None:
        """`trial` trains on from a donor's checkpoint with `values`: its old results rank it no more."""
        self.values[trial] = dict(values)
        self.last[trial] = progress
        self.latest.pop(trial, None)
        self.open.pop(trial, None)


def said(values: dict[str, Any]) -> str:
    """'lr 0.036, batch_size 32'."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]} {v}"
                     for k, v in values.items())


def schedules(initial: dict[str, dict[str, Any]], decisions: Iterable[Any], epochs: int) -> dict[str, list[dict]]:
    """The values each trial trained with, epoch by epoch (epoch 1 first): its own values from its start, and
    after each exploit its donor's schedule up to the checkpoint taken, then the new values. `initial`: each
    trial's values as configured; `decisions`: trial_decision events in the order they were made."""
    segments = {name: [(0, dict(values))] for name, values in initial.items()}  # (first epoch, values)
    for d in decisions:
        donor, epoch = d.exploit.get("donor"), d.exploit.get("epoch", 0)
        if d.action != "exploit" or d.pipeline not in segments or donor not in segments:
            continue
        taken = [(start, v) for start, v in segments[donor] if start < epoch] or segments[donor][:1]
        segments[d.pipeline] = [*taken, (max(epoch, 0), dict(d.exploit.get("values", {})))]
    out = {}
    for name, segs in segments.items():
        out[name] = [{"epoch": e + 1, **next(v for start, v in reversed(segs) if start <= e)} for e in range(epochs)]
    return out

