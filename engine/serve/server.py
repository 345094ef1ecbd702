"""A live run's control socket, served by its supervisor: every connection is checked by its peer
credentials, welcomed with the run and the size of events.jsonl (and, when asked, the history in short),
then told at most every FLUSH_EVERY seconds how far events.jsonl holds the run's events (each client reads
the file itself) and sent what the file does not keep, one frame shared by every client; its requests are
carried out and recorded. A client is dropped, never waited for, once `max_backlog` bytes wait for it, or a
quarter of that while it has read nothing for STALLED seconds. Connections are bounded (MAX_CONNECTIONS, MAX_REQUEST,
HELLO_WITHIN, IDLE, REPLY_BACKLOG: see each); a config to add is read off the loop; a request is recorded cut short.
"""
from __future__ import annotations

import asyncio
import os
import stat
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..config.load import load_config
from ..config.problems import ConfigError
from ..protocol.control import (
    Action,
    Appended,
    ClientCommand,
    ClientRefused,
    EventLines,
    Hello,
    Reply,
    Request,
    Welcome,
)
from ..protocol.messages import Event, Message, Notice, StepMetrics
from .summary import HistorySummary
from .wire import FrameError, FrameReader, encode, peer_credentials, same_user

if TYPE_CHECKING:
    from ..config.schema import RunConfig
    from ..supervise.supervisor import Supervisor

MAX_BACKLOG = 64 << 20  # bytes a client may leave unread before it is dropped at once (it can attach again)
STALLED = 3.0  # seconds a client with a quarter of MAX_BACKLOG waiting may read nothing before it is dropped
BURST = 1 << 20  # bytes of lines that make a frame at once, without waiting for the next flush
FLUSH_EVERY = 0.02  # seconds: events wait at most this long, so a client wakes for many at once
MAX_CONNECTIONS = 64  # connections at once: any more are closed as they come
MAX_REQUEST = 64 << 10  # bytes: the longest frame a client sends (a hello, a request)
HELLO_WITHIN = 10.0  # seconds a new connection has to say hello
IDLE = 60.0  # seconds a connection may hold half a frame, or send nothing when it does not follow the run
REPLY_BACKLOG = 1 << 20  # bytes of replies a client that does not follow the run may leave unread
MAX_NAME = 255  # characters of a pipeline name (a folder name); a request's name is recorded cut to this
READ_AT_START = 4 << 20  # bytes of events.jsonl read at a time into the history in short at start-up


def _short(text: str, limit: int = MAX_NAME) -> str:
    """`text` cut to `limit` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _read_config(path: str) -> RunConfig:
    """The config at `path` (in a thread: a slow or hung file system must not stall the run); only a regular
    file is opened, never a FIFO or a device, which could block its reader for ever."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: not a regular file")
    return load_config(path)


