"""How a trial's value reads in its name and in the sweep's tables: a number in three significant digits, and
a swept list (an `args` list) by the flag-value pairs that differ from the other trials' ('lr0.05').

Standard library only: the app's sweep view reads a run's trials without loading the config schema.
"""
from __future__ import annotations

import re

from .values import Table, TomlValue


def short(value: TomlValue) -> str:
    """`value` as a part of a name: floats in three significant digits, only letters, digits, '_' and '.'."""
    if isinstance(value, float):
        value = f"{value:.3g}"
    return re.sub(r"[^A-Za-z0-9_.]", "", str(value).replace("-", "_")) or "x"


def list_parts(value: list[TomlValue], others: list[TomlValue | None]) -> list[str]:
    """The flag-value pairs of `value` that not every other trial's list has ('--lr', '0.05' and '--lr=0.05'
    are both 'lr0.05')."""
    def pairs(items: TomlValue | None) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        texts = [str(i) for i in items] if isinstance(items, list) else []
        for i, item in enumerate(texts):
            if item.startswith("-") and "=" in item:
                name, setting = item.lstrip("-").split("=", 1)
                out.append((name, setting))
            elif item.startswith("-"):
                nxt = texts[i + 1] if i + 1 < len(texts) else ""
                out.append((item.lstrip("-"), "" if nxt.startswith("-") else nxt))
            elif not (i and texts[i - 1].startswith("-") and "=" not in texts[i - 1]):
                out.append(("", item))
        return out

    theirs = [pairs(o) for o in others]
    return [f"{short(flag) if flag else ''}{short(v) if v else ''}" for flag, v in pairs(value)
            if not all((flag, v) in t for t in theirs)] or ["args"]


def labelled(trials: dict[str, Table]) -> dict[str, Table]:
    """Each trial's values with a list (a swept `args`) replaced by the pairs that set it apart: 'lr0.05'."""
    out: dict[str, Table] = {}
    for name, values in trials.items():
        out[name] = {k: "-".join(list_parts(v, [o.get(k) for n, o in trials.items() if n != name]))
                     if isinstance(v, list) else v for k, v in values.items()}
    return out
