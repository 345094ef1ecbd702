"""The types of what a TOML file holds once decoded: `TomlValue` (any value tomllib gives) and `Table`.

A sweep's values and a trial's are TOML values too (a list of them is a swept `args`). Standard library only:
labels.py and the app read trials without the schema.
"""
from __future__ import annotations

from datetime import date, datetime, time
from typing import TypeAlias

# tomllib's values: TOML's strings, integers, floats, booleans, dates and times, arrays and tables (no null).
TomlValue: TypeAlias = "str | int | float | bool | datetime | date | time | list[TomlValue] | dict[str, TomlValue]"
Table: TypeAlias = "dict[str, TomlValue]"
