"""App-level Textual messages: what screens ask of the app, and the bridge's change signal.

`RunChanged` supersedes itself (`can_replace`), so a flood of engine events queues one repaint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from .commands import PipelineCommand


@dataclass
class RunChanged(Message):
    """The run state moved on; the dashboard should redraw when its rate limit allows."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunChanged)


@dataclass
class CommandRequested(Message):
    """A person asked for `command` (a `Kill`, `Restart`, `Pause`, ... of tui.commands) on a pipeline."""

    command: PipelineCommand
