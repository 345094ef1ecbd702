"""The half of a script attempt that speaks to a script using torchherd.client: its frames in, ours out.

`ClientFrames` is mixed into `ScriptAttempt` (engine/runners/script/runner.py), whose state it reads
and sets: the socket, the events, the sender, the validation settings and the stop and pause flags.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .... import client_frames as wire
from ...protocol.health import RankPace
from ...protocol.messages import CheckpointSaved, EarlyStop, Notice, Resumed
from ...worker.handoff import announce_snapshot
from .validation import InlineScorer

if TYPE_CHECKING:
    from ...config.schema import ValidationConfig
    from ...protocol.channel import StatusSender
    from ...protocol.messages import EpochEnd, StepMetrics
    from ...protocol.spec import WorkerSpec
    from .events import ScriptEvents


class ClientFrames:
    """Frames to and from the script's client; mixed into ScriptAttempt."""

    # The attributes of `ScriptAttempt` used here (its __init__ sets them).
    spec: WorkerSpec
    name: str
    validation: ValidationConfig
    sender: StatusSender
    events: ScriptEvents
    state: dict[str, Any]
    sock: socket.socket | None
    _sock_lock: threading.Lock
    client: bool
    paused: bool
    stopped_by_signal: bool
    stopping: bool
    inline_dir: str | None
    inline: InlineScorer | None
    _emit: Callable[[StepMetrics | EpochEnd, float | None], None]
    _save_state: Callable[[], None]

    def _frame(self, frame: wire.Frame) -> None:
        if not self.client or self.sock is None:
            return
        try:
            with self._sock_lock:
                self.sock.sendall(wire.encode(frame))
        except OSError:
            pass

    def _read_client(self) -> None:
        """Read the script's frames until it closes the socket. This thread must outlive any bad frame: the
        script's sends block once nobody reads, and its training with them."""
        reader = wire.LineReader()
        said = False
        assert self.sock is not None, "run() makes the socket before this thread"
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            for line in reader.feed(chunk):
                frame = wire.decode(line, wire.TO_RUNNER)
                try:
                    if frame is not None:
                        self._on_frame(frame)
                except Exception as exc:  # a frame of the right types that still makes no sense here
                    said = said or self._bad_frame(f"{type(exc).__name__}: {exc}")
            if reader.dropped and not said:
                said = self._bad_frame(f"a line of over {wire.MAX_LINE} bytes")

    def _bad_frame(self, what: str) -> bool:
        self.sender.send(Notice(pipeline=self.name, level="warning",
                                text=f"torchherd.client: a frame was left out ({what}); said once"))
        return True

    def _on_frame(self, frame: wire.Frame) -> None:
        self.client_seen = True
        if isinstance(frame, wire.Hello):
            self.client = True
            if self.paused and not self.stopped_by_signal:
                self._frame(wire.PauseRequest())
            if self.stopping:
                self._frame(wire.StopRequest())
        elif isinstance(frame, wire.PollsStop):
            self.polls_stop = True
        elif isinstance(frame, wire.Beat):
            self.client_beats = True
        elif isinstance(frame, wire.StepReport):
            self.client_beats = True
            values = frame.metrics or {}
            event = self.events.step_report(frame.step, frame.epoch, frame.loss, values.get("lr"),
                                            frame.samples or 0.0, frame.seconds or 0.0, max(int(frame.n or 1), 1),
                                            metrics={k: v for k, v in values.items() if k != "lr"})
            if event is not None:
                self._emit(event, frame.loss)
            if self.spec.world_size > 1 and frame.seconds and event is not None:  # each rank's own pace
                self.sender.step(RankPace(pipeline=self.name, rank=self.spec.rank, step=event.step,
                                          step_time=frame.seconds / max(int(frame.n or 1), 1)))
        elif isinstance(frame, wire.EpochDone):
            self._emit(self.events.epoch_end(int(frame.epoch), frame.loss), frame.loss)
        elif isinstance(frame, wire.Saved):
            self.state.setdefault("checkpoints", {})[frame.path] = [frame.epoch, frame.step]
            self._save_state()
            self.sender.send(CheckpointSaved(pipeline=self.name, path=frame.path, epoch=frame.epoch,
                                             step=frame.step, reason=frame.reason))
        elif isinstance(frame, wire.ResumedFrom):
            epoch, step = self.state.get("checkpoints", {}).get(frame.path, [0, 0])
            self.events.resume(epoch, step)
            self.sender.send(Resumed(pipeline=self.name, path=frame.path, epoch=epoch, step=step))
        elif isinstance(frame, wire.Snapshot):
            self._snapshot(frame)

    def _snapshot(self, frame: wire.Snapshot) -> None:
        if not frame.wait:
            announce_snapshot(self.sender, self.name, frame.epoch, frame.step, frame.info(), self.validation.slots,
                              f"at step {frame.step}")
            return
        try:
            if self.inline is None:
                assert self.inline_dir is not None, "a waiting snapshot is an inline one, to inline_dir"
                self.inline = InlineScorer(self.name, Path(self.inline_dir), self.spec.device, self.sender,
                                           self._early_stop)
            self.scoring = True  # the script waits for the ack meanwhile: that is no hang
            self.inline.score()
        finally:
            self.scoring = False
            self._frame(wire.Ack())

    def _early_stop(self, reason: str) -> None:
        self.sender.send(EarlyStop(pipeline=self.name, reason=reason))  # the supervisor stops it, saying why