class _Connection(asyncio.Protocol):
    """One client: its credentials, its frames in, and the frames it has yet to be sent."""

    def __init__(self, server: ControlServer):
        self.server = server
        self.transport: Any = None
        self.pid = 0
        self.read_only = True
        self._frames = FrameReader(MAX_REQUEST)
        self.said_hello = False
        self.heard = 0.0  # loop time it last sent bytes
        self._timer: asyncio.TimerHandle | None = None
        # Frames wait here, shared with every other client, while its transport cannot take more (asyncio's flow
        # control): a client behind costs references, not a copy of its backlog of its own.
        self._held: deque[bytes] = deque()
        self._held_bytes = 0
        self._told: bytes | None = None  # the newest `appended` while it is behind: it says all an older one did
        self._paused = False
        self.sent = 0  # bytes handed to its transport
        self.taken = 0  # of those, bytes the kernel has taken from it (the client reads)
        self.stalled_since: float | None = None  # when it was last seen with a quarter of the bound waiting

    def tell(self, frame: bytes) -> None:
        """An `appended` frame: sent now, or kept (in place of an older one) until the client catches up."""
        if self._paused or self._held:
            self._told = frame
        else:
            self.write(frame)

    def write(self, data: bytes) -> None:
        if self._told is not None:  # what it was told comes before whatever follows
            self._hold(self._told)
            self._told = None
        if self._paused or self._held:
            self._hold(data)
        else:
            self.transport.write(data)  # may pause writing at once
            self.sent += len(data)

    def _hold(self, data: bytes) -> None:
        self._held.append(data)
        self._held_bytes += len(data)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        while self._held and not self._paused:
            data = self._held.popleft()
            self._held_bytes -= len(data)
            self.transport.write(data)
            self.sent += len(data)
        if self._told is not None and not self._paused:
            told, self._told = self._told, None
            self.transport.write(told)
            self.sent += len(told)

    def finish(self) -> None:
        """Close once everything it was sent is written, where the peer still reads."""
        if self._told is not None:
            self._hold(self._told)
            self._told = None
        while self._held:
            self.transport.write(self._held.popleft())
        self._held_bytes = 0
        self.transport.close()

    def backlog(self) -> int:
        """Bytes waiting for it in this process; notes whether it has read anything since last asked."""
        waiting = self.transport.get_write_buffer_size()
        taken = self.sent - waiting
        if taken > self.taken:
            self.taken, self.stalled_since = taken, None
        return waiting + self._held_bytes + len(self._told or b"")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # a unix socket's: a WriteTransport
        self.transport.set_write_buffer_limits(high=0)  # what the kernel does not take at once waits in `_held`
        pid, uid, _ = peer_credentials(transport.get_extra_info("socket"))
        self.pid = pid
        if not same_user(uid):
            self.server.refuse(self, uid)
        elif not self.server.admit(self):
            self.transport.abort()
        else:
            loop = asyncio.get_running_loop()
            self.heard = loop.time()
            self._timer = loop.call_later(HELLO_WITHIN, self._watch)

    def _watch(self) -> None:
        """Close a connection that never said hello, holds half a frame, or idles without following the run."""
        now = asyncio.get_running_loop().time()
        quiet = now - self.heard
        live = self in self.server.clients
        if not self.said_hello or ((self._frames.partial or not live) and quiet >= IDLE):
            self.transport.abort()
            return
        self._timer = asyncio.get_running_loop().call_later(max(IDLE - quiet, 1.0), self._watch)

    def data_received(self, data: bytes) -> None:
        self.heard = asyncio.get_running_loop().time()
        try:
            messages = self._frames.feed(data)
        except FrameError:
            self.transport.abort()  # not a torchherd client
            return
        for msg in messages:
            self.server.handle(self, msg)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.server.forget(self)


