"""The supervisor's side of the sinks: `SinkFeed` starts a host process for each sink `[tracking]` names and hands
each the run's events as their events.jsonl lines (step reports thinned as TensorBoard's are), written from the loop
as far as its pipe takes them; a host that falls behind loses step reports (counted, said once), never holds the
supervisor up, and is waited for at the run's end only while it makes progress."""
from __future__ import annotations

import asyncio
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..config.tracking import TrackingConfig
from ..protocol.messages import (
    Event,
    Heartbeat,
    PipelineFinished,
    RunFinished,
    SnapshotSkipped,
    SnapshotTaken,
    StepMetrics,
)
from ..protocol.nolinks import make_dirs, open_file
from ..rundir.tensorboard import StepThinning
from .api import FOLDER, sink_name

HAND_OVER = 0.2  # seconds lines wait on the loop before the writer threads get them (a step report's usual wait)
STALL = 10.0  # seconds without progress after which a host behind is not waited for
STARTUP = 60.0  # the same, before the host has said its sink is ready (a tracker's imports, its first connection)
SETTLE_MAX = 60.0  # seconds the run's end waits, at most, for hosts that are still taking events
CLOSE_WAIT = 30.0  # seconds a host may take to finish its sink once its input has ended
SKIPPED = (Heartbeat, SnapshotTaken, SnapshotSkipped)  # nothing a tracker shows
URGENT = (PipelineFinished, RunFinished)  # handed over at once
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_SIZE = 1 << 20
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # buffers in one writev
Say = Callable[[str, str], None]  # (text, level): a notice of the run


