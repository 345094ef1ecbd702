"""Elastic gangs grow back while they train: `GrowWatch`, a policy that sends a `Resize` for a running gang below
MAX once slots no queued pipeline waits for have given it room for more ranks for its `grow_after` seconds. It reads
the gangs through a callable (`Gang`: the ranks each runs at and could be granted now) and decides nothing else."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .decisions import Outbox, Resize

LOOK_EVERY = 1.0  # seconds between looks at what is free (each reads the ledger)


@dataclass(frozen=True)
class Gang:
    """A running elastic gang below its MAX, as the policy weighs it."""

    name: str
    ranks: int  # it trains at now
    room: int  # ranks it would be granted now, its own slots counted free; 0 while a queued pipeline waits
    grow_after: float  # seconds the room must last


@dataclass
class _Seen:
    since: float  # when room for more ranks was first seen, of this unbroken stretch
    room: int  # the fewest ranks there was room for in it


class GrowWatch:
    """Asks a gang to grow once room for more ranks has lasted its `grow_after` (see the module)."""

    def __init__(self, out: Outbox, gangs: Callable[[], list[Gang]]):
        self._out, self._gangs = out, gangs
        self._seen: dict[str, _Seen] = {}
        self._looked: float | None = None

    def tick(self, now: float) -> None:
        """A look at the gangs (at most every LOOK_EVERY seconds): a Resize for each whose room has lasted."""
        if self._looked is not None and now - self._looked < LOOK_EVERY:
            return
        self._looked = now
        seen, grow = {}, []
        for gang in self._gangs():
            if gang.room <= gang.ranks:
                continue  # no room for more: the stretch, if any, is broken
            was = self._seen.get(gang.name)
            seen[gang.name] = was = _Seen(now, gang.room) if was is None else _Seen(was.since, min(was.room, gang.room))
            if now - was.since >= gang.grow_after:
                more = was.room - gang.ranks
                why = f"{more} more slot{'s' if more != 1 else ''} free for {now - was.since:.0f}s"
                grow.append(Resize(gang.name, was.room, why))
                del seen[gang.name]  # asked: it is no longer a running gang below MAX until it starts again
        self._seen = seen
        if grow:
            self._out.send(*grow)
