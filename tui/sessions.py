"""The two kinds of session the app drives, behind one surface: a run served by a torchherd service of its
own (the default: it outlives the app, other clients can attach), and a supervisor inside the app's
process (what tests drive with scripted launchers).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..engine import EventStream, LiveRun, RemoteRun, RunConfig, Supervisor


class Session:
    """A live run the app watches and steers; `remote` sessions can be left running (detach)."""

    remote = False

    run: LiveRun  # what the app watches and steers (a service session's once started)

    def __init__(self, supervisor: Supervisor):
        self.run = self._supervisor = supervisor

    @property
    def run_dir(self) -> Path:
        return Path(self.run.run_dir)

    @property
    def alive(self) -> bool:
        return bool(self.run.alive)

    async def start(self) -> None:
        await self._supervisor.start()

    async def add_config(self, config: RunConfig) -> list[str]:
        return list(self._supervisor.add_config(config))

    def subscribe(self) -> EventStream:
        return self.run.subscribe()

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        await self.run.shutdown(graceful=graceful, timeout=timeout)

    async def detach(self) -> None:
        raise RuntimeError("this run lives in the app's process: it cannot be left running")


class ServiceSession(Session):
    """A run in a service of its own: started (or resumed) here, or one already live that the app attaches to."""

    remote = True

    def __init__(self, config: Path | None = None, runs_dir: Path | None = None, *, resume: Path | None = None,
                 only: list[str] | None = None, attach: Path | None = None, read_only: bool = False):
        self._remote: RemoteRun | None = None  # once started
        self._spawn: dict[str, Any] = {"config": config, "runs_dir": runs_dir, "resume": resume, "only": only}
        self._attach, self.read_only = attach, read_only

    async def start(self) -> None:
        """Spawn the service (unless attaching), then connect; raises ServiceFailed or NotLive."""
        from ..engine import RemoteRun, spawn

        run_dir = self._attach
        if run_dir is None:
            run_dir = (await asyncio.to_thread(spawn, **self._spawn)).run_dir
        self.run = self._remote = await RemoteRun.connect(run_dir, read_only=self.read_only, summary=True)

    async def add_config(self, config: RunConfig) -> list[str]:
        assert self._remote is not None, "add_config before start"
        return await self._remote.add_config_file(Path(config.source))

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        if self._remote is not None:
            remote = self._remote
            await (remote.close() if self.read_only else remote.shutdown(graceful=graceful, timeout=timeout))

    async def detach(self) -> None:
        if self._remote is not None:
            await self._remote.detach()

    async def why_ended(self) -> tuple[str, str]:
        """Once the connection has ended though the run did not finish: which way (RemoteRun.outcome), and why
        for people."""
        assert self._remote is not None, "why_ended before start"
        outcome = await self._remote.outcome()
        return outcome, await self._remote.why_ended(settle=0.0)
