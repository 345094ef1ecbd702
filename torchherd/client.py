"""Three lines that let torchherd steer a training script of your own: report, should_stop, hand_off.

```python
import torchherd.client as herd

herd.report(step=step, loss=loss, lr=lr)      # cheap: never blocks, coalesces, no device sync
if herd.should_stop(): herd.save(state); break  # stop key / Ctrl-C / SIGHUP, at a step boundary
herd.hand_off(model)                            # weights for the background validator
```

Outside torchherd every call is a no-op (`should_stop()` is False, `report` returns at
once), so the script still runs on its own. Under torchherd the script runner passes
a socket (`TORCHHERD_CLIENT_FD`); reports queue in memory and a background thread
sends them a few times a second as the frames of torchherd/client_frames.py, reading
tensors with `.item()` there, never in the training loop. Commands come back the same
way. Importing this module loads neither torch, pydantic nor Textual.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torchherd import client_frames as wire

__all__ = ["Validation", "checkpoint_dir", "checkpoint_requested", "epoch_end", "flush", "hand_off", "heartbeat",
           "report", "resume_from", "save", "should_stop", "supervised", "wait_if_paused"]

FLUSH_INTERVAL = 0.1  # seconds between batches of reports sent to torchherd
MAX_PENDING = 100_000  # reports kept between two flushes; beyond this the oldest are dropped
BEST = "best.pt"  # written by torchherd's validator into the same folder; never a resume point


@dataclass
class Validation:
    """What a `validate = "val.py:build"` factory returns: the model to load hand-offs into and its data.

    `val_data` is a Dataset (batched by the pipeline's batch_size) or any iterable of
    `(inputs, targets)` batches; `loss_fn(model(inputs), targets)` gives `val_loss`, and
    `metrics_fn(outputs, targets)`, if given, a dict of extra metrics averaged per sample.
    """

    model: Any  # torch.nn.Module with the same parameters, in the same order, as the one handed off
    val_data: Any
    loss_fn: Callable[[Any, Any], Any]
    metrics_fn: Callable[[Any, Any], dict[str, Any]] | None = None


def _number(value: Any) -> float:
    """A Python float from a float, int or one-element tensor (the tensor read here, off the loop)."""
    return float(value.item()) if hasattr(value, "item") else float(value)


class Client:
    """The connection to the script runner and what the loop has told it so far."""

    def __init__(self, fd: int, snapshot: wire.SnapshotTarget | None):
        self._sock = socket.socket(fileno=fd)  # raises OSError if fd is not a socket
        self._write_lock = threading.Lock()
        self.order = threading.RLock()  # a flush and the frame that must follow it go out in that order
        self._pending: deque = deque(maxlen=MAX_PENDING)
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
        self.writer = None
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
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                self._gone()
                return
            lines, buf = wire.split_lines(buf, chunk)
            for line in lines:
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

    def queue_report(self, step: int | None, epoch: int | None, loss: Any, samples: Any,
                     metrics: dict[str, Any] | None) -> None:
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
                    loss_sum += _number(loss)
                    losses += 1
                if n is not None:
                    samples += _number(n)
                for key, value in (extra or {}).items():
                    values[key] = _number(value)
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

    def hand_off(self, model: Any, epoch: int | None, step: int | None) -> int | None:
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
        return info["seq"]


def _connect() -> Client | None:
    fd = os.environ.pop(wire.ENV_FD, None)  # popped: processes the script starts are not us
    snapshot = os.environ.pop(wire.ENV_SNAPSHOT, None)
    if fd is None:
        return None
    try:
        return Client(int(fd), wire.SnapshotTarget.from_env(snapshot) if snapshot else None)
    except (OSError, ValueError, TypeError):
        return None


_client = _connect()


def _forget_in_child() -> None:
    global _client
    _client = None  # a forked DataLoader worker has no flush thread and must not write to the socket


os.register_at_fork(after_in_child=_forget_in_child)


# ------------------------------------------------------------ the API


def report(step: int | None = None, loss: Any = None, *, epoch: int | None = None, samples: Any = None,
           **metrics: Any) -> None:
    """Record one training step: never blocks (unless paused) and never syncs a device.

    `loss` and metrics may be floats or one-element tensors (read later, off the loop);
    `step` defaults to the number of reports so far, `epoch` (0-based) to the one in
    progress; `samples` (the batch size) gives samples/s. While torchherd holds the run
    paused, this waits.
    """
    c = _client
    if c is None:
        return
    c.queue_report(step, epoch, loss, samples, metrics)
    if c.paused:
        c.hold()


def epoch_end(epoch: int, loss: Any = None) -> None:
    """An epoch finished: `epoch` counts from 0, as `for epoch in range(n)` does; `loss` is its mean."""
    c = _client
    if c is None:
        return
    value = None if loss is None else _number(loss)
    with c.order:
        c.flush()
        c.epoch_done, c.epoch = epoch, epoch + 1
        c.send(wire.EpochDone(epoch=epoch, step=c.step, loss=value))


def heartbeat() -> None:
    """Say the script is alive without a step (a long evaluation, data preparation)."""
    c = _client
    if c is not None:
        c.queue_beat()


def should_stop() -> bool:
    """True once torchherd asks the run to stop (stop key, Ctrl-C, SIGHUP): save and leave the loop."""
    c = _client
    if c is None:
        return False
    if not c.polls_stop:
        c.polls_stop = True  # from now on a stop is asked of us, not signalled
        c.send(wire.PollsStop())
    c.stop_seen = c.stop
    return c.stop


def checkpoint_requested() -> bool:
    """True once per checkpoint-now request (the `c` key): save, and the next save() is reported as it."""
    c = _client
    if c is None:
        return False
    c.polls_checkpoint = True
    if not c.checkpoint:
        return False
    c.checkpoint, c.reason = False, "request"
    return True


def supervised() -> bool:
    """True when torchherd runs this script (every other call here is then live, not a no-op)."""
    return _client is not None


def flush() -> None:
    """Send what `report` has queued now, not at the next background flush (before `os._exit`, say)."""
    c = _client
    if c is not None:
        with c.order:
            c.flush()


def wait_if_paused() -> None:
    """Wait here while torchherd holds the run paused (`report` does this too)."""
    c = _client
    if c is not None and c.paused:
        c.hold()


def checkpoint_dir() -> Path:
    """The folder to save checkpoints in: the pipeline's in the run directory, else ./checkpoints."""
    path = Path(os.environ.get(wire.ENV_CHECKPOINT_DIR, "checkpoints"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def resume_from() -> Path | None:
    """The newest checkpoint the script saved in `checkpoint_dir()` (for restarts and resumes), or None."""
    folder = checkpoint_dir()
    found = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != BEST]
    if not found:
        return None
    newest = max(found, key=lambda p: p.stat().st_mtime)
    if _client is not None:
        _client.send(wire.ResumedFrom(path=str(newest.resolve())))
    return newest


def save(obj: Any, name: str = "last.pt") -> Path:
    """`torch.save(obj)` into `checkpoint_dir()/name` atomically (a crash leaves the old file or the new).

    Torchherd records it (`checkpoint_saved`) and `resume_from()` finds it. Saved on request
    while paused, it then waits for the resume like `wait_if_paused()`.
    """
    from torchherd.engine.worker.checkpoint import write_atomic

    path = checkpoint_dir() / name
    write_atomic(path, obj)
    c = _client
    if c is None:
        return path
    stopping = c.stop_seen or (c.stop and not c.polls_stop)  # seen by the loop, or Ctrl-C caught to save
    c.saved(path, "stop" if stopping else (c.reason or "script"))
    c.reason = ""
    while c.paused and not c.stop:  # saved on request while paused: stay paused, not one step more
        c.hold(for_checkpoint=True)
        if c.checkpoint and c.paused and not c.stop:  # asked again: nothing trained since, same state
            c.checkpoint = False
            write_atomic(path, obj)
            c.saved(path, "request")
    return path


def hand_off(model: Any, epoch: int | None = None, step: int | None = None) -> int | None:
    """Copy the model's weights for the validator (pipelines with `validate`); returns the snapshot number.

    In the background mode training goes on at once; inline, this waits for the score.
    `epoch` defaults to the last one passed to `epoch_end`, `step` to the last reported.
    Pass the bare model (`ddp_model.module`), on any device.
    """
    c = _client
    if c is None:
        return None
    return c.hand_off(model, epoch, step)
