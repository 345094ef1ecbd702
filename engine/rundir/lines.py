"""An event as its line of events.jsonl, encoded once by msgspec: the same bytes go to events.jsonl, to the
pipeline's metrics.jsonl and, batched, to every attached client. NaN and infinities become null (as
`directory.dumps` writes them), so every reader can parse the line.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Sequence

import msgspec

from ..protocol.messages import Message
from ..protocol.nolinks import open_fd


def _fallback(value: object) -> object:
    """What msgspec does not encode itself: paths as their text, anything else as its str()."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


TAIL_CHUNK = 64 << 10  # bytes read back at a time from a file's end, looking for its last newline


def trim_torn_line(path: os.PathLike | str) -> int:
    """Cut `path` back to just after its last newline, if it ends mid-line (a writer killed, or a disk that
    filled, mid-write): a line appended after the fragment would be glued to it and lost to every reader.
    Returns the bytes cut; a missing file is nothing to trim."""
    try:
        fd = open_fd(path, os.O_RDWR)  # never through a link planted in the run folder
    except FileNotFoundError:
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            return 0  # nothing to trim (a device such as /dev/full is never cut)
        size = end = info.st_size
        while end > 0:
            start = max(0, end - TAIL_CHUNK)
            chunk = os.pread(fd, end - start, start)
            if end == size and chunk.endswith(b"\n"):
                return 0  # whole lines: the common case, one small read
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                end = start + cut + 1
                break
            end = start
        os.ftruncate(fd, end)
        return size - end
    finally:
        os.close(fd)


_encoder = msgspec.json.Encoder(enc_hook=_fallback)
_heads: dict[type, bytes] = {}  # by class: b'{"type":"step",' (what goes before its fields)


def _head(cls: type[Message]) -> bytes:
    head = _heads.get(cls)
    if head is None:
        head = _heads[cls] = b'{"type":' + _encoder.encode(cls.type) + b","
    return head


def encode_line(msg: Message) -> bytes:
    """`msg` as one line of events.jsonl (ending in a newline): its `type` first, then its fields in order."""
    head = _heads.get(type(msg)) or _head(type(msg))
    return head + _encoder.encode(msg)[1:] + b"\n"  # after b'{': b'"time":...}', a message always has its time


def encode_lines(messages: Sequence[Message]) -> list[bytes]:
    """`encode_line` of each of `messages`, all of one class (a run of step reports), encoded in one call: JSON
    escapes a newline in a string, so the only newlines are those between the messages."""
    head = _head(type(messages[0]))
    return [head + body[1:] + b"\n" for body in _encoder.encode_lines(messages).split(b"\n")[:-1]]


class Unreadable:
    """A tally of the lines a reader of a run's files skipped, by file: not a JSON object, or a record of a known
    type whose fields are not of their types (a torn write, another tool's line, a hand edit). Said once, after
    the reading, rather than line by line; a type this version does not know is no fault of the file."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, path: os.PathLike | str, n: int = 1) -> None:
        if n:
            self.counts[os.fspath(path)] = self.counts.get(os.fspath(path), 0) + n

    def lines(self) -> list[str]:
        """One line a file that had some: 'skipped 3 unreadable lines in RUN/events.jsonl'."""
        return [f"skipped {n} unreadable line{'s' if n != 1 else ''} in {path}" for path, n in self.counts.items()]
