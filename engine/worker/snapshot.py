"""Weight snapshots in shared memory: a worker writes them without waiting, the validator reads them.

Each pipeline gets `slots` buffers the size of its weights, memory-mapped files
under /dev/shm, plus a small header of int64 fields per slot. A slot is guarded
by a sequence lock: the writer makes its version odd while copying and even when
done, and a reader that sees the version change under it discards what it read,
so neither side ever waits for the other. On a GPU the copy runs on after `hand_off` returns
(worker/cuda_copy.py) and the slot is published once it has landed (worker/publisher.py).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from .copy_engine import BLOCKING, HOST, STAGED, BlockingDeviceCopy, CopyEngine, HostCopy, copy_mode
from .publisher import Flight, Publisher


class Weights(Protocol):
    """What a snapshot copies: a module, or anything else whose state_dict() holds its weights (a sharded
    model's gathered full weights)."""

    def state_dict(self) -> dict[str, Any]: ...


# Header fields, one int64 each per slot.
VERSION, SEQ, EPOCH, STEP, HANDOFF_NS, CONSUMED, FIELDS = 0, 1, 2, 3, 4, 5, 8
ALIGN = 64  # bytes; each tensor starts on a cache line
SLOTS_UNREAD = "all {slots} slots hold snapshots the validator has not read (policy 'all')"
IN_FLIGHT = "the previous snapshot's copy off the GPU is still running"


def engine_for(tensors: list[torch.Tensor], slots: list[torch.Tensor], views: list[list[torch.Tensor]],
               staging: bool) -> CopyEngine:
    """The engine for these weights; `slots` are the flat byte buffers, `views` their typed per-tensor views."""
    mode = copy_mode([t.device for t in tensors], staging)
    if mode == HOST:
        return HostCopy(tensors, views)
    if mode == BLOCKING:
        return BlockingDeviceCopy(tensors, views)
    from .cuda_copy import CudaCopy

    return CudaCopy(tensors, slots, views, staging=mode == STAGED)


@dataclass(frozen=True)
class Entry:
    name: str
    offset: int  # bytes
    nbytes: int


def layout(state: dict[str, torch.Tensor]) -> tuple[list[Entry], int]:
    """Where each tensor of a state dict goes in a slot, and the slot's size in bytes."""
    entries, offset = [], 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        entries.append(Entry(name, offset, n))
        offset += (n + ALIGN - 1) // ALIGN * ALIGN
    return entries, max(offset, ALIGN)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _map(path: Path, count: int, dtype: torch.dtype, create: bool) -> tuple[torch.Tensor, bool]:
    """A shared mapping of `path` as `count` values; (tensor, whether the file was made anew).

    With `create`, a file of the right size is kept as it is: a restarted worker must not
    wipe the snapshots its previous attempt handed off before the validator read them.
    """
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    fresh = False
    if create and not (path.exists() and path.stat().st_size == nbytes):
        # A new file in its place, not this one cut to size: a validator still mapping the old one (an earlier
        # attempt's weights of another layout) must not fault on pages the cut took away.
        tmp = path.with_name(f".{path.name}.new")
        with open(tmp, "wb") as fh:
            fh.truncate(nbytes)
        os.replace(tmp, path)
        fresh = True
    return torch.from_file(str(path), shared=True, size=count, dtype=dtype), fresh


def weights_checksum(state: dict[str, torch.Tensor]) -> float:
    """A float64 sum of every floating-point weight: equal weights give equal sums."""
    total = 0.0
    for t in state.values():
        if t.is_floating_point():
            total += float(t.detach().double().sum())
    return total


class SnapshotWriter:
    """Worker side: copies the model's weights into a free slot and publishes it.

    One copy at a time: a hand-off while the previous copy is still in flight is dropped (its `reason`
    says so). `staging` lets a CUDA copy go through a device buffer (worker/cuda_copy.py); `make_engine`
    replaces `engine_for` (tests drive the writer with a scripted engine).
    """

    def __init__(self, directory: Path, model: Weights, slots: int, policy: str, checksum: bool,
                 meta: dict[str, Any], staging: bool = True,
                 make_engine: Callable[[list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]]],
                                       CopyEngine] | None = None):
        self.dir = directory
        self.model = model
        self.policy = policy
        self.checksum = checksum
        state = model.state_dict()
        self.entries, self.nbytes = layout(state)
        # Optimizers update parameters in place, so these stay the live weights; a
        # state_dict() per hand-off would cost more than copying a small model.
        self.tensors = list(state.values())
        # The run's snapshot root was made private (0700) by claim_root before any worker started; this
        # pipeline's folder goes inside it, and a restarted worker finds its predecessor's folder there.
        directory.mkdir(mode=0o700, exist_ok=True)
        header, fresh = _map(directory / "header", slots * FIELDS, torch.int64, create=True)
        header = header.view(slots, FIELDS)
        self.header = header.numpy()  # numpy stores into shared memory cost ~100 ns; torch indexing, microseconds
        self._keep = header  # the mapping lives as long as this tensor does
        self.slots = []
        for i in range(slots):
            buf, new_slot = _map(directory / f"slot-{i}", self.nbytes, torch.uint8, create=True)
            if new_slot or fresh:
                buf.fill_(0)  # touch every page now, not during the first hand-off to this slot
                self.header[i, :] = 0
            elif self.header[i, VERSION] % 2:  # a predecessor died mid-copy: the slot's bytes are torn
                self._abandon(i)
            self.slots.append(buf)
        # Typed views of each slot, one per tensor, so a hand-off is a single foreach copy.
        self.views = [[buf[e.offset:e.offset + e.nbytes].view(t.dtype).view(t.shape)
                       for e, t in zip(self.entries, self.tensors)] for buf in self.slots]
        self.engine: CopyEngine = (make_engine or partial(engine_for, staging=staging))(
            self.tensors, self.slots, self.views)
        self.notices = list(self.engine.notices)  # for the user, once (HandOff sends them)
        self._publisher = Publisher()
        self._flight: Flight | None = None  # the copy still running, if any: never two at once
        self._closed = False
        self.seq = 0
        meta = {**meta, "slots": slots, "nbytes": self.nbytes, "entries": [e.__dict__ for e in self.entries],
                "copy": self.engine.name, "staging_bytes": self.engine.staging_bytes}
        tmp = directory / ".meta.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, directory / "meta.json")  # last: the validator only looks once this exists

    def opening_notices(self) -> list[tuple[str, str]]:
        """(level, text) a person should read once about this writer: its staging memory, what its engine could
        not do."""
        notes = [("warning", text) for text in self.notices]
        if self.engine.staging_bytes:
            notes.insert(0, ("info", f"snapshot hand-off: {self.engine.staging_bytes / 2**20:.1f} MiB staging "
                                     f"buffer on {self.tensors[0].device} (validation.handoff_staging = false gives "
                                     "it back; training then waits longer per hand-off)"))
        return notes

    def _choose(self) -> tuple[int | None, int]:
        """(slot to write, seq of the unread snapshot it overwrites or 0); slot None: drop (policy 'all')."""
        h = self.header.tolist()
        free = [i for i, row in enumerate(h) if row[SEQ] == 0 or row[CONSUMED] >= row[SEQ]]
        if free:
            return min(free, key=lambda i: h[i][SEQ]), 0
        if self.policy == "all":
            return None, 0
        newest = max(range(len(h)), key=lambda i: h[i][SEQ])
        oldest = min((i for i in range(len(h)) if i != newest), key=lambda i: h[i][SEQ])
        return oldest, h[oldest][SEQ]

    def hand_off(self, epoch: int, step: int) -> dict[str, Any]:
        """Copy the weights into a slot; returns what happened (for a SnapshotTaken event).

        Where the copy is still running when this returns (on a GPU), the slot is published once it lands.
        """
        start = time.perf_counter()
        self.seq += 1
        busy = self._flight is not None and self.in_flight()
        slot = None if busy else self._choose()[0]
        checksum = weights_checksum(self.model.state_dict()) if self.checksum else None
        if slot is None:
            reason = IN_FLIGHT if busy else SLOTS_UNREAD.format(slots=len(self.slots))
            return {"seq": self.seq, "slot": -1, "stall_ms": (time.perf_counter() - start) * 1e3,
                    "nbytes": self.nbytes, "checksum": checksum, "dropped": True, "reason": reason}
        h = self.header[slot]
        h[VERSION] += 1  # odd: a reader that started now will see the change and retry
        try:
            with torch.no_grad():
                copy = self.engine.start(slot)
        except BaseException:
            self._abandon(slot)
            raise
        if copy.done():
            self._publish(slot, self.seq, epoch, step)
        else:
            self._flight = Flight(copy, partial(self._publish, slot, self.seq, epoch, step),
                                  partial(self._abandon, slot))
            self._publisher.submit(self._flight)
        return {"seq": self.seq, "slot": slot, "stall_ms": (time.perf_counter() - start) * 1e3,
                "nbytes": self.nbytes, "checksum": checksum, "dropped": False, "reason": ""}

    def _publish(self, slot: int, seq: int, epoch: int, step: int) -> None:
        h = self.header[slot]
        h[SEQ], h[EPOCH], h[STEP], h[HANDOFF_NS] = seq, epoch, step, time.time_ns()
        h[VERSION] += 1  # even: published

    def _abandon(self, slot: int) -> None:
        """The copy into `slot` failed: the slot is free, and no reader takes its torn bytes (seq 0)."""
        h = self.header[slot]
        h[SEQ] = 0
        h[VERSION] += 1

    def in_flight(self) -> bool:
        """Whether a copy is still running (never blocks); raises what the last one failed with, once."""
        flight = self._flight
        if flight is None:
            return False
        if not flight.landed.is_set():
            return True
        self._flight = None
        if flight.error is not None:
            raise RuntimeError(f"copying snapshot to shared memory failed: {flight.error}") from flight.error
        return False

    def wait_for_slot(self, timeout: float, alive: Callable[[], object] | None = None) -> bool:
        """Wait, up to `timeout` seconds, until no copy is in flight and a slot is free to write (under policy
        'all' a hand-off is dropped otherwise); `alive` is called while waiting (a heartbeat). False: none freed.
        Polled: the validator frees a slot by reading it, in another process, and says nothing."""
        end = time.monotonic() + timeout
        while self.in_flight() or self._choose()[0] is None:
            if time.monotonic() >= end:
                return False
            if alive is not None:
                alive()
            time.sleep(0.05)
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the copy in flight, if any, is published; False if `timeout` (seconds) ran out first."""
        flight = self._flight
        return flight is None or flight.landed.wait(timeout)

    def close(self) -> None:
        """Publish the copy in flight (waiting for it), end the publisher, give back pinned pages and staging."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._publisher.stop()
        self.engine.close()


