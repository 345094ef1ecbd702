"""Weight snapshots in shared memory: a worker writes them without waiting, the validator reads them.

Each pipeline gets `slots` buffers the size of its weights, memory-mapped files
under /dev/shm, plus a small header of int64 fields per slot. A slot is guarded
by a sequence lock: the writer makes its version odd while copying and even when
done, and a reader that sees the version change under it discards what it read,
so neither side ever waits for the other.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Header fields, one int64 each per slot.
VERSION, SEQ, EPOCH, STEP, HANDOFF_NS, CONSUMED, FIELDS = 0, 1, 2, 3, 4, 5, 8
ALIGN = 64  # bytes; each tensor starts on a cache line


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
        with open(path, "wb") as fh:
            fh.truncate(nbytes)
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
    """Worker side: copies the model's weights into a free slot and publishes it."""

    def __init__(self, directory: Path, model: torch.nn.Module, slots: int, policy: str, checksum: bool,
                 meta: dict[str, Any]):
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
            self.slots.append(buf)
        # Typed views of each slot, one per tensor, so a hand-off is a single foreach copy.
        self.views = [[buf[e.offset:e.offset + e.nbytes].view(t.dtype).view(t.shape)
                       for e, t in zip(self.entries, self.tensors)] for buf in self.slots]
        self.on_cpu = all(t.device.type == "cpu" for t in self.tensors)
        self.seq = 0
        meta = {**meta, "slots": slots, "nbytes": self.nbytes, "entries": [e.__dict__ for e in self.entries]}
        tmp = directory / ".meta.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, directory / "meta.json")  # last: the validator only looks once this exists

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
        """Copy the weights into a slot; returns what happened (for a SnapshotTaken event)."""
        start = time.perf_counter()
        self.seq += 1
        slot, _ = self._choose()
        checksum = weights_checksum(self.model.state_dict()) if self.checksum else None
        if slot is None:
            return {"seq": self.seq, "slot": -1, "stall_ms": (time.perf_counter() - start) * 1e3,
                    "nbytes": self.nbytes, "checksum": checksum, "dropped": True}
        h = self.header[slot]
        h[VERSION] += 1  # odd: a reader that started now will see the change and retry
        with torch.no_grad():
            if self.on_cpu:
                torch._foreach_copy_(self.views[slot], self.tensors)
            else:  # a device-to-host copy per tensor
                for view, t in zip(self.views[slot], self.tensors):
                    view.copy_(t)
        h[SEQ], h[EPOCH], h[STEP], h[HANDOFF_NS] = self.seq, epoch, step, time.time_ns()
        h[VERSION] += 1  # even: published
        return {"seq": self.seq, "slot": slot, "stall_ms": (time.perf_counter() - start) * 1e3,
                "nbytes": self.nbytes, "checksum": checksum, "dropped": False}


@dataclass(frozen=True)
class Loaded:
    """A snapshot copied out of shared memory into a model."""

    seq: int
    epoch: int
    step: int
    handoff: float  # seconds since the epoch


class SnapshotReader:
    """Validator side: finds the newest published snapshot of one pipeline and loads it into a model."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.meta = json.loads((directory / "meta.json").read_text())
        slots = self.meta["slots"]
        self.entries = [Entry(**e) for e in self.meta["entries"]]
        header = _map(directory / "header", slots * FIELDS, torch.int64, create=False)[0].view(slots, FIELDS)
        self.header = header.numpy()
        self._keep = header
        self.slots = [_map(directory / f"slot-{i}", self.meta["nbytes"], torch.uint8, create=False)[0]
                      for i in range(slots)]

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
        """Copy `slot` into `model`; None if the writer overwrote it meanwhile (try the newest again)."""
        h = self.header[slot]
        before = int(h[VERSION])
        if before % 2:
            return None
        seq, epoch, step, handoff = int(h[SEQ]), int(h[EPOCH]), int(h[STEP]), int(h[HANDOFF_NS])
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
