"""What a policy (a sweep's scheduler, PBT, the health rules) may ask of its session, as values: it reads the
session through a `SessionView` and sends decisions to an `Outbox`, and the supervisor carries them out, in order,
never from inside the publishing of an event. No policy holds the supervisor.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..protocol.states import WorkerState

if TYPE_CHECKING:
    from ..config.schema import RunConfig
    from ..protocol.messages import Event, SourceCommit
    from .pipeline import PipelineView


@dataclass(frozen=True)
class Stop:
    """End the pipeline's attempt gracefully (checkpoint first) into `ending`: pruned, early-stopped, or a resting
    state (waiting at `rung`, exploiting, yielding). A resting trial moves only into pruned."""

    name: str
    reason: str
    ending: WorkerState
    rung: float | None = None


@dataclass(frozen=True)
class StopRun:
    """Stop every pipeline gracefully (a full disk: each keeps its last checkpoint); resting trials rest on."""

    reason: str


@dataclass(frozen=True)
class Requeue:
    """Queue an ended or resting pipeline again (it trains on from its checkpoint); `behind`: behind every pipeline
    waiting now, else in its old place. A pipeline that has not ended stays as it is."""

    name: str
    behind: bool = False


@dataclass(frozen=True)
class Retune:
    """Its next attempts train with these values for its swept keys (PBT's explored values)."""

    name: str
    values: dict[str, Any]


@dataclass(frozen=True)
class Record:
    """Publish an event of the policy's own (a trial decision, an alert, a warning)."""

    event: Event


@dataclass(frozen=True)
class DumpStacks:
    """Every process of the pipeline's attempt writes its Python stacks to its log (the triage of a stall); nothing
    happens to one with no process."""

    name: str


@dataclass(frozen=True)
class Resize:
    """Stop an elastic gang at its next checkpoint and start it again from there at the size it is granted then
    (`ranks`, what was free when this was sent), spending no restart; `why` is its gang_resized event's."""

    name: str
    ranks: int
    why: str


Decision = Stop | StopRun | Requeue | Retune | Record | DumpStacks | Resize


@dataclass(frozen=True)
class SessionView:
    """The session as its policies read it: its config, its folder and its pipelines, none of its commands."""

    config: RunConfig
    run_dir: Path
    view: Callable[[str], PipelineView]  # raises KeyError for a name the session does not have
    views: Callable[[], list[PipelineView]]
    code: tuple[SourceCommit, ...] = ()  # the commits of its code when it began (rundir/provenance.py)


class Outbox:
    """Where a policy sends its decisions. Sent while an event is being published, they are carried out as soon as
    the publishing is done; sent otherwise, at once (a later read of the session sees them done)."""

    def __init__(self, carry_out: Callable[[Decision], None], publishing: Callable[[], bool],
                 loop: asyncio.AbstractEventLoop):
        self._carry_out, self._publishing, self._loop = carry_out, publishing, loop

    def send(self, *decisions: Decision) -> None:
        if self._publishing():
            self._loop.call_soon(self._all, decisions)
        else:
            self._all(decisions)

    def send_threadsafe(self, *decisions: Decision) -> None:
        """`send` from a thread of the policy's own (an alert's command, a webhook)."""
        self._loop.call_soon_threadsafe(self._all, decisions)

    def later(self, fn: Callable[[], object]) -> None:
        """Run `fn` (which may send) once the event being published has reached everyone."""
        self._loop.call_soon(fn)

    def _all(self, decisions: tuple[Decision, ...]) -> None:
        for decision in decisions:
            self._carry_out(decision)
