"""The type of what `json.loads` gives: `JsonValue`, and `JsonObject` for a record or file that is an object.

Standard library only, as the whole protocol package is.
"""
from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
JsonObject: TypeAlias = "dict[str, JsonValue]"
