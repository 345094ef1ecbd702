"""The pipes between the supervisor and a worker: batched status events up, commands down.

On another machine the same framing runs over one TCP connection the child dials
back to the supervisor (`dial_back`), opened with its attempt's token.

`StatusSender` never blocks the training thread: events queue locally and a
background thread ships them in batches; step reports beyond a bound are dropped
and counted, everything else is always delivered. A batch is a pickled list in which
each run of step reports, the bulk of it, is one msgpack array (several times cheaper
to decode than pickled dataclasses). Exit codes a worker uses to say how it ended
live here too, since they are part of the same protocol.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import threading
from collections import deque
from multiprocessing.connection import Connection

import msgspec

from .messages import Command, Event, StepMetrics

EXIT_COMPLETED = 0
EXIT_ERROR = 1  # an exception in training: the restart policy applies
EXIT_STOPPED = 10  # stopped on request (or early-stopped) after a checkpoint
EXIT_FATAL = 11  # an error a restart cannot fix (bad task, NaN with nan_policy=stop)
EXIT_RESTART = 12  # asks to be restarted from the last checkpoint (nan_policy=restart)
EXIT_ORPHANED = 13  # the supervisor went away


class SupervisorGone(Exception):
    """The supervisor's end of a pipe closed: the worker should exit."""


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


_steps_out = msgspec.msgpack.Encoder()
_steps_in = msgspec.msgpack.Decoder(list[StepMetrics])


def encode_batch(events: list[Event]) -> bytes:
    """One batch of a StatusSender: the events in order, each run of step reports packed as msgpack bytes
    (a run msgpack cannot encode, such as a metric of a type it does not know, travels pickled as it is)."""
    items: list = []
    start = 0
    for i in range(len(events) + 1):
        if i < len(events) and type(events[i]) is StepMetrics:
            continue
        if i > start:
            try:
                items.append(_steps_out.encode(events[start:i]))
            except (TypeError, ValueError, OverflowError):
                items += events[start:i]
        if i < len(events):
            items.append(events[i])
        start = i + 1
    return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)


def decode_batch(payload: bytes) -> list[Event]:
    """The events of one batch sent by a StatusSender, in the order it sent them."""
    out: list[Event] = []
    for item in pickle.loads(payload):
        if type(item) is bytes:
            out += _decode_steps(item)
        else:
            out.append(item)
    return out


def _decode_steps(data: bytes) -> list[StepMetrics]:
    try:
        return _steps_in.decode(data)
    except msgspec.ValidationError:  # a field of another type than declared (a None loss): as pickle would
        return [StepMetrics(**fields) for fields in msgspec.msgpack.decode(data)]


class ControlReceiver:
    """Worker side of the control pipe: commands from the supervisor, without blocking."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def poll(self, timeout: float = 0.0) -> list[Command]:
        """Commands waiting now (or within `timeout` seconds). Raises SupervisorGone on EOF."""
        out = []
        try:
            while self._conn.poll(timeout):
                out.append(self._conn.recv())
                timeout = 0.0
        except (EOFError, OSError):
            raise SupervisorGone() from None
        return out
