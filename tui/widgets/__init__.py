"""Reusable widgets of the torchherd app; each carries its DEFAULT_CSS."""
from __future__ import annotations

from typing import TypedDict


class WidgetOptions(TypedDict, total=False):
    """The keywords every Textual widget takes (`Widget.__init__`), which a widget's own `__init__` passes on."""

    name: str | None
    id: str | None
    classes: str | None
    disabled: bool
