"""The regular expressions a script pipeline's `metrics` and `val_metrics` give: as a list, and checked."""
from __future__ import annotations

import re


def patterns(value: str | list[str] | None) -> list[str]:
    """A `metrics` or `val_metrics` value as a list of patterns."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def check_metrics_regex(pattern: str) -> str:
    """`pattern` if it compiles and names what it captures; else ValueError saying what is wrong."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    if not compiled.groupindex:
        raise ValueError("has no named group: name what a group captures, e.g. (?P<loss>[-+.\\deE]+) "
                         "or (?P<epoch>\\d+)")
    return pattern
