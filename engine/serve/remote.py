"""A client of a live run: its history (all of events.jsonl, or in short from the supervisor), then its live
events, read from events.jsonl as far as the control socket says it is written (telemetry from the socket
itself), as one stream (what `Supervisor.subscribe` gives in-process), and requests the supervisor answers.

`RemoteRun` has the surface of `Supervisor` that the app and the headless printer use, so either drives them.
A process that follows a live run collects its young objects less often (`spare_the_young`).
"""
from __future__ import annotations

import asyncio
import gc
import itertools
import os
import time
from pathlib import Path
from typing import Literal

from ..protocol.control import Action, Appended, EventLines, Hello, Reply, Request, Welcome
from ..protocol.messages import Event, Message, Notice, PipelineFinished, WorkerStateChanged
from ..protocol.states import WorkerState
from ..rundir.directory import run_held
from ..rundir.history import decode_history, decode_stretch, read_history
from ..supervise.bus import EventStream
from .runtime import clean_stale, read_control
from .wire import FrameError, FrameReader, encode, peer_credentials, same_user

# Bytes of events.jsonl a client reads and decodes in one turn of its loop. Small, so that its streams take
# each stretch's events before the next is decoded, while they are young: stretches of 4 MiB cost a reader
# 10-20% more CPU a step report, in the collector and the cache (benchmarks/client_read.py).
READ_AT_ONCE = 64 << 10


# Objects the collector tracks that a client may allocate, net of those freed, before it collects the young:
# Python's default is 700. Each step report read is two (the event, its metrics), held from the read until every
# stream has taken it, so at 700 the collector walks every event in flight, again and again: 12% of the CPU of a
# client following a fast run (benchmarks/service_attach.py's fan-out; client_read.py: 0.9x). Many stretches of
# READ_AT_ONCE fit in this.
YOUNG = 50_000


def spare_the_young() -> None:
    """Let a process that follows a live run collect its young objects every YOUNG allocations (at least):
    events are freed by their reference counts as soon as every stream has taken them, so only garbage in
    cycles waits longer, and at most YOUNG allocations longer."""
    young, *older = gc.get_threshold()
    if young < YOUNG:
        gc.set_threshold(YOUNG, *older)


class NotLive(RuntimeError):
    """The run has no live supervisor to attach to."""


def live_socket(run_dir: Path) -> Path:
    """The control socket of a live run; NotLive (after cleaning up what a dead supervisor left) if none."""
    control = read_control(run_dir)
    if not run_held(run_dir):
        clean_stale(run_dir)
        raise NotLive(f"{run_dir}: no torchherd supervisor is running it")
    if control is None or not control.socket.exists():
        raise NotLive(f"{run_dir}: its supervisor serves no control socket (an older torchherd, or starting)")
    return control.socket


def _check_server(writer: asyncio.StreamWriter, sock: Path) -> None:
    """Refuse (NotLive) a socket served by another user: control.json names any path anyone wrote, and a
    client sends commands to, and trusts the history of, whoever serves it."""
    _, uid, _ = peer_credentials(writer.get_extra_info("socket"))
    if not same_user(uid):
        writer.close()
        raise NotLive(f"{sock}: served by uid {uid}, not by this user (uid {os.getuid()}); "
                      "torchherd only talks to its own user's supervisors")


