"""How a trial's value reads in its name and in the sweep's tables: a number in three significant digits, and
a swept list (an `args` list) by the flag-value pairs that differ from the other trials' ('lr0.05').

Standard library only: the app's sweep view reads a run's trials without loading the config schema.
"""
from __future__ import annotations

import re
from typing import Any


def short(value: Any) -> str:
    """`value` as a part of a name: floats in three significant digits, only letters, digits, '_' and '.'."""
    if isinstance(value, float):
        value = f"{value:.3g}"
    return re.sub(r"[^A-Za-z0-9_.]", "", str(value).replace("-", "_")) or "x"


def list_parts(value: list[Any], others: list[Any]) -> list[str]:
    """The flag-value pairs of `value` that not every other trial's list has ('--lr', '0.05' and '--lr=0.05'
    are both 'lr0.05')."""
    def pairs(items: Any) -> list[tuple[str, str]]:
        out, items = [], [str(i) for i in items] if isinstance(items, list) else []
        for i, item in enumerate(items):
            if item.startswith("-") and "=" in item:
                out.append(tuple(item.lstrip("-").split("=", 1)))
            elif item.startswith("-"):
                nxt = items[i + 1] if i + 1 < len(items) else ""
                out.append((item.lstrip("-"), "" if nxt.startswith("-") else nxt))
            elif not (i and items[i - 1].startswith("-") and "=" not in items[i - 1]):
                out.append(("", item))
        return out

    theirs = [pairs(o) for o in others]
    return [f"{short(flag) if flag else ''}{short(v) if v else ''}" for flag, v in pairs(value)
            if not all((flag, v) in t for t in theirs)] or ["args"]


def labelled(trials: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each trial's values with a list (a swept `args`) replaced by the pairs that set it apart: 'lr0.05'."""
    out = {}
    for name, values in trials.items():
        out[name] = {k: "-".join(list_parts(v, [o.get(k) for n, o in trials.items() if n != name]))
                     if isinstance(v, list) else v for k, v in values.items()}
    return out
