"""What a script's crash report says: the exception its traceback ends in, and the part of its output shown.

The output's tail (runner.py keeps its last lines) holds the script's own step lines before the
traceback; a report shows the traceback and a few lines before it, not all of them again.
"""
from __future__ import annotations

import re

TRACEBACK = "Traceback (most recent call last)"
CONTEXT = 3  # lines of output before a crash's traceback that its report shows
NO_TRACEBACK = 10  # lines a crash report shows of output without a traceback
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure)\b")
RANK_PREFIX = re.compile(r"^\[(rank|default)\d+\]:\s?")  # what torch.distributed puts before a rank's lines


def crash_excerpt(lines: list[str]) -> str:
    """What a crash report shows of the script's output: its last traceback and the CONTEXT lines before it
    (else the last NO_TRACEBACK lines); the log holds the rest."""
    starts = [i for i, line in enumerate(lines) if TRACEBACK in line]
    first = max(starts[-1] - CONTEXT, 0) if starts else max(len(lines) - NO_TRACEBACK, 0)
    return "\n".join(lines[first:])


def error_line(lines: list[str]) -> str:
    """The exception a traceback ends in ('ValueError: bad shape'), rank prefixes stripped; "" if none."""
    for line in reversed(lines):
        line = RANK_PREFIX.sub("", line.strip())
        if ERROR_LINE.match(line):
            return line
    return ""
