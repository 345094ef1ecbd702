"""What an observer of a session (a sweep's pruner, the health watch, the metric watch) may use of its
supervisor: one `Protocol`, so each is built with the session it needs and no more."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from ..config.schema import RunConfig
    from ..protocol.messages import Event
    from ..protocol.states import WorkerState
    from .pipeline import PipelineView


class ObservedSession(Protocol):
    """The supervisor as its observers see it: its config and folder, its events, and the commands they give."""

    config: RunConfig
    run_dir: Path

    def tap(self, fn: Callable[..., Any], steps: Callable[..., Any] | None = None) -> None:
        """Call `fn(event, line, kept)` on every event as published (`steps(reports, lines)` on runs of steps)."""
        ...

    def record(self, event: Event) -> None:
        """Publish an event of the observer's own (an alert, a trial decision)."""
        ...

    def view(self, name: str) -> PipelineView: ...

    def views(self) -> list[PipelineView]: ...

    def stop(self, name: str | None = None, reason: str = "requested", ending: WorkerState = ...) -> None: ...

    def restart(self, name: str) -> None: ...

    def requeue(self, name: str) -> None:
        """An ended pipeline queues again behind every pipeline waiting now."""
        ...

    def retune(self, name: str, values: dict) -> None: ...

    def stacks(self, name: str) -> None: ...
