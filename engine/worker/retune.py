"""A learning rate retuned over a restored optimizer: a PBT trial that took over another trial's checkpoint trains
on at its own `params.lr`, its optimizers' and schedulers' state otherwise as saved. The Task trainer and the
Lightning runner both rescale through `scale_lrs`; torch is not imported here."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GROUP_RATES = ("lr", "initial_lr", "max_lr", "min_lr")  # a param group's rates (OneCycleLR keeps max_lr, min_lr)
SCHEDULER_RATES = ("base_lrs", "max_lrs")  # a scheduler's own (CyclicLR keeps max_lrs)


def number(value: object) -> float | None:
    """A config value as a float, or None when it is no number (a bool is none)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def lr_scale(saved: object, new: object) -> float | None:
    """new / saved when both are numbers that differ (saved not 0): the factor a checkpoint's rates are scaled
    by; None when there is nothing to scale."""
    old, now = number(saved), number(new)
    if old is None or now is None or old == now or old == 0:
        return None
    return now / old


def scale_lrs(optimizers: Iterable[Any], schedulers: Iterable[Any], scale: float) -> None:
    """Every rate of every param group of `optimizers`, and the base (and peak) rates of `schedulers`, times
    `scale`: a schedule goes on where it was, at the new rate."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for key in GROUP_RATES:
                value = group.get(key)
                if number(value) is not None:
                    group[key] = value * scale
                elif hasattr(value, "mul_"):  # a tensor rate (capturable optimizers): kept the same tensor
                    value.mul_(scale)
    for scheduler in schedulers:
        for attr in SCHEDULER_RATES:
            rates = getattr(scheduler, attr, None)
            if isinstance(rates, list) and rates:
                setattr(scheduler, attr, [r * scale for r in rates])
