"""The restart policy: after an unexpected exit, whether to start a pipeline again and after how long.

Every crash spends one restart from `max_restarts`. A worker that dies before its
first optimizer step, or sooner than `min_uptime`, is a failed start: the delay
doubles with each one in a row, and `max_failed_starts` in a row end the pipeline
even with budget left.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.schema import RestartConfig


@dataclass(frozen=True)
class RestartDecision:
    """What to do after a crash."""

    restart: bool
    delay: float  # seconds
    failed_starts: int  # consecutive failed starts, this one included
    reason: str


class RestartPolicy:
    """Decides restarts from the config's `[restart]` table."""

    def __init__(self, config: RestartConfig):
        self.config = config

    def decide(self, restarts_used: int, failed_starts: int, uptime: float, stepped: bool = True) -> RestartDecision:
        """After a crash `uptime` seconds into an attempt that did (or did not) complete an optimizer step."""
        c = self.config
        failed_start = not stepped or uptime < c.min_uptime
        streak = failed_starts + 1 if failed_start else 0
        if failed_start and streak >= c.max_failed_starts:
            return RestartDecision(False, 0.0, streak,
                                   f"{streak} failed starts in a row (each died before its first step or within "
                                   f"{c.min_uptime:g}s)")
        if restarts_used >= c.max_restarts:
            return RestartDecision(False, 0.0, streak, f"restart budget of {c.max_restarts} used up")
        delay = min(c.backoff * (2 ** max(streak - 1, 0)), c.backoff_max)
        return RestartDecision(True, delay, streak, "failed start" if failed_start else "crashed")
