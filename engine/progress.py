"""Progress of a pipeline as people read it, and the one rule for whether a validation result is better."""
from __future__ import annotations


def better(value: float, best: float | None, mode: str) -> bool:
    """Whether `value` improves on `best` for a metric whose `mode` is "min" or "max"."""
    if best is None:
        return True
    return value > best if mode == "max" else value < best