@dataclass(frozen=True)
class Loaded:
    """A snapshot copied out of shared memory into a model."""

    seq: int
    epoch: int
    step: int
    handoff: float  # seconds since the epoch


class SnapshotMismatch(ValueError):
    """A snapshot's weights are not the model's shape (names or sizes differ): loading them would score other
    weights than those it names."""

    def __init__(self, text: str, seq: int, epoch: int, step: int):
        super().__init__(text)
        self.seq, self.epoch, self.step = seq, epoch, step


def _identity(path: Path) -> tuple[int, int]:
    """What tells one meta.json from the next a later writer puts in its place (os.replace: a new inode)."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


class SnapshotReader:
    """Validator side: finds the newest published snapshot of one pipeline and loads it into a model."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.opened = _identity(directory / "meta.json")  # read before the meta: a newer one reads as a change
        self.meta = json.loads((directory / "meta.json").read_text())
        slots = self.meta["slots"]
        self.entries = [Entry(**e) for e in self.meta["entries"]]
        header = _map(directory / "header", slots * FIELDS, torch.int64, create=False)[0].view(slots, FIELDS)
        self.header = header.numpy()
        self._keep = header
        self.slots = [_map(directory / f"slot-{i}", self.meta["nbytes"], torch.uint8, create=False)[0]
                      for i in range(slots)]

    def current(self) -> bool:
        """Whether the folder is still the one this reader opened: a later attempt's writer replaces meta.json
        (its weights may have another layout, its pipeline other values), and its snapshots are read anew."""
        try:
            return _identity(self.dir / "meta.json") == self.opened
        except FileNotFoundError:
            return False

    def _fits(self, model: torch.nn.Module) -> str:
        """"" when the snapshots' layout is `model`'s state dict, tensor by tensor; else what differs."""
        state = model.state_dict()
        if len(state) != len(self.entries):
            return f"{len(self.entries)} tensors in the snapshot, {len(state)} in the model"
        for entry, (name, t) in zip(self.entries, state.items()):
            if entry.name != name or entry.nbytes != t.numel() * t.element_size():
                return f"{entry.name} ({entry.nbytes} bytes) in the snapshot, {name} {tuple(t.shape)} in the model"
        return ""

    def newest(self, after: int = 0, oldest: bool = False) -> tuple[int, int] | None:
        """(slot, seq) of the newest (or, with `oldest`, the oldest) published snapshot with seq > `after`."""
        best = None
        for i, row in enumerate(self.header.tolist()):
            if row[VERSION] % 2 or row[SEQ] <= after:
                continue
            if best is None or (row[SEQ] < best[1] if oldest else row[SEQ] > best[1]):
                best = (i, row[SEQ])
        return best

    def load_into(self, model: torch.nn.Module, slot: int) -> Loaded | None:
        """Copy `slot` into `model`; None if the writer overwrote it meanwhile (try the newest again). Raises
        SnapshotMismatch when the weights are not the model's shape (nothing is copied)."""
        h = self.header[slot]
        before = int(h[VERSION])
        if before % 2:
            return None
        seq, epoch, step, handoff = int(h[SEQ]), int(h[EPOCH]), int(h[STEP]), int(h[HANDOFF_NS])
        unfit = self._fits(model)
        if unfit:
            raise SnapshotMismatch(f"the snapshot's weights do not fit the validator's model: {unfit}", seq, epoch,
                                   step)
        buf = self.slots[slot]
        with torch.no_grad():
            for entry, t in zip(self.entries, model.state_dict().values()):
                src = buf[entry.offset:entry.offset + entry.nbytes]
                if t.device.type == "cpu" and t.is_contiguous():
                    _as_bytes(t).copy_(src)
                else:
                    t.copy_(src.clone().view(t.dtype).view(t.shape))
        if int(h[VERSION]) != before:
            return None
        h[CONSUMED] = seq
        return Loaded(seq, epoch, step, handoff / 1e9)
