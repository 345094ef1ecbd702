"""The live half of torchherd.client: the socket to the script runner, its reader and its flush thread.

torchherd.client imports this only when torchherd runs the script (`TORCHHERD_CLIENT_FD` is set), so
a script run on its own pays for neither sockets, threads nor the frames' JSON.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from torchherd import client_frames as wire
from torchherd.client_env import FLUSH_INTERVAL

if TYPE_CHECKING:
    import torch

    from torchherd.engine.worker.snapshot import SnapshotWriter

MAX_PENDING = 100_000  # reports kept between two flushes; beyond this the oldest are dropped


class SupportsItem(Protocol):
    """A one-element tensor (torch's, numpy's): its value comes from `.item()`."""

    def item(self) -> float: ...


Scalar = float | SupportsItem  # a loss or metric as `report` takes it, read with `number` off the loop
# a report as queued: (step, epoch, loss, samples, metrics); None for a heartbeat
Report = tuple[int | None, int | None, Scalar | None, Scalar | None, dict[str, Scalar] | None] | None


def number(value: Scalar) -> float:
    """A Python float from a float, int or one-element tensor (the tensor read here, off the loop)."""
    return float(value.item()) if hasattr(value, "item") else float(value)


class Client:
    """The connection to the script runner and what the loop has told it so far."""

    def __init__(self, fd: int, snapshot: wire.SnapshotTarget | None):
        self._sock = socket.socket(fileno=fd)  # raises OSError if fd is not a socket
        self._write_lock = threading.Lock()
        self.order = threading.RLock()  # a flush and the frame that must follow it go out in that order
        self._pending: deque[Report] = deque(maxlen=MAX_PENDING)
        self._wake = threading.Event()
        self._resumed = threading.Event()  # set while not paused
        self._resumed.set()
        self._acked = threading.Event()
        self.stop = False
        self.stop_seen = False  # should_stop() has said True: the next save() is the stop's
        self.paused = False
        self.checkpoint = False  # a checkpoint-now request not yet taken
        self.polls_checkpoint = False
        self.polls_stop = False
        self.epoch = 0  # the epoch in progress, 0-based
        self.epoch_done: int | None = None
        self.step = 0
        self.reports = 0
        self.reason = ""  # why the next save() happens
        self.snapshot = snapshot  # where hand-offs go, or None when nothing validates them
        self.writer: SnapshotWriter | None = None
        self.closed = False
        self._flushed = time.monotonic()
        self.send(wire.Hello(pid=os.getpid()))
        threading.Thread(target=self._read, name="torchherd-client-read", daemon=True).start()
        threading.Thread(target=self._flush_loop, name="torchherd-client-flush", daemon=True).start()

    def send(self, frame: wire.Frame) -> None:
        """One frame to the runner; a runner that went away reads as a stop."""
        data = wire.encode(frame)
        try:
            with self._write_lock:
                self._sock.sendall(data)
        except OSError:  # torchherd went away; the worker's death signal ends us soon
            self._gone()

    def _gone(self) -> None:
        self.closed = self.stop = True
        self.paused = False
        self._resumed.set()
        self._acked.set()

    def _read(self) -> None:
        reader = wire.LineReader()
        while True:
            try:
                chunk = self._sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                self._gone()
                return
            for line in reader.feed(chunk):
                self._obey(wire.decode(line, wire.TO_SCRIPT))

    def _obey(self, frame: wire.Frame | None) -> None:
        if isinstance(frame, wire.StopRequest):
            self.stop = True
            self._resumed.set()
        elif isinstance(frame, wire.PauseRequest):
            self.paused = True
            self._resumed.clear()
        elif isinstance(frame, wire.ResumeRequest):
            self.paused = False
            self._resumed.set()
        elif isinstance(frame, wire.CheckpointRequest):
            self.checkpoint = True
            self._resumed.set()  # let a paused loop out to save; it waits again after
        elif isinstance(frame, wire.Ack):
            self._acked.set()

    def hold(self, for_checkpoint: bool | None = None) -> None:
        """Wait while paused; a stop, or a checkpoint request (if the caller serves them), lets it out."""
        serve = self.polls_checkpoint if for_checkpoint is None else for_checkpoint
        while self.paused and not self.stop and not (self.checkpoint and serve):
            self._resumed.wait(0.5)
            if self.paused and not self.stop and not (self.checkpoint and serve):
                self._resumed.clear()

    def saved(self, path: Path, reason: str) -> None:
        with self.order:
            self.flush()
            self.send(wire.Saved(path=str(path.resolve()), epoch=self.epoch, step=self.step, reason=reason))

    # ------------------------------------------------------------ reports

    def queue_report(self, step: int | None, epoch: int | None, loss: Scalar | None, samples: Scalar | None,
                     metrics: dict[str, Scalar] | None) -> None:
        """One report, kept until the next flush (values may be tensors: they are read there)."""
        self._pending.append((step, epoch, loss, samples, metrics))

    def queue_beat(self) -> None:
        """A sign of life without a step, sent with the next flush."""
        self._pending.append(None)

    def _flush_loop(self) -> None:
        while not self.closed:
            self._wake.wait(FLUSH_INTERVAL)
            self._wake.clear()
            with self.order:
                self.flush()

    def flush(self) -> None:
        """Coalesce the queued reports into one frame (mean loss, samples/s, newest of the rest) and send it."""
        now = time.monotonic()
        window, self._flushed = now - self._flushed, now  # seconds the queued reports took
        pending = self._pending
        if not pending:
            return
        loss_sum, losses, samples = 0.0, 0, 0.0
        values: dict[str, float] = {}
        step = epoch = None
        while pending:
            item = pending.popleft()
            if item is None:  # a heartbeat(): it only has to arrive
                continue
            s, e, loss, n, extra = item
            self.reports += 1
            step = s if s is not None else self.reports
            epoch = e if e is not None else epoch
            try:
                if loss is not None:
                    loss_sum += number(loss)
                    losses += 1
                if n is not None:
                    samples += number(n)
                for key, value in (extra or {}).items():
                    values[key] = number(value)
            except (TypeError, ValueError, RuntimeError):
                continue  # a value that is not a number: left out, the loop goes on
        if step is None:
            self.send(wire.Beat(step=self.step))
            return
        self.step = step
        if epoch is not None:
            self.epoch = epoch
        self.send(wire.StepReport(step=step, epoch=self.epoch, loss=loss_sum / losses if losses else None, n=losses,
                                  samples=samples, seconds=window, metrics=values))

    # ------------------------------------------------------------ hand-off

    def hand_off(self, model: torch.nn.Module, epoch: int | None, step: int | None) -> int | None:
        snap = self.snapshot
        if snap is None:
            return None
        if self.writer is None or self.writer.model is not model:
            from torchherd.engine.worker.snapshot import SnapshotWriter

            seq = snap.seq
            if self.writer is not None:
                seq = self.writer.seq
                self.writer.close()  # its last copy lands before a new writer takes the slots
            self.writer = SnapshotWriter(Path(snap.dir), model, snap.slots, snap.policy, snap.checksum, snap.meta,
                                         staging=snap.staging)
            self.writer.seq = seq
            for _, text in self.writer.opening_notices():
                print(f"torchherd: {text}", file=sys.stderr, flush=True)
        with self.order:
            self.flush()
            epoch = epoch if epoch is not None else (self.epoch_done if self.epoch_done is not None else self.epoch)
            step = step if step is not None else self.step
            info = self.writer.hand_off(epoch, step)
            inline = snap.mode == "inline"
            if inline:  # the runner scores the slot as soon as it hears of it: it must be published by then
                self.writer.flush()
            self._acked.clear()
            self.send(wire.Snapshot(epoch=epoch, step=step, wait=inline, **info))
        if inline:  # validation runs in the worker now; the loop waits for it, as inline means
            self._acked.wait()
        taken: int = info["seq"]  # the snapshot's number
        return taken
