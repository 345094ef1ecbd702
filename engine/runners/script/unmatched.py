"""Saying once that a script's `metrics` pattern matches nothing it prints.

A pattern that never matches is otherwise silent: the chart waits for data and the pipeline
completes with no steps. `UnmatchedWatch` counts the lines no pattern matched since the attempt
began and, before any line matched, says so once after `LINES` of them or `SECONDS` after the first,
or when the attempt ends (a short script prints fewer).
"""
from __future__ import annotations

import time
from collections.abc import Callable

LINES = 50  # unmatched lines before the notice
SECONDS = 60.0  # or seconds since the first unmatched line, whichever comes first
SHOWN = 120  # characters of the unmatched line quoted in the notice


class UnmatchedWatch:
    """Counts lines the `metrics` patterns did not match until one does; `line` returns the notice once it is
    due, `ended` when the attempt ends before it was."""

    def __init__(self, patterns: list[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.patterns = patterns
        self.clock = clock
        self.unmatched = 0
        self.first: float | None = None  # when the first unmatched line came (clock seconds)
        self.missed = ""  # the newest line no pattern matched
        self.done = not patterns  # a match was seen, or the notice went out: nothing more to say

    def line(self, text: str, matched: bool) -> str | None:
        """Note one line of output and whether a pattern matched it; the notice when it is due, else None."""
        if self.done:
            return None
        if matched:
            self.done = True
            return None
        self.unmatched += 1
        self.missed = text
        now = self.clock()
        self.first = now if self.first is None else self.first
        if self.unmatched < LINES and now - self.first < SECONDS:
            return None
        return self._notice("so far, so no step or epoch is reported")

    def ended(self) -> str | None:
        """The attempt has ended: the notice if lines were printed, none matched and nothing was said yet."""
        if self.done or not self.unmatched:
            return None
        return self._notice("before it ended, so it reported no step or epoch")

    def _notice(self, outcome: str) -> str:
        self.done = True
        which = " or ".join(repr(p) for p in self.patterns)
        shown = self.missed if len(self.missed) <= SHOWN else self.missed[:SHOWN] + "…"
        lines = f"{self.unmatched} line{'s' if self.unmatched != 1 else ''}"
        return (f"`metrics` {which} matched none of the {lines} the script printed {outcome}; one it did not "
                f"match: {shown!r}. Fix the pattern (named groups step, epoch, loss) or report through "
                "torchherd.client")
