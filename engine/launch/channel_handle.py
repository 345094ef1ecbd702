"""`ChannelHandle`: the part of a handle that hears a child over a framed status channel and commands it over
a control one, shared by local processes (two pipes) and Ray actors (one dial-back socket).

Reading happens on the event loop and never blocks: a child frozen half-way through
writing a batch must not freeze the supervisor. `pause_reading`/`resume_reading` stop and
start it (a child whose channel is not read fills it and then waits, or drops reports).
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from multiprocessing.connection import Connection

from ..protocol.channel import ChannelError, decode_batch, encode_command
from ..protocol.messages import Command, Event, Notice
from .backend import Handle

READ_CHUNK = 1 << 16  # bytes read from the channel at a time
MAX_BATCH = 256 << 20  # bytes: a batch longer than this is a broken or hostile peer, not a worker's events


class StatusFrameReader:
    """Splits a byte stream into the messages `Connection.send_bytes` framed (a length, then the bytes)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The whole messages read so far; ChannelError for a length no worker sends (the stream is lost)."""
        self._buf += data
        out: list[bytes] = []
        while True:
            if len(self._buf) < 4:
                return out
            size = int.from_bytes(self._buf[:4], "big", signed=True)
            start = 4
            if size == -1:  # over 2 GiB: an 8-byte length follows
                if len(self._buf) < 12:
                    return out
                size, start = int.from_bytes(self._buf[4:12], "big"), 12
            if not 0 <= size <= MAX_BATCH:
                raise ChannelError(f"a batch of {size} bytes (at most {MAX_BATCH})")
            if len(self._buf) < start + size:
                return out
            out.append(bytes(self._buf[start:start + size]))
            del self._buf[:start + size]

    @property
    def held(self) -> bytes:
        """The start of a message read but not yet whole."""
        return bytes(self._buf)


class _Lost(StatusFrameReader):
    """A channel whose framing was lost: whatever follows is never read."""

    def feed(self, data: bytes) -> list[bytes]:
        return []


def _unreadable(exc: ChannelError, then: str) -> Notice:
    """What the run is told of bytes on a worker's channel that are not its events."""
    return Notice(level="error", text=f"a worker sent what is not a batch of its events ({str(exc)[:200]}); {then}")


class ChannelHandle(Handle):
    """A handle whose child's events arrive framed on a status connection and whose commands go down a
    control connection.

    The channel may open after the launch (a remote child dials back): until `open_channel`, commands
    wait here as they would in a pipe, and there is nothing to read.
    """

    def __init__(self, status: Connection | None = None, control: Connection | None = None):
        self._status: Connection | None = None
        self._control: Connection | None = None
        self._frames = StatusFrameReader()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_events: Callable[[list[Event]], None] | None = None
        self._reading = False
        self._queued: list[Command] = []  # sent before the channel opened
        self._closed = False
        if status is not None and control is not None:
            self.open_channel(status, control)

    def open_channel(self, status: Connection, control: Connection) -> None:
        """The child's channel is there: read it from now on (once attached) and deliver what waited."""
        self._status, self._control = status, control
        # Non-blocking: a worker frozen half-way through writing a batch must not freeze the loop.
        os.set_blocking(status.fileno(), False)
        if self._on_events is not None:
            self.resume_reading()
        queued, self._queued = self._queued, []
        for command in queued:
            self.send(command)

    @property
    def status_fd(self) -> int:
        """The file descriptor the child's events arrive on (for tests that look at what is unread)."""
        assert self._status is not None, "the child's channel is not open yet"
        return self._status.fileno()

    @property
    def status_held(self) -> bytes:
        """What was read of the channel's next batch, not yet whole (tests: where the unread bytes begin)."""
        return self._frames.held

    def send(self, command: Command) -> bool:
        if self._closed:
            return False
        if self._control is None:
            self._queued.append(command)
            return True
        try:
            self._control.send_bytes(encode_command(command))
            return True
        except (OSError, ValueError):
            return False

    def attach(self, on_events: Callable[[list[Event]], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_events = on_events
        if self._status is not None:
            self.resume_reading()

    def pause_reading(self) -> None:
        """Stop reading the child's channel: what it sends waits there (bounded by the channel's size)."""
        if self._reading and self._loop is not None and self._status is not None:
            self._loop.remove_reader(self._status.fileno())
            self._reading = False

    def resume_reading(self) -> None:
        """Read the child's channel on the event loop again (after `attach`)."""
        if self._loop is not None and self._status is not None:
            self._loop.add_reader(self._status.fileno(), self._readable)
            self._reading = True

    def read_waiting(self) -> None:
        if self._reading:  # not while reading is paused: what waits stays there
            self._readable()

    def _readable(self) -> None:
        batches, eof = self._read_available()
        if eof:
            self.pause_reading()  # the worker closed its end; its exit is seen by poll()
        if self._on_events is not None:
            for events in batches:
                self._on_events(events)

    def _read_available(self) -> tuple[list[list[Event]], bool]:
        """Every whole batch readable now, and whether the worker closed its end."""
        assert self._status is not None
        fd = self._status.fileno()
        chunks = []
        eof = False
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            if len(chunk) < READ_CHUNK:
                break
        try:
            payloads = self._frames.feed(b"".join(chunks))
        except ChannelError as exc:  # framing is lost: nothing after this can be read
            self._frames = _Lost()
            return [[_unreadable(exc, "nothing more is read from it")]], True
        batches = []
        for payload in payloads:
            try:
                batches.append(decode_batch(payload))
            except ChannelError as exc:  # one bad batch: the rest of the stream is still framed
                batches.append([_unreadable(exc, "left out")])
        return batches, eof

    def drain(self) -> list[Event]:
        events: list[Event] = []
        if self._status is None or self._status.closed:
            return events
        while True:
            batches, eof = self._read_available()
            for batch in batches:
                events += batch
            if eof or not batches:
                return events

    def close_channel(self) -> None:
        """Stop reading and close both ends; commands sent from now on are not heard."""
        self._closed = True
        self.pause_reading()
        for conn in (self._status, self._control):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
