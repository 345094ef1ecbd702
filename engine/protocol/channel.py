"""The pipes between the supervisor and a worker: batched status events up, commands down.

On another machine the same framing runs over one TCP connection the child dials
back to the supervisor (`dial_back`), opened with its attempt's token.

`StatusSender` never blocks the training thread: events queue locally and a
background thread ships them in batches; step reports beyond a bound are dropped
and counted, everything else is always delivered. A batch is a msgpack list in which
each run of step reports, the bulk of it, is one packed msgpack array, and any other
event is its record (`protocol/records.py`); commands go down as records too. Nothing
on a channel is pickled: on a cluster it crosses the network, and whatever reads it
builds only messages of known types with fields of their declared types (ChannelError
otherwise). Exit codes a worker uses to say how it ended live here too, since they are
part of the same protocol.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections import deque
from enum import IntEnum
from multiprocessing.connection import Connection
from typing import Any, Protocol, TypeVar

import msgspec

from .messages import Command, Event, Message, StepMetrics
from .records import RecordError, message_types, to_record, typed

M = TypeVar("M", bound=Message)



class WorkerExit(IntEnum):
    """A worker process's exit status, as the supervisor reads it (a command's own exit status is tui/headless.py's)."""

    COMPLETED = 0
    ERROR = 1  # an exception in training: the restart policy applies
    STOPPED = 10  # stopped on request (or early-stopped) after a checkpoint
    FATAL = 11  # an error a restart cannot fix (bad task, NaN with nan_policy=stop)
    RESTART = 12  # asks to be restarted from the last checkpoint (nan_policy=restart)
    ORPHANED = 13  # the supervisor went away


class SupervisorGone(Exception):
    """The supervisor's end of a pipe closed: the worker should exit."""


class EventSink(Protocol):
    """Where a scorer sends its events: a StatusSender, or an inline scorer that passes them on to one."""

    def send(self, event: Event) -> None: ...


class StatusSender:
    """Worker side of the status pipe. Thread-safe; `step` and `send` never block."""

    def __init__(self, conn: Connection, flush_interval: float = 0.05, max_pending: int = 10_000):
        self._conn = conn
        self._interval = flush_interval  # seconds a step report may wait to be batched
        self._max_pending = max_pending
        self._queue: deque[Event] = deque()
        self._dropped = 0
        self._wake = threading.Event()
        self._closing = False
        self.broken = False  # the supervisor stopped reading for good
        self._thread = threading.Thread(target=self._run, name="torchherd-status", daemon=True)
        self._thread.start()

    def step(self, event: Event) -> None:
        """Queue a report that a newer one supersedes (steps, heartbeats); dropped when too many wait."""
        if len(self._queue) >= self._max_pending:
            self._dropped += 1
            return
        if self._dropped and isinstance(event, StepMetrics):
            event = dataclasses.replace(event, dropped=self._dropped)
            self._dropped = 0
        self._queue.append(event)

    def send(self, event: Event) -> None:
        """Queue an event that must arrive (epoch end, checkpoint, error) and ship it now."""
        self._queue.append(event)
        self._wake.set()

    def _run(self) -> None:
        queue, conn = self._queue, self._conn
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            batch = []
            while queue:
                batch.append(queue.popleft())
            if batch:
                try:
                    conn.send_bytes(encode_batch(batch))
                except OSError:  # BrokenPipeError: nobody reads any more
                    self.broken = True
                    return
            if self._closing and not queue:
                return

    def close(self, timeout: float = 5.0) -> None:
        """Ship what is queued (waiting at most `timeout` seconds) and stop the thread."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)


TOKEN_CHARS = 32  # a per-attempt token: 16 random bytes as hex, the first thing a dialled-back child sends


def dial_back(address: str, token: str, timeout: float = 30.0) -> tuple[Connection, Connection]:
    """Connect to the supervisor at "host:port", prove who we are with `token`, and return the status
    (up) and control (down) ends of the one connection. Its close means the supervisor went away."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)  # seconds
    sock.settimeout(None)
    # Batches leave every 50 ms anyway; Nagle's wait on top of that would only add latency.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(token.encode("ascii"))
    fd = sock.detach()
    # Connection reads and writes plain descriptors; a socket's work as a pipe's do.
    return Connection(fd, readable=False), Connection(os.dup(fd), writable=False)


