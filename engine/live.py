"""What a live run offers the app and the command line, as one `Protocol`: its run directory, its events,
commands for its pipelines, and its end.

Two objects satisfy it: the `Supervisor` in the client's own process and `RemoteRun`, a client of a
supervisor served over its control socket (tests/test_seam.py checks both).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .supervise.bus import EventStream


class LiveRun(Protocol):
    """A run whose supervisor is alive: watched through `subscribe`, steered one pipeline at a time."""

    run_dir: Path
    """The run directory: config, events.jsonl, each pipeline's checkpoints and logs."""

    @property
    def alive(self) -> bool:
        """Some pipeline is still at work (the in-process supervisor: some worker process exists)."""
        ...

    def subscribe(self, replay: bool = True) -> EventStream:
        """The run's events (its history first, unless `replay` is false), ending when the run ends."""
        ...

    def kill(self, name: str) -> None:
        """End the pipeline now: the polite signal to its processes, the hard one after the grace period."""
        ...

    def restart(self, name: str) -> None:
        """End the pipeline and start it again from its last checkpoint (no restart budget spent)."""
        ...

    def pause(self, name: str) -> None:
        """Hold the pipeline between steps; its slot stays its own."""
        ...

    def unpause(self, name: str) -> None:
        """Let a paused pipeline carry on (un-pause; `torchherd resume` carries on a run)."""
        ...

    def stop(self, name: str | None = None, reason: str = "requested") -> None:
        """Finish the step, checkpoint and end the pipeline (every pipeline when `name` is None)."""
        ...

    def checkpoint(self, name: str) -> None:
        """Write the pipeline's checkpoint now, between two steps, and train on."""
        ...

    def stacks(self, name: str) -> None:
        """Have every process of the pipeline write its threads' stacks into its log."""
        ...

    def promote(self, name: str) -> None:
        """Never prune this sweep trial again this session; a pruned or paused one trains on from its checkpoint."""
        ...

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """Stop (gracefully: checkpoint first) or kill every pipeline, and end the run."""
        ...

    async def wait(self) -> dict[str, str]:
        """Wait for the run to end: each pipeline's final state by name."""
        ...


if TYPE_CHECKING:  # the type checker proves both satisfy it; tests/test_seam.py proves it at run time
    from .serve.remote import RemoteRun
    from .supervise.supervisor import Supervisor

    def _both_are_live_runs(local: Supervisor, remote: RemoteRun) -> tuple[LiveRun, LiveRun]:
        return local, remote