class RemoteRun:
    """One connection to a live run's supervisor."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, welcome: Welcome,
                 frames: FrameReader, read_only: bool, events: int | None = None, run_dir: Path | None = None):
        self.welcome = welcome
        self.run_id = welcome.run_id
        # The folder as this client found it: the supervisor's own name for it may be relative to the folder
        # it was started from, which need not be this client's.
        self.run_dir = run_dir if run_dir is not None else Path(welcome.run_dir)
        self.read_only = read_only
        self.statuses = dict(welcome.statuses)
        self.history: list[Event] = []
        self._reader, self._writer, self._frames = reader, writer, frames
        self._queues: list[asyncio.Queue] = []
        self._backlog: list[Event] = []  # live events before the first subscriber
        self._replies: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._ended = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._events = events  # events.jsonl, open for reading (None: not live)
        self._read_to = self._readable = welcome.events_bytes  # where this client is in it; how far it may read

    @classmethod
    async def connect(cls, run_dir: Path, *, read_only: bool = False, live: bool = True,
                      history: bool = True, summary: bool = False) -> RemoteRun:
        """Attach to the live run in `run_dir` (NotLive if it has none), with its history read when asked:
        every event of events.jsonl, or with `summary` the supervisor's history in short (every event but
        most step reports: the same figures, the charts' shape, at a fraction of the cost)."""
        sock = live_socket(Path(run_dir))
        try:
            reader, writer = await asyncio.open_unix_connection(str(sock), limit=1 << 20)
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            raise NotLive(f"{run_dir}: its control socket does not answer ({exc.strerror})") from None
        _check_server(writer, sock)
        summary = summary and history
        writer.write(encode(Hello(pid=os.getpid(), read_only=read_only, live=live, summary=summary)))
        frames = FrameReader()
        try:
            welcome, rest = await _first(reader, frames, summary)
        except ConnectionError as exc:  # refused by its peer check: the supervisor aborts the connection
            writer.close()
            raise NotLive(f"{run_dir}: the supervisor refused this connection ({exc.strerror or exc})") from None
        events = None
        if live:
            try:
                events = os.open(Path(run_dir) / "events.jsonl", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                writer.close()
                raise NotLive(f"{run_dir}: cannot read its events.jsonl ({exc.strerror})") from None
        run = cls(reader, writer, welcome, frames, read_only, events, Path(run_dir).absolute())
        if live:
            spare_the_young()
        if summary:
            short, *rest = rest
            run.history = decode_history(short.data)
        elif history:
            run.history = await asyncio.to_thread(read_history, Path(run_dir), welcome.events_bytes)
        run._task = asyncio.get_running_loop().create_task(run._read(rest))
        return run

    # ------------------------------------------------------------ the Supervisor surface
    def subscribe(self, replay: bool = True) -> EventStream:
        queue: asyncio.Queue = asyncio.Queue()
        for event in (self.history if replay else []):
            queue.put_nowait(event)
        if not self._queues:
            for event in self._backlog:
                queue.put_nowait(event)
            self._backlog.clear()
        if self._ended.is_set():
            queue.put_nowait(None)
        self._queues.append(queue)
        return EventStream(queue)

    @property
    def alive(self) -> bool:
        """Some pipeline has not reached a final state (as far as this client has heard)."""
        return not self._ended.is_set() and any(not WorkerState(s).final for s in self.statuses.values())

    async def why_ended(self, settle: float = 3.0) -> str:
        """Why the connection ended without the run finishing, for people (`outcome` says which way)."""
        outcome = await self.outcome(settle)
        if outcome == "dropped":
            return (f"this view fell too far behind and the supervisor dropped it; the run goes on: "
                    f"`torchherd attach {self.run_dir}`")
        if outcome == "finished":
            return "this view was dropped and the run has finished since: `torchherd ls` says how"
        return f"the run was cut short: its supervisor is gone. Carry it on with `torchherd resume {self.run_dir}`"

    async def outcome(self, settle: float = 3.0) -> Literal["dropped", "finished", "cut short"]:
        """Once the connection has ended without the run finishing: this client was dropped (the run goes on),
        the run finished since, or its supervisor is gone and the run was cut short.

        A dying supervisor's socket can close a moment before its run lock is let go: a lock still held
        after `settle` seconds is a supervisor that lives on."""
        deadline = time.monotonic() + settle
        while run_held(self.run_dir) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if run_held(self.run_dir):
            return "dropped"
        return "finished" if _finished(self.run_dir) else "cut short"

    @property
    def ended(self) -> bool:
        """The connection is over: the run finished, the supervisor died, or this client was dropped."""
        return self._ended.is_set()

    def stop(self, name: str | None = None, reason: str = "requested") -> None:
        self.send(Action.STOP, name or "", reason=reason)

    def kill(self, name: str) -> None:
        self.send(Action.KILL, name)

    def restart(self, name: str) -> None:
        self.send(Action.RESTART, name)

    def pause(self, name: str) -> None:
        self.send(Action.PAUSE, name)

    def unpause(self, name: str) -> None:
        self.send(Action.UNPAUSE, name)

    def checkpoint(self, name: str) -> None:
        self.send(Action.CHECKPOINT, name)

    def stacks(self, name: str) -> None:
        self.send(Action.STACKS, name)

    def promote(self, name: str) -> None:
        self.send(Action.PROMOTE, name)

    async def add_config_file(self, path: Path) -> list[str]:
        reply = await self.request(Action.ADD_CONFIG, path=str(Path(path).resolve()))
        if not reply.ok:
            raise RuntimeError(reply.text)
        return reply.text.removeprefix("added ").split(", ")

    async def shutdown(self, graceful: bool = True, timeout: float = 30.0) -> None:
        """Stop (gracefully) or kill every pipeline, and wait (bounded) for the run to end."""
        if not self._ended.is_set():
            await self.request(Action.STOP if graceful else Action.KILL)
            try:
                await asyncio.wait_for(self._ended.wait(), timeout + 10.0)
            except TimeoutError:
                pass
        await self.close()

    async def wait(self) -> dict[str, str]:
        """Wait until the connection ends; the pipelines' statuses as last heard."""
        await self._ended.wait()
        return dict(self.statuses)

    # ------------------------------------------------------------ requests
    def send(self, action: Action, pipeline: str = "", reason: str = "") -> None:
        """Ask without waiting; a refusal arrives in the stream as a warning Notice."""
        asyncio.get_running_loop().create_task(self._send_and_report(action, pipeline, reason))

    async def request(self, action: Action, pipeline: str = "", path: str = "", reason: str = "") -> Reply:
        """Ask and wait for the answer (a refused Reply when the connection has ended)."""
        if self._ended.is_set():
            return Reply(id=0, ok=False, text="the run is no longer live")
        rid = next(self._ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._replies[rid] = future
        self._writer.write(encode(Request(id=rid, action=action, pipeline=pipeline, path=path, reason=reason)))
        return await future

    async def _send_and_report(self, action: Action, pipeline: str, reason: str) -> None:
        reply = await self.request(action, pipeline, reason=reason)
        if not reply.ok:
            self._deliver(Notice(pipeline=pipeline, level="warning", text=f"{action} refused: {reply.text}"))

    async def detach(self) -> None:
        """Leave the run going and end this connection."""
        if not self._ended.is_set():
            await self.request(Action.DETACH)
        await self.close()

    async def close(self) -> None:
        self._writer.close()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        self._end()

    # ------------------------------------------------------------ internals
    async def _read(self, rest: list) -> None:
        try:
            await self._handle(rest)
            while data := await self._reader.read(1 << 20):
                await self._handle(self._frames.feed(data))
        except (ConnectionError, FrameError, OSError):
            pass
        finally:
            self._end()

    def _read_some(self) -> bool:
        """Read on in events.jsonl, at most READ_AT_ONCE bytes, towards where the supervisor said it is written;
        whether there is more."""
        if self._events is None or self._read_to >= self._readable:
            return False
        left, size = self._readable - self._read_to, READ_AT_ONCE
        while True:  # a line cut by the read's size is read again from its start, next time
            data = os.pread(self._events, min(left, size), self._read_to)
            whole = data[:data.rfind(b"\n") + 1]
            if whole or size >= left:
                break
            size *= 4  # one line longer than a read: reads long enough to hold it
        if not whole:
            return False
        self._read_to += len(whole)
        self._lines(whole)
        return self._read_to < self._readable

    async def _handle(self, messages: list[Message]) -> None:
        for msg in messages:
            if isinstance(msg, EventLines):  # the file's events first: the supervisor told of them before these
                await self._read_appended()
            self._take(msg)
        await self._read_appended()

    async def _read_appended(self) -> None:
        """All of it, a few MiB at a time: a client far behind leaves the loop its turns in between."""
        while self._read_some():
            await asyncio.sleep(0)

    def _lines(self, data: bytes) -> None:
        events, steps_only = decode_stretch(data)
        if not steps_only:
            for event in events:
                if isinstance(event, (WorkerStateChanged, PipelineFinished)):
                    self._note(event)
        if events:
            self._deliver_burst(events)

    def _take(self, msg: Message) -> None:
        if isinstance(msg, Reply):
            future = self._replies.pop(msg.id, None)
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, Appended):
            self._readable = max(self._readable, msg.events_bytes)
        elif isinstance(msg, EventLines):
            self._lines(msg.data)
        elif isinstance(msg, Event):
            self._note(msg)
            self._deliver(msg)

    def _note(self, event: Event) -> None:
        if isinstance(event, WorkerStateChanged):
            self.statuses[event.pipeline] = event.state
        elif isinstance(event, PipelineFinished):
            self.statuses[event.pipeline] = event.status

    def _deliver(self, event: Event) -> None:
        if not self._queues:
            self._backlog.append(event)
        for queue in self._queues:
            queue.put_nowait(event)

    def _deliver_burst(self, events: list[Event]) -> None:
        """A frame's events as one item of each stream's queue (read, never changed, by every stream)."""
        if not self._queues:
            self._backlog.extend(events)
        for queue in self._queues:
            queue.put_nowait(events)

    def _end(self) -> None:
        if self._events is not None:
            os.close(self._events)
            self._events = None
        if self._ended.is_set():
            return
        self._ended.set()
        for future in self._replies.values():
            if not future.done():
                future.set_result(Reply(id=0, ok=False, text="the run is no longer live"))
        for queue in self._queues:
            queue.put_nowait(None)


async def _first(reader: asyncio.StreamReader, frames: FrameReader, summary: bool = False) -> tuple[Welcome, list]:
    """Read until the Welcome (and, with `summary`, the history in short that follows it); returns it and
    whatever frames came with it, the summary first."""
    messages: list = []
    while len(messages) < 1 + summary:
        data = await reader.read(1 << 20)
        if not data:
            raise NotLive("the supervisor closed the connection before welcoming it")
        messages += frames.feed(data)
    first, *rest = messages
    if not isinstance(first, Welcome):
        raise NotLive(f"expected a welcome, got {first.type}")
    if summary and not isinstance(rest[0], EventLines):
        raise NotLive(f"expected the run's history, got {rest[0].type}")
    return first, rest


def _finished(run_dir: Path) -> bool:
    """Whether events.jsonl ends with the run's run_finished record."""
    try:
        with open(Path(run_dir) / "events.jsonl", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    except OSError:
        return False
    return last.startswith(b'{"type":"run_finished"')