class ControlServer:
    """Serves one supervisor on an AF_UNIX socket at `path` (mode 0600, in a folder only the user enters)."""

    def __init__(self, sup: Supervisor, path: Path, max_backlog: int = MAX_BACKLOG, stalled: float = STALLED):
        self.sup = sup
        self.path = Path(path)
        self.max_backlog, self.stalled = max_backlog, stalled
        self.clients: list[_Connection] = []  # those taking the live stream
        self.dropped = 0  # clients dropped for falling behind
        self.connections: set[_Connection] = set()  # every connection admitted, live or not
        self.turned_away = 0  # connections closed at once: MAX_CONNECTIONS were open
        self._server: asyncio.AbstractServer | None = None
        self._flush_soon = False
        self.pending = bytearray()  # lines events.jsonl does not keep, since the last flush, for every client alike
        self._appended = False  # events.jsonl has grown since the clients were last told
        self.summary = HistorySummary()

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        old = os.umask(0o177)  # the socket is born 0600: no moment when others could connect
        try:
            self._server = await asyncio.get_running_loop().create_unix_server(
                lambda: _Connection(self), path=str(self.path))
        finally:
            os.umask(old)
        # What is on disk now, then every event from now on: no await between the two, so nothing is missed.
        written = self.sup.events_written()
        try:
            with open(Path(self.sup.run_dir) / "events.jsonl", "rb") as fh:
                self._summarize(fh, written)
        except OSError:
            pass
        self.sup.tap(self._on_event, self._on_steps)

    def _summarize(self, fh: BinaryIO, size: int) -> None:
        """The first `size` bytes of events.jsonl into the history in short, READ_AT_START at a time (a long
        run's file is gigabytes: never all of it in memory at once)."""
        rest = b""
        while size > 0:
            data = fh.read(min(READ_AT_START, size))
            if not data:
                break
            size -= len(data)
            data = rest + data
            cut = data.rfind(b"\n") + 1
            self.summary.add_file(data[:cut])
            rest = data[cut:]
        if rest:
            self.summary.add_file(rest)

    async def close(self) -> None:
        """Send what is pending, end every connection and remove the socket."""
        self._appended = True  # whatever the file holds last, every client reads
        self._send()
        for conn in list(self.clients):
            conn.finish()
        if self._server is not None:
            self._server.close()
        self.path.unlink(missing_ok=True)

    # ------------------------------------------------------------ connections
    def refuse(self, conn: _Connection, uid: int) -> None:
        conn.transport.abort()
        self.sup.record(ClientRefused(pid=conn.pid, uid=uid, reason="another user's process"))

    def admit(self, conn: _Connection) -> bool:
        """Whether there is room for another connection (counted until it is lost)."""
        if len(self.connections) >= MAX_CONNECTIONS:
            self.turned_away += 1
            return False
        self.connections.add(conn)
        return True

    def forget(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        if conn in self.clients:
            self.clients.remove(conn)

    def handle(self, conn: _Connection, msg: Message) -> None:
        if isinstance(msg, Hello):
            conn.said_hello = True
            conn.read_only = msg.read_only
            self._welcome(conn, live=msg.live, summary=msg.summary)
        elif isinstance(msg, Request) and conn.said_hello:
            if msg.action == Action.DETACH:  # nothing done, nothing recorded
                conn.write(encode(Reply(id=msg.id, ok=True, text="detached")))
            elif msg.action == Action.ADD_CONFIG and not conn.read_only:
                asyncio.get_running_loop().create_task(self._add_config(conn, msg))
            else:
                self._answer(conn, msg, *self._carry_out(conn, msg))
        else:
            conn.transport.abort()

    def _answer(self, conn: _Connection, req: Request, ok: bool, text: str) -> None:
        """Record what a request came to, and reply; a client that leaves its replies unread is closed."""
        self.sup.record(ClientCommand(action=_short(req.action, 40), pipeline=_short(req.pipeline),
                                      client_pid=conn.pid, ok=ok, text=_short(text, 2 * MAX_NAME)))
        if conn.transport.is_closing():
            return
        conn.write(encode(Reply(id=req.id, ok=ok, text=text)))
        if conn not in self.clients and conn.backlog() > REPLY_BACKLOG:
            conn.transport.abort()
            self.sup.record(Notice(level="warning", text=f"client pid {conn.pid} left over "
                                   f"{REPLY_BACKLOG >> 20} MiB of replies unread and was dropped"))

    async def _add_config(self, conn: _Connection, req: Request) -> None:
        try:
            config = await asyncio.to_thread(_read_config, req.path)
            ok, text = True, "added " + ", ".join(self.sup.add_config(config))
        except (ValueError, RuntimeError, ConfigError, OSError) as exc:
            ok, text = False, str(exc)
        self._answer(conn, req, ok, text)

    def _welcome(self, conn: _Connection, live: bool, summary: bool = False) -> None:
        # No await from here on: the size read now (and the summary) and the events from now on meet exactly.
        # The clients already here are told first how far the file goes, and get what was pending.
        self._send()
        statuses = {v.name: v.state.value for v in self.sup.views()}
        conn.write(encode(Welcome(
            run_id=self.sup.run_id, run_dir=str(self.sup.run_dir), supervisor_pid=os.getpid(),
            events_bytes=self.sup.events_written(), pipelines=tuple(statuses), statuses=statuses)))
        if summary:
            conn.write(encode(EventLines(data=self.summary.data())))
        if live and conn not in self.clients:
            self.clients.append(conn)

    def _carry_out(self, conn: _Connection, req: Request) -> tuple[bool, str]:
        if conn.read_only:
            return False, "this client is read-only"
        if len(req.pipeline) > MAX_NAME:
            return False, f"a pipeline name of {len(req.pipeline)} characters (at most {MAX_NAME})"
        try:
            return True, self._act(req)
        except (KeyError, ValueError, RuntimeError, ConfigError) as exc:
            return False, str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)

    def _act(self, req: Request) -> str:
        sup, name = self.sup, req.pipeline
        match req.action:
            case Action.STOP:
                sup.stop(name or None, reason=req.reason or "requested")
            case Action.KILL:
                for target in ([name] if name else [v.name for v in sup.views() if not v.state.final]):
                    sup.kill(target)
            case Action.RESTART:
                sup.restart(name)
            case Action.PAUSE:
                sup.pause(name)
            case Action.UNPAUSE | Action.RESUME:
                sup.unpause(name)
            case Action.CHECKPOINT:
                sup.checkpoint(name)
            case Action.STACKS:
                sup.stacks(name)
            case Action.PROMOTE:
                if not name:
                    raise ValueError("name the trial to promote")
                sup.promote(name)
            case _:
                raise ValueError(f"unknown action {req.action!r}")
        return f"{req.action} {name or 'every pipeline'}"

    # ------------------------------------------------------------ the live stream
    def _on_event(self, event: Event, line: bytes, kept: bool) -> None:
        if kept:
            self.summary.add(line, event.pipeline if isinstance(event, StepMetrics) else None)
            self._appended = True
        elif self.clients:
            self.pending += line
            if len(self.pending) >= BURST:
                self._send()
        if self.clients:
            self._flush_later()

    def _on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        """`_on_event` of each of a run of step reports, at once."""
        add = self.summary.add
        for step, line in zip(steps, lines):
            add(line, step.pipeline)
        self._appended = True
        if self.clients:
            self._flush_later()

    def _flush_later(self) -> None:
        """What is pending goes out within FLUSH_EVERY seconds."""
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_later(FLUSH_EVERY, self._flush)

    def _send(self) -> None:
        """How far events.jsonl now holds the run's events, then what it does not keep: the same bytes to every
        client."""
        if self._appended and self.clients:
            told = encode(Appended(events_bytes=self.sup.events_written()))
            for conn in self.clients:
                conn.tell(told)
        self._appended = False
        if self.pending:
            frame = encode(EventLines(data=bytes(self.pending)))
            self.pending.clear()
            for conn in self.clients:
                conn.write(frame)

    def _flush(self) -> None:
        """Send what is pending, then drop the clients too far behind."""
        self._flush_soon = False
        self._send()
        now = asyncio.get_running_loop().time()
        for conn in list(self.clients):
            waiting = conn.backlog()
            if waiting > self.max_backlog:
                self._drop(conn, f"fell more than {self.max_backlog / (1 << 20):g} MiB behind")
            elif waiting > self.max_backlog // 4:
                conn.stalled_since = conn.stalled_since or now
                if now - conn.stalled_since > self.stalled:
                    self._drop(conn, f"read nothing for {self.stalled:g} s with {waiting / (1 << 20):.1f} MiB "
                               "waiting")
            else:
                conn.stalled_since = None

    def _drop(self, conn: _Connection, why: str) -> None:
        self.clients.remove(conn)
        conn.transport.abort()
        self.dropped += 1
        self.sup.record(Notice(level="warning", text=f"client pid {conn.pid} {why} and was dropped; it can "
                               "attach again"))
