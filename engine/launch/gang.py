"""A gang: the N rank processes of one DDP pipeline, supervised as one `Handle`.

`GangHandle` wraps one handle per rank: the first rank to fail brings the others
down at once (none is left blocked in a collective) and its exit is the gang's, and
rank 0 speaks for the pipeline (other ranks' errors and notices pass, tagged with
their rank). `rank_env` (engine/launch/environment.py) gives each rank torchrun's
environment, on a port of its own (the backend's `rendezvous`: on a cluster, the address
and a free port of rank 0's node; a gang may span nodes when no one node has room for it).
"""
from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from ..protocol.channel import WorkerExit
from ..protocol.health import RankPace
from ..protocol.messages import Command, Event, Notice, WorkerError
from ..protocol.names import Intent
from .backend import Backend, Handle, LaunchSpec
from .environment import rank_env
from .ports import hold_port, release_port, take_port

# rank_env and the ports are re-exported: a gang's torchrun variables and port, as one place to look
__all__ = ["GangHandle", "hold_port", "launch_gang", "rank_env", "release_port", "take_port"]

# A rank that ends so has not failed: its peers may still be finishing.
CLEAN = (WorkerExit.COMPLETED, WorkerExit.STOPPED)


class GangHandle(Handle):
    """Every rank of one attempt of a gang, as one handle."""

    def __init__(self, ranks: list[Handle], linger: float, grace: float, on_close: Callable[[], None] = lambda: None):
        self.ranks = ranks
        self.node = ranks[0].node  # rank 0's (a gang spans nodes only when no one node has room for it)
        self.failed_rank: int | None = None  # the first rank seen to fail: the root cause
        self.errors: dict[int, WorkerError] = {}  # the last error each rank reported
        self._error_order: list[int] = []  # ranks in the order their first error arrived
        self._rank0_said: set[str] = set()  # rank 0's notice and error texts: the same from a peer is an echo
        self._held: list[WorkerError] = []  # errors kept until the gang's exit says which rank was the cause
        self._codes: dict[int, int] = {}  # rank -> exit status
        self._linger, self._grace = linger, grace  # seconds
        self._terminate_at: float | None = None  # monotonic: bring the survivors down then
        self._kill_at: float | None = None
        self._on_close = on_close

    @property
    def pid(self) -> int:  # type: ignore[override]  # a gang's pid is rank 0's: read, never set
        """Rank 0's (read late: a cluster's launcher learns it after the launch)."""
        return self.ranks[0].pid

    @property
    def node_id(self) -> str:
        """Rank 0's node id (a cluster's: telemetry asks that node's sampler for the ranks)."""
        return self.ranks[0].node_id

    @property
    def cause(self) -> Intent | None:  # type: ignore[override]  # the ranks' causes decide it: read, never set
        """What the failing rank's backend knows of why it ended, if anything; a node that left under any
        rank is the whole gang's cause (its peers' collectives may have failed first), so no restart is spent."""
        if any(h.cause == Intent.NODE_LEFT for h in self.ranks):
            return Intent.NODE_LEFT
        return self.ranks[self.exit_rank].cause

    @property
    def placed(self) -> tuple[tuple[str, str, int], ...]:
        """Every rank's (node, node id, pid), in rank order: a gang may span nodes."""
        return tuple(h.placed[0] for h in self.ranks)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(pid for h in self.ranks for pid in h.pids)

    @property
    def exit_rank(self) -> int:
        """The rank whose exit is the gang's (the first to fail, else rank 0)."""
        return self.failed_rank if self.failed_rank is not None else 0

    def poll(self) -> int | None:
        now = time.monotonic()
        fresh = {}
        for rank, handle in enumerate(self.ranks):
            if rank not in self._codes:
                code = handle.poll()
                if code is not None:
                    fresh[rank] = code
        self._codes.update(fresh)
        failed = sorted((r for r, c in fresh.items() if c not in CLEAN), key=lambda r: self._blame(r, fresh[r]))
        if failed and self.failed_rank is None:
            self.failed_rank = failed[0]
            self._terminate_at = now
        elif fresh and self._terminate_at is None:
            self._terminate_at = now + self._linger  # a rank finished: the others must follow soon
        if len(self._codes) == len(self.ranks):
            return self._codes[self.exit_rank]
        if self._terminate_at is not None and now >= self._terminate_at and self._kill_at is None:
            self._kill_at = now + self._grace
            self.terminate()
        elif self._kill_at is not None and now >= self._kill_at:
            self._kill_at = float("inf")
            self.kill()
        return None

    def _blame(self, rank: int, code: int) -> tuple[int, int, int]:
        """Sort key among ranks seen to fail in one pass: the root cause first.

        A rank killed by a signal (SIGKILL, SIGSEGV, ...) comes first: its peers' errors are what its
        death did to their collectives. Then the rank whose error arrived first (its peers' "Connection
        closed by peer" come after it); last, a SIGABRT, as NCCL's watchdog ends a rank left waiting.
        """
        if code < 0 and -code != signal.SIGABRT:
            return (0, 0, rank)
        if rank in self._error_order:
            return (1, self._error_order.index(rank), rank)
        return (2, 0, rank)

    def terminate(self) -> None:
        for h in self._alive():
            h.terminate()

    def kill(self) -> None:
        for h in self._alive():
            h.kill()

    def dump_stacks(self) -> None:
        for h in self._alive():
            h.dump_stacks()

    def _alive(self) -> list[Handle]:
        return [h for rank, h in enumerate(self.ranks) if rank not in self._codes]

    def send(self, command: Command) -> bool:
        """To every rank: a Task gang's rank 0 decides for all, a script's ranks each obey their own."""
        heard = [h.send(command) for h in self.ranks]
        return heard[0]

    def attach(self, on_events: Callable[[list[Event]], None]) -> None:
        for rank, h in enumerate(self.ranks):
            h.attach(partial(self._deliver, rank, on_events=on_events))

    def read_waiting(self) -> None:
        for h in self.ranks:
            h.read_waiting()

    def _deliver(self, rank: int, events: list[Event], on_events: Callable[[list[Event]], None]) -> None:
        events = self._from_rank(rank, events)
        if events:
            on_events(events)

    def _from_rank(self, rank: int, events: list[Event]) -> list[Event]:
        """Rank 0's events as they are; of the others their pace, and errors and notices that say something
        rank 0 did not (a NaN loss or a checkpoint note comes from every rank), saying which rank."""
        out = []
        for event in events:
            if isinstance(event, WorkerError):
                self.errors[rank] = event = replace(event, rank=rank)
                if rank not in self._error_order:
                    self._error_order.append(rank)
                text = event.error
            elif isinstance(event, Notice):
                text = event.text
            elif rank == 0 or isinstance(event, RankPace):  # every rank's own pace passes
                out.append(event)
                continue
            else:
                continue
            if rank == 0:
                self._rank0_said.add(text)
            elif text in self._rank0_said:
                continue
            elif isinstance(event, Notice):
                event = replace(event, text=f"rank {rank}: {event.text}")
            if isinstance(event, WorkerError):
                self._held.append(event)  # a peer's death shows first in the others' errors: wait for the cause
                continue
            out.append(event)
        return out

    def told_errors(self) -> tuple[list[WorkerError], list[Notice]]:
        """At the gang's exit, what its ranks reported failing: (the errors of the rank that failed first, the
        root cause; one line each for what the other ranks reported after it, which its death caused)."""
        held, self._held = self._held, []
        root = self.failed_rank
        if root is None:
            return held, []
        cause = [e for e in held if e.rank == root]
        echoes = [Notice(pipeline=e.pipeline, level="warning", text=(
            f"rank {e.rank} failed after rank {root}: {e.error} (a consequence; its log has the traceback)"))
            for e in held if e.rank != root]
        return cause, echoes

    def drain(self) -> list[Event]:
        return [e for rank, h in enumerate(self.ranks) for e in self._from_rank(rank, h.drain())]

    def close(self) -> None:
        for h in self.ranks:
            h.close()
        self._on_close()


def launch_gang(backend: Backend, specs: list[LaunchSpec], linger: float, grace: float,
                on_close: Callable[[], None] = lambda: None) -> GangHandle:
    """Start every rank (the backend's `launch_ranks`); if one cannot start, those already started are ended
    and the error raised."""
    try:
        ranks = backend.launch_ranks(specs)
    except BaseException:  # the backend closed the ranks it started: no port may stay held either
        on_close()
        raise
    return GangHandle(ranks, linger, grace, on_close)