class ChannelError(ValueError):
    """Bytes on a channel that are not a batch (or a command) of known messages with well-typed fields."""


def _primitive(value: object) -> object:
    """What msgpack does not encode itself (a numpy scalar, a 0-d tensor, a path): a number, else its text."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "__float__"):
        return float(value)
    return str(value)


_out = msgspec.msgpack.Encoder(enc_hook=_primitive)
_steps_in = msgspec.msgpack.Decoder(list[StepMetrics])
_batch_in = msgspec.msgpack.Decoder(list[bytes | dict[str, Any]])


def encode_batch(events: list[Event]) -> bytes:
    """One batch of a StatusSender: the events in order, each run of step reports packed as msgpack bytes
    and any other event as its record."""
    items: list[bytes | dict[str, Any]] = []
    start = 0
    for i in range(len(events) + 1):
        if i < len(events) and type(events[i]) is StepMetrics:
            continue
        if i > start:
            try:
                items.append(_out.encode(events[start:i]))
            except (TypeError, ValueError, OverflowError):  # a value msgpack cannot hold: one record each
                items += [to_record(e) for e in events[start:i]]
        if i < len(events):
            items.append(to_record(events[i]))
        start = i + 1
    return _out.encode(items)


def decode_batch(payload: bytes) -> list[Event]:
    """The events of one batch sent by a StatusSender, in the order it sent them; ChannelError for bytes that
    are not one."""
    try:
        items = _batch_in.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ChannelError(f"not a batch of events: {exc}") from None
    out: list[Event] = []
    for item in items:
        if type(item) is bytes:
            out += _decode_steps(item)
        else:
            event = decode_record(item)
            if not isinstance(event, Event):
                raise ChannelError(f"{event.type!r} is not an event")
            out.append(event)
    return out


def _decode_steps(data: bytes) -> list[StepMetrics]:
    try:
        return _steps_in.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # a None loss, say: decoded field by field below
        pass
    try:
        runs = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ChannelError(f"not a run of step reports: {exc}") from None
    if not isinstance(runs, list):
        raise ChannelError("not a run of step reports")
    return [_typed(StepMetrics, fields) for fields in runs]


def decode_record(record: object) -> Message:
    """The message a record holds, its fields checked against their types (ChannelError if they are not)."""
    if not isinstance(record, dict):
        raise ChannelError(f"not a record: {type(record).__name__}")
    kind = record.get("type")
    cls = message_types().get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ChannelError(f"unknown message type {str(record.get('type'))[:80]!r}")
    return _typed(cls, {k: v for k, v in record.items() if k != "type"})


def _typed(cls: type[M], fields: object) -> M:
    """`records.typed`, its refusal a ChannelError."""
    try:
        return typed(cls, fields)
    except RecordError as exc:
        raise ChannelError(str(exc)) from None


def encode_command(command: Command) -> bytes:
    """A command as it goes down a control channel."""
    return _out.encode(to_record(command))


def decode_command(payload: bytes) -> Command:
    """A command from a control channel; ChannelError for bytes that are not one."""
    try:
        command = decode_record(msgspec.msgpack.decode(payload))
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ChannelError(f"not a command: {exc}") from None
    if not isinstance(command, Command):
        raise ChannelError(f"{command.type!r} is not a command")
    return command


class ControlReceiver:
    """Worker side of the control pipe: commands from the supervisor, without blocking."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def poll(self, timeout: float = 0.0) -> list[Command]:
        """Commands waiting now (or within `timeout` seconds). Raises SupervisorGone on EOF."""
        out = []
        try:
            while self._conn.poll(timeout):
                payload = self._conn.recv_bytes()
                timeout = 0.0
                try:
                    out.append(decode_command(payload))
                except ChannelError:  # not one of ours: nothing to obey
                    continue
        except (EOFError, OSError):
            raise SupervisorGone() from None
        return out