class SinkHost:
    """One sink's process, the lines handed to it and what it has said it took."""

    def __init__(self, spec: str, run_dir: Path, resuming: bool, buffer: int, say: Say):
        self.name, self.buffer, self._say = sink_name(spec), buffer, say
        folder = make_dirs(run_dir / FOLDER, run_dir)
        with open_file(folder / f"{self.name}.log", "ab", 0o600) as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "torchherd.engine.sinks.host", str(run_dir), spec,
                 *(["--resuming"] if resuming else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        self.sent = self.done = self.dropped = 0  # events handed on, taken by the host, dropped for the backlog
        self.dropped_said = 0
        self.progress_at = time.monotonic()  # when the host last took events (or was last caught up)
        self.gone = False  # its process has ended (or its input broke)
        self.stalled = False
        self.ready = False  # it has answered once: its sink is built
        self._out: deque[bytes | memoryview] = deque()  # events' lines handed on, not in the pipe yet
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._fd = self.proc.stdin.fileno()
        os.set_blocking(self._fd, False)  # written from the loop as far as the pipe takes, never waited on
        try:  # a MiB in the pipe: what a hand-over every HAND_OVER seconds writes at once
            fcntl.fcntl(self._fd, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # not Linux, or above /proc/sys/fs/pipe-max-size: the default stands
            pass
        threading.Thread(target=self._answers, args=(self.proc.stdout,), name=f"torchherd-sink-{self.name}-answers",
                         daemon=True).start()

    def send(self, lines: list[bytes], kept: Callable[[], list[bytes]]) -> None:
        """Hand on `lines`, one event each; when that would take it past its backlog, only `kept()`'s (every event
        but step reports), the rest counted as dropped."""
        if self.gone:
            return
        if self.buffer - (self.sent - self.done) < len(lines):
            if not self.dropped:
                self._say(f"tracking ({self.name}) is {self.buffer} events behind: step reports are dropped for it "
                          "until it catches up (training goes on; the count comes at the end)", "warning")
            few = kept()
            self.dropped += len(lines) - len(few)
            lines = few
            if not lines:
                return
        if self.sent == self.done:  # it was caught up: its clock of progress starts now
            self.progress_at = time.monotonic()
        self.sent += len(lines)
        self._out.extend(lines)

    def flush(self) -> bool:
        """Write what the pipe takes now, without waiting (the lines as they are, IOV_MAX at a time: nothing is
        joined or copied here); True when something is still to write."""
        out = self._out
        while out and not self.gone:
            try:
                n = os.writev(self._fd, list(itertools.islice(out, IOV_MAX)))
            except BlockingIOError:
                return True
            except OSError:  # the host ended: its answers say why
                self.gone = True
                out.clear()
                return False
            while n and n >= len(out[0]):
                n -= len(out.popleft())
            if n:  # a line written in part: its rest goes first next time
                out[0] = memoryview(out[0])[n:]
                return True
        return False

    def caught_up(self) -> bool:
        """It has taken every event handed on, or it is gone or stalled (said once): nothing to wait for."""
        if self.gone or self.done >= self.sent:
            return True
        if time.monotonic() - self.progress_at > (STALL if self.ready else STARTUP):
            if not self.stalled:
                self.stalled = True
                self._say(f"tracking ({self.name}) took no events for {STALL:.0f} s; the run does not wait for it "
                          f"({self.sent - self.done} events not taken; its log: {FOLDER}/{self.name}.log)", "warning")
            return True
        return False

    def _answers(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if not isinstance(answer, dict):
                continue
            if isinstance(answer.get("done"), int):
                self.done = answer["done"]
                self.progress_at = time.monotonic()
                self.ready, self.stalled = True, False
            elif isinstance(answer.get("notice"), str):
                level = answer.get("level")
                self._say(answer["notice"], level if level in ("info", "warning", "error") else "warning")
        self.gone = True

    def close(self, wait: float) -> None:
        """Write the rest and end its input, give it `wait` seconds to finish (none when stalled), then end its
        process group."""
        if not self.stalled:
            threading.Thread(target=self._last_write, name=f"torchherd-sink-{self.name}", daemon=True).start()
        else:
            self._end_input()
        try:
            self.proc.wait(0.0 if self.stalled else wait)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()

    def _last_write(self) -> None:
        """What is still to write, waited on (a thread of its own: ended by the host's end at the latest)."""
        try:
            os.set_blocking(self._fd, True)
            self.flush()
        except OSError:
            pass
        self._end_input()

    def _end_input(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass


class SinkFeed:
    """Every sink of the session, tapped on its bus: `on_event`/`on_steps` take the lines, `caught_up` tells the
    run's end whether to wait, `settle` waits at shutdown, `close` ends the hosts."""

    @classmethod
    def open(cls, tracking: TrackingConfig, run_dir: Path, resuming: bool, notice: Say) -> SinkFeed | None:
        """The feed of `tracking`'s sinks (None when it names none); `notice(text, level)` is called on the
        loop's thread, whichever thread has something to say (at once when it is the loop's)."""
        specs = tracking.specs()
        if not specs:
            return None
        loop, own = asyncio.get_running_loop(), threading.get_ident()

        def say(text: str, level: str) -> None:
            if threading.get_ident() == own:
                notice(text, level)
            else:
                loop.call_soon_threadsafe(notice, text, level)
        return cls(specs, run_dir, resuming, tracking.buffer, say, tracking.points_per_s)

    def __init__(self, specs: list[str], run_dir: Path, resuming: bool, buffer: int, say: Say,
                 points_per_s: float = 0.0):
        self.hosts = [SinkHost(spec, run_dir, resuming, buffer, say) for spec in specs]
        self._say = say
        self._due = False  # a hand-over is scheduled
        self._lines: list[bytes] = []  # published since the last hand-over, in order
        self._kept: list[bytes] = []  # the same but step reports: what a host behind still gets
        # Step reports thinned as TensorBoard's are (none when points_per_s is 0); per pipeline the line of the
        # newest one held back, handed on before its epoch, attempt or the run ends.
        self._thinning = StepThinning(1.0 / points_per_s) if points_per_s else None
        self._held: dict[str, bytes] = {}

    def on_event(self, event: Event, line: bytes, kept: bool) -> None:
        if not kept or isinstance(event, SKIPPED):
            return
        thinning = self._thinning
        if thinning is not None:
            if type(event) is StepMetrics:
                if not thinning.keep(event):
                    self._held[event.pipeline] = line
                    return
                self._held.pop(event.pipeline, None)
            else:
                for held in thinning.release(event):
                    if (last := self._held.pop(held.pipeline, None)) is not None:
                        self._lines.append(last)
        self._lines.append(line)
        self._kept.append(line)
        if isinstance(event, URGENT):
            self.hand_over()
        else:
            self._soon()

    def on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        thinning = self._thinning
        if thinning is None:
            self._lines += lines
        else:
            keep, held, out = thinning.keep, self._held, self._lines
            before = len(out)
            for event, line in zip(steps, lines):
                if keep(event):
                    out.append(line)
                    held.pop(event.pipeline, None)
                else:
                    held[event.pipeline] = line
            if len(out) == before:
                return
        self._soon()

    def _soon(self) -> None:
        if self._due:
            return
        self._due = True
        try:
            asyncio.get_running_loop().call_later(HAND_OVER, self.hand_over)
        except RuntimeError:  # no loop: at once
            self.hand_over()

    def hand_over(self) -> None:
        """What was published since the last hand-over, to every host; what a pipe did not take goes on at the
        next (one is due while anything is left)."""
        self._due = False
        if not self._lines:
            if any([host.flush() for host in self.hosts]):
                self._soon()
            return
        lines, kept = self._lines, self._kept
        self._lines, self._kept = [], []
        for host in self.hosts:
            host.send(lines, lambda: kept)
        if any([host.flush() for host in self.hosts]):
            self._soon()

    def caught_up(self) -> bool:
        """Every host has taken what it was handed (or is gone, or stalled): the run may end. Once they all have,
        what each lost while it was behind is said."""
        self.hand_over()
        if not all([host.caught_up() for host in self.hosts]):
            return False
        for host in self.hosts:
            if host.dropped > host.dropped_said:
                self._say(f"tracking ({host.name}): {host.dropped} step reports were dropped while it was behind",
                          "warning")
                host.dropped_said = host.dropped
        return True

    async def settle(self, limit: float = SETTLE_MAX) -> None:
        """Wait while a host is still taking events (at most `limit` seconds)."""
        deadline = time.monotonic() + limit
        while not self.caught_up() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """End every host (after run_finished, the last event): its sink finishes, or its process is ended."""
        self.hand_over()
        threads = [threading.Thread(target=host.close, args=(CLOSE_WAIT,), daemon=True) for host in self.hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
