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

from torchherd.client_env import ENV_CHECKPOINT_DIR, ENV_FD, ENV_SNAPSHOT, FLUSH_INTERVAL  # noqa: F401

TYPE_CHECKING = False  # typing and pathlib are not loaded for annotations alone
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any

    import torch

    from torchherd.client_socket import Client, Scalar

__all__ = ["Validation", "checkpoint_dir", "checkpoint_requested", "epoch_end", "flush", "hand_off", "heartbeat",
           "report", "resume_from", "save", "should_stop", "supervised", "wait_if_paused"]

BEST = "best.pt"  # written by torchherd's validator into the same folder; never a resume point


class Validation:
    """What a `validate = "val.py:build"` factory returns: the model to load hand-offs into and its data.

    `val_data` is a Dataset (batched by the pipeline's batch_size) or any iterable of
    `(inputs, targets)` batches; `loss_fn(model(inputs), targets)` gives `val_loss`, and
    `metrics_fn(outputs, targets)`, if given, a dict of extra metrics averaged per sample.
    A plain class, not a dataclass: importing `dataclasses` would cost every script that imports this.
    """

    def __init__(self, model: torch.nn.Module, val_data: object, loss_fn: Callable[[Any, Any], Any],
                 metrics_fn: Callable[[Any, Any], dict[str, Any]] | None = None):
        self.model = model  # torch.nn.Module with the same parameters, in the same order, as the one handed off
        self.val_data = val_data
        self.loss_fn = loss_fn
        self.metrics_fn = metrics_fn

    def __repr__(self) -> str:
        return (f"Validation(model={self.model!r}, val_data={self.val_data!r}, loss_fn={self.loss_fn!r}, "
                f"metrics_fn={self.metrics_fn!r})")


def _connect() -> Client | None:
    fd = os.environ.pop(ENV_FD, None)  # popped: processes the script starts are not us
    snapshot = os.environ.pop(ENV_SNAPSHOT, None)
    if fd is None:
        return None
    from torchherd import client_frames as wire
    from torchherd.client_socket import Client

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


def report(step: int | None = None, loss: Scalar | None = None, *, epoch: int | None = None,
           samples: Scalar | None = None, **metrics: Scalar) -> None:
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


def epoch_end(epoch: int, loss: Scalar | None = None) -> None:
    """An epoch finished: `epoch` counts from 0, as `for epoch in range(n)` does; `loss` is its mean."""
    c = _client
    if c is None:
        return
    from torchherd import client_frames as wire  # loaded already: the client is live
    from torchherd.client_socket import number

    value = None if loss is None else number(loss)

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
        from torchherd import client_frames as wire  # loaded already: the client is live

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
    from pathlib import Path

    path = Path(os.environ.get(ENV_CHECKPOINT_DIR, "checkpoints"))
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
        from torchherd import client_frames as wire  # loaded already: the client is live

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


def hand_off(model: torch.nn.Module, epoch: int | None = None, step: int | None = None) -> int | None:
    """Copy the model's weights for the validator (pipelines with `validate`); returns the snapshot number.

    In the background mode training goes on at once; inline, this waits for the score.
    `epoch` defaults to the last one passed to `epoch_end`, `step` to the last reported.
    Pass the bare model (`ddp_model.module`), on any device.
    """
    c = _client
    if c is None:
        return None
    return c.hand_off(model, epoch, step)
