"""TensorBoard event files written directly: the `Event` protocol buffer of a step's scalars encoded by hand and
framed as a TFRecord (length, masked CRC-32C), so the supervisor writes a step's figures for a few microseconds
and never imports tensorboardX (which imports torch: seconds of CPU and hundreds of MiB) to do it.
"""
from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from crc32c import crc32c

from ..protocol.nolinks import open_file

_FILES = itertools.count()  # a file name of its own for each file this process opens
_DOUBLE, _FLOAT, _LENGTH, _CRC = struct.Struct("<d"), struct.Struct("<f"), struct.Struct("<Q"), struct.Struct("<I")
_MASK = 0xFFFFFFFF


_SMALL = [bytes((n,)) for n in range(0x80)]  # a varint under 128 is its one byte


def _varint(n: int) -> bytes:
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= 0xFFFFFFFFFFFFFFFF  # an int64 below zero is its two's complement, ten bytes long
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(key: int, data: bytes) -> bytes:
    """A length-delimited field (`key` is its number << 3 | 2)."""
    return _SMALL[key] + _varint(len(data)) + data


def masked_crc(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated and offset so that a CRC of CRCs is not itself one."""
    x = crc32c(data)
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & _MASK


def event_bytes(wall: float, step: int, summary: bytes = b"", file_version: str = "") -> bytes:
    """An `Event` (tensorflow/core/util/event.proto): wall_time = 1, step = 2, file_version = 3, summary = 5."""
    out = b"\x09" + _DOUBLE.pack(wall) + b"\x10" + _varint(step)
    if file_version:
        out += _field(0x1A, file_version.encode())
    return out + _field(0x2A, summary) if summary else out


_heads: dict[str, bytes] = {}  # by tag: a Summary.Value field up to its float (the same few tags every step)


def scalars_summary(values: Iterable[tuple[str, float]]) -> bytes:
    """A `Summary` of `Summary.Value`s each with tag = 1 and simple_value = 2 (a 32-bit float, as TensorBoard's)."""
    out = []
    for tag, value in values:
        head = _heads.get(tag)
        if head is None:
            field = _field(0x0A, tag.encode()) + b"\x15"
            head = _heads[tag] = _SMALL[0x0A] + _varint(len(field) + 4) + field
        out.append(head + _FLOAT.pack(value))
    return b"".join(out)


_lengths: dict[int, bytes] = {}  # by size: a record's length and the length's CRC


class ProtoMessage(Protocol):
    """A protobuf message (tensorboardX's `Summary`): what an event file needs of it."""

    def SerializeToString(self) -> bytes: ...


class EventFile:
    """One pipeline's event file, named as TensorBoard expects (events.out.tfevents.TIME.HOST...). Written through a
    buffer: `flush` hands it to the OS, where TensorBoard reads it."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        self.path = folder / name
        self._fh = open_file(self.path, "wb", buffering=1 << 16)  # bytes: a few hundred steps per write
        self._flushed = time.monotonic()
        self.record(event_bytes(time.time(), 0, file_version="brain.Event:2"))

    def record(self, data: bytes) -> None:
        """Append one record: its length, that length's CRC, the bytes, their CRC."""
        size = len(data)
        head = _lengths.get(size)
        if head is None:
            head = _LENGTH.pack(size)
            head += _CRC.pack(masked_crc(head))
            if size < 4096:  # a step's scalars take a few sizes, over and over
                _lengths[size] = head
        self._fh.write(head + data + _CRC.pack(masked_crc(data)))

    def scalars(self, values: list[tuple[str, float]], step: int, wall: float) -> None:
        if values:
            self.record(event_bytes(wall, step, scalars_summary(values)))

    def summary(self, summary: ProtoMessage, step: int, wall: float) -> None:
        """A tensorboardX `Summary` message (the HParams plugin's) as one event."""
        self.record(event_bytes(wall, step, summary.SerializeToString()))

    def due(self, every: float) -> bool:
        """Whether `every` seconds have passed since the last flush."""
        return time.monotonic() - self._flushed > every

    def flush(self) -> None:
        self._fh.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self._fh.close()
