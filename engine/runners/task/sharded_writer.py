"""A sharded (`fsdp`) gang's checkpoints off the training thread, through DCP's `async_save`: every rank's shards
staged into host memory of their own, then written by a background thread over a gloo group kept for checkpoints.

At most one is in flight; rank 0 publishes it (sharded_checkpoint.py's rename) as soon as DCP has written it,
which DCP does only once every rank's shards are on disk, so a crash mid-write leaves the previous checkpoint.
"""
from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...worker import checkpoint as ckpt
from . import sharded_checkpoint as sharded

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

Landed = Callable[[Path, float, float], None]  # (path, blocked_s, write_s), once the checkpoint is in place
Failed = Callable[[ckpt.CheckpointError], None]


@dataclass
class _Flight:
    """One checkpoint being written: where, what rank 0 adds to it, and whom to tell."""

    tmp: Path
    stem: str
    extra: dict[str, Any] | None  # rank 0's trainer state, copied when the save began; None on the other ranks
    blocked_s: float  # seconds the training thread spent on it
    landed: Landed
    failed: Failed
    started: float = field(default_factory=time.monotonic)  # when the write began
    done: threading.Event = field(default_factory=threading.Event)  # set once it is published, or has failed
    error: BaseException | None = None  # what broke it, if anything but a failed write: raised at the next wait


class ShardedWriter:
    """Every rank's writer: `save` (a collective, every rank at the same step) returns once this rank's shards
    are staged; `wait` holds until the write in flight is published or has failed."""

    def __init__(self, directory: Path, lead: bool, world: int, group: ProcessGroup, pinned: bool,
                 say: Callable[[str], None]):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.directory, self.lead, self.world, self.group, self.say = directory, lead, world, group, say
        # Kept across saves: its host copies of the shards are made once and refilled (pinned, on a GPU).
        self._stager = DefaultStager(StagingOptions(use_pinned_memory=pinned, use_shared_memory=False,
                                                    use_async_staging=False, use_non_blocking_copy=False))
        self._flight: _Flight | None = None
        self._told_wait = False

    def save(self, which: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: dict[str, Any],
             landed: Landed, failed: Failed) -> None:
        """Stage checkpoint `which` ("last", "best") and have it written; rank 0 adds `extra` as it publishes."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import async_save

        flight = self._flight
        if flight is not None and not flight.done.is_set() and not self._told_wait and self.lead:
            self._told_wait = True
            self.say("a checkpoint waits for the previous one's write to finish before it is staged "
                     "(said once; checkpoints are due faster than the disk writes them)")
        self.wait()  # every rank: the one in flight is published (or failed) before the next begins
        start = time.monotonic()
        stem, tmp = sharded.begin(self.directory, which, extra["step"], self.lead)
        model_state, optim_state = get_state_dict(model, optimizer)
        try:
            started = async_save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp),
                                 process_group=self.group, async_stager=self._stager)
        except (Exception, CheckpointException) as exc:  # staging failed: nothing is in flight
            failed(sharded.write_failed(tmp, exc, self.lead))
            return
        # A Future of the write; a stager that stages in the background would make it a pair, the write second.
        future = started if isinstance(started, Future) else started.upload_completion
        flight = _Flight(tmp, stem, copy.deepcopy(extra) if self.lead else None, time.monotonic() - start,
                         landed, failed)
        self._flight = flight
        future.add_done_callback(lambda done: self._finish(flight, done))

    def _finish(self, flight: _Flight, future: Future[Any]) -> None:
        """On DCP's thread once this rank's write ended: rank 0 publishes the checkpoint, or says why it failed.

        DCP writes `.metadata` only after gathering every rank's write results (a failed one fails every rank's
        future), so rank 0's future succeeding means every shard is on disk: no collective is needed here."""
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            try:
                future.result()
            except (Exception, CheckpointException) as exc:
                flight.failed(sharded.write_failed(flight.tmp, exc, self.lead))
                return
            if flight.extra is None:  # not rank 0: its shards are in, rank 0 publishes
                return
            try:
                path = sharded.finish(flight.tmp, self.directory, flight.stem, flight.extra, self.world)
            except ckpt.CheckpointError as exc:
                flight.failed(exc)
                return
            flight.landed(path, flight.blocked_s, time.monotonic() - flight.started)
        except BaseException as exc:
            flight.error = exc
        finally:
            flight.done.set()

    def wait(self) -> None:
        """Wait for the write in flight (a next save, a stop, the end of training); raise what broke it, if
        anything but a failed write (which was said already)."""
        flight, self._flight = self._flight, None
        if flight is None:
            return
        flight.done.wait()
        if flight.error is not None:
            raise flight.error

    def close(self) -> None:
        """Finish the write in flight and give back the staging memory."""
        try:
            self.wait()
        finally:
            self._stager.close()
