"""Checkpoints off the training thread: a state dict staged into memory training does not touch, then
written, fsynced and renamed (worker/checkpoint.py) by a background thread.

`CheckpointWriter.save` returns once the staging copy is done (on CUDA, once it is queued: the writer waits
for its event); at most one write is in flight, and a save that finds one waits for it first.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt
from .copy_engine import HOST, Copy, CopyEngine, HostCopy, copy_mode
from .publisher import Flight, Publisher
from .snapshot import engine_for, layout


class _Tensor:
    """Where a tensor stood in a state dict, by its index in the list of staged tensors."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def split(state: Any, tensors: list[torch.Tensor]) -> Any:
    """`state` with every dense tensor replaced by a `_Tensor` (appended to `tensors`), everything else copied,
    so nothing the training thread changes later reaches the file."""
    if isinstance(state, torch.Tensor):
        if state.layout != torch.strided:
            return state.detach().clone()
        tensors.append(state.detach())
        return _Tensor(len(tensors) - 1)
    if isinstance(state, dict):
        return _like(state, {k: split(v, tensors) for k, v in state.items()})
    if isinstance(state, (list, tuple)) and type(state) in (list, tuple):
        return type(state)(split(v, tensors) for v in state)
    try:
        return copy.deepcopy(state)
    except Exception:  # something that will not copy: saved as it is when the write runs
        return state


def _like(original: dict[Any, Any], items: dict[Any, Any]) -> dict[Any, Any]:
    """`items` as a dict of `original`'s type, with its `_metadata` (a module's state dict: the versions
    load_state_dict reads)."""
    if type(original) is dict:
        return items
    try:
        out = type(original)(items)
    except Exception:
        return items
    if hasattr(original, "_metadata"):
        out._metadata = copy.deepcopy(original._metadata)  # type: ignore[attr-defined]
    return out


def join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The state dict `split` took apart, with `tensors` in the places of its tensors."""
    if isinstance(skeleton, _Tensor):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return _like(skeleton, {k: join(v, tensors) for k, v in skeleton.items()})
    if isinstance(skeleton, (list, tuple)) and type(skeleton) in (list, tuple):
        return type(skeleton)(join(v, tensors) for v in skeleton)
    return skeleton


class _Group:
    """The staging memory of the tensors that live on one device, and the engine that copies them there."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.mode = copy_mode([tensors[0].device], staging=True)
        if self.mode == HOST:
            self.staged = [torch.empty_like(t, device="cpu") for t in tensors]
            self.engine: CopyEngine = HostCopy(tensors, [self.staged])
            self.flat = False
            return
        # One buffer on the host (page-locked by the CUDA engine) with a typed view per tensor, as a snapshot slot.
        entries, size = layout({str(i): t for i, t in enumerate(tensors)})
        buf = torch.empty(size, dtype=torch.uint8)
        self.staged = [buf[e.offset:e.offset + e.nbytes].view(t.dtype).view(t.shape)
                       for e, t in zip(entries, tensors)]
        self.engine = engine_for(tensors, [buf], [self.staged], staging=True)
        self.flat = True  # views of one buffer: each is cloned out before torch.save, which would write it all


@dataclass
class Write:
    """One checkpoint being written: what to write and where, and when it was staged."""

    name: str
    skeleton: Any
    staged: list[torch.Tensor]
    flat: list[bool]
    blocked_s: float  # seconds the training thread spent on it: waiting for the write before it, and staging
    landed: Callable[[Path, float, float], None]  # (path, blocked_s, write_s), once the file is in place
    failed: Callable[[ckpt.CheckpointError], None]
    flight: Flight | None = None
    error: BaseException | None = field(default=None)


