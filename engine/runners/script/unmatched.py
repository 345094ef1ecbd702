"""Saying once that a script's `metrics` pattern matches nothing it prints.

A pattern that never matches is otherwise silent: the chart waits for data and the pipeline
completes with no steps. `UnmatchedWatch` counts the lines no pattern matched since the attempt
began and, before any line matched, says so once after `LINES` of them or `SECONDS` after the first.
"""
from __future__ import annotations

import time
from collections.abc import Callable

LINES = 50  # unmatched lines before the notice
SECONDS = 60.0  # or seconds since the first unmatched line, whichever comes first
SHOWN = 120  # characters of the unmatched line quoted in the notice


class UnmatchedWatch:
    """Counts lines the `metrics` patterns did not match until one does; `line` returns the notice, once."""

    def __init__(self, patterns: list[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.patterns = patterns
        self.clock = clock
        self.unmatched = 0
        self.first: float | None = None  # when the first unmatched line came (clock seconds)
        self.done = not patterns  # a match was seen, or the notice went out: nothing more to say

    def line(self, text: str, matched: bool) -> str | None:
        """Note one line of output and whether a pattern matched it; the notice when it is due, else None."""
        if self.done:
            return None
        if matched:
            self.done = True
            return None
        self.unmatched += 1
        now = self.clock()
        self.first = now if self.first is None else self.first
        if self.unmatched < LINES and now - self.first < SECONDS:
            return None
        self.done = True
        which = " or ".join(repr(p) for p in self.patterns)
        shown = text if len(text) <= SHOWN else text[:SHOWN] + "…"
        return (f"`metrics` {which} matched none of the {self.unmatched} lines the script printed so far, so no "
                f"step or epoch is reported; one it did not match: {shown!r}. Fix the pattern (named groups "
                "step, epoch, loss) or report through torchherd.client")
