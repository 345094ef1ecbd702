"""What a run does when its disk fills: it goes on supervising, with the lines its files cannot take kept in
memory and written once there is room; once a pipeline's checkpoint cannot be written either, training
would go on with nothing saved, so every pipeline is stopped gracefully (each keeps its last checkpoint),
saying why in the run's events and on stderr; at the end the supervisor waits a while for space to write what
it still holds, and says what it could not.
"""
from __future__ import annotations

import asyncio
import sys

from ..protocol.messages import Event, Notice, StepMetrics
from ..protocol.names import NoticeTopic
from ..rundir.directory import RunDirectory
from .decisions import Outbox, Record, StopRun

SPACE_WAIT = 60.0  # seconds the end of a run waits for room to write the lines it still holds
RETRY = 0.5  # seconds between tries meanwhile
DISK_FULL = "disk full"  # how a stop for it begins its reason


def _say(text: str) -> None:
    """A line on stderr (the service's supervisor.log, itself perhaps on the full disk: then nothing)."""
    try:
        print(f"torchherd: {text}", file=sys.stderr, flush=True)
    except OSError:
        pass


class DiskWatch:
    """Watches whether the run's files can be written, and stops the run when checkpoints cannot be either."""

    def __init__(self, rundir: RunDirectory, out: Outbox):
        self.rundir, self._out = rundir, out
        self.failing = False  # said that the files cannot be written, and not yet that they can again
        self.stopped = ""  # the reason the run was stopped for a full disk ("" if it was not)

    def check(self) -> None:
        """After a flush (each tick): say when the run's files stop, or start again, being written."""
        error = self.rundir.failing
        if error is not None and not self.failing:
            self.failing = True
            text = (f"cannot write the run's files ({error.filename or self.rundir.path}: {error.strerror}); "
                    "supervision goes on, and what they miss is kept in memory and written once there is room")
            self._out.send(Record(Notice(level="error", text=text)))
            _say(text)
        elif error is None and self.failing:
            self.failing = False
            self._out.send(Record(Notice(level="info", text="the run's files are written again; nothing was lost")))

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        """Every event, as published (a tap): a checkpoint that failed while the run's own files cannot be written
        either means the disk is full; the run stops while every pipeline still has its last checkpoint."""
        if self.stopped or not isinstance(event, Notice) or event.topic != NoticeTopic.CHECKPOINT_FAILED:
            return
        error = self.rundir.failing
        if error is None:
            return  # a checkpoint alone failing is the pipeline's notice: training goes on
        self.stopped = f"{DISK_FULL}: {error.strerror} ({event.pipeline}'s checkpoint and the run's files)"
        text = (f"{self.stopped}: stopping every pipeline, each at its last checkpoint; free some space, "
                f"then `torchherd resume {self.rundir.path}`")
        self._out.send(Record(Notice(level="error", text=text)), StopRun(self.stopped))
        _say(text)

    def on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        """A run of step reports: none is a notice (a call per report would cost a flood)."""

    async def settle(self, wait: float = SPACE_WAIT) -> None:
        """At the end: wait up to `wait` seconds for room to write what the run's files still hold."""
        if self.rundir.flush():
            return
        _say(f"{self.rundir.pending} bytes of the run's events are not on disk yet ({self.rundir.failing}); "
             f"waiting up to {wait:g} s for space")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while loop.time() < deadline:
            await asyncio.sleep(RETRY)
            if self.rundir.flush():
                _say("written: nothing was lost")
                return
        _say(f"no space came: {self.rundir.pending} bytes of the run's events are lost; its checkpoints are "
             "intact")