class CheckpointWriter:
    """Stages checkpoints on the training thread and writes them on a background thread, one at a time."""

    def __init__(self, directory: Path, keep: int, say: Callable[[str], None]):
        self.directory, self.keep, self.say = directory, keep, say
        self._publisher = Publisher("torchherd-checkpoint-writer")
        self._groups: list[tuple[list[int], _Group]] = []
        self._signature: tuple[Any, ...] = ()
        self._current: Write | None = None
        self._told_wait = False
        self._step = -1  # the step of the checkpoint staged last

    def save(self, state: dict[str, Any], name: str, landed: Callable[[Path, float, float], None],
             failed: Callable[[ckpt.CheckpointError], None], step: int = -1) -> None:
        """Stage `state` (of optimizer step `step`) and have it written as `name`; returns once training may
        change its tensors again."""
        busy = self._current is not None and self._current.flight is not None and \
            not self._current.flight.landed.is_set()
        if busy and step != self._step and not self._told_wait:  # (one step's epoch and best come back to back)
            self._told_wait = True
            self.say("a checkpoint waits for the previous one's write to finish before it is staged "
                     "(said once; checkpoints are due faster than the disk writes them)")
        self._step = step
        start = time.monotonic()
        self.wait()  # at most one write in flight
        tensors: list[torch.Tensor] = []
        skeleton = split(state, tensors)
        self._prepare(tensors)
        staged: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
        flat = [False] * len(tensors)
        copies: list[Copy] = []
        for indices, group in self._groups:
            copies.append(group.engine.start(0))
            for i, t in zip(indices, group.staged):
                staged[i], flat[i] = t, group.flat
        write = Write(name, skeleton, staged, flat, time.monotonic() - start, landed, failed)
        write.flight = Flight(_AllOf(copies), lambda: self._write(write), lambda: self._abandon(write))
        self._current = write
        self._publisher.submit(write.flight)

    def _prepare(self, tensors: list[torch.Tensor]) -> None:
        """Staging memory for `tensors`, kept from the last save while their shapes, types and devices match."""
        signature = tuple((t.shape, t.dtype, t.device) for t in tensors)
        if signature == self._signature:
            for indices, group in self._groups:
                group.engine.tensors = [tensors[i] for i in indices]  # type: ignore[attr-defined]
            return
        self._close_groups()
        by_device: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        for indices in by_device.values():
            group = _Group([tensors[i] for i in indices])
            for notice in group.engine.notices:
                self.say(notice)
            self._groups.append((indices, group))
        self._signature = signature

    def _write(self, write: Write) -> None:
        start = time.monotonic()
        tensors = [t.clone() if flat else t for t, flat in zip(write.staged, write.flat)]
        path = ckpt.save_checkpoint(self.directory, join(write.skeleton, tensors), write.name, self.keep)
        write.landed(path, write.blocked_s, time.monotonic() - start)

    def _abandon(self, write: Write) -> None:
        assert write.flight is not None
        error = write.flight.error
        if isinstance(error, ckpt.CheckpointError):  # the previous checkpoint is still there; training goes on
            write.failed(error)
        else:
            write.error = error  # raised on the training thread, at its next save or at the end

    def wait(self) -> None:
        """Wait for the write in flight (a stop, a pause, the end of training); raise what broke it, if
        anything but a failed write (which was said already)."""
        write = self._current
        if write is None:
            return
        self._publisher.drain()
        self._current = None
        if write.error is not None:
            raise write.error

    def _close_groups(self) -> None:
        for _, group in self._groups:
            group.engine.close()
        self._groups = []
        self._signature = ()

    def close(self) -> None:
        """Finish the write in flight, end the thread and give back the staging memory."""
        try:
            self.wait()
        finally:
            self._publisher.stop()
            self._close_groups()


class _AllOf:
    """The copies of every device's group: landed when each has."""

    def __init__(self, copies: list[Copy]):
        self.copies = copies

    def done(self) -> bool:
        return all(c.done() for c in self.copies)

    def wait(self) -> None:
        for c in self.copies:
            if not c.done():
                c.wait()
