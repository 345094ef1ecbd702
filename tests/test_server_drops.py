"""What waits for a client in the supervisor, on real sockets. A live client reads events.jsonl itself as far
as it is told (in pieces, every event once and in order, a line longer than a piece whole); one that reads
nothing holds one `appended` frame however long the run. What the socket carries itself (telemetry) is
dropped for no client that reads a burst of it, while one that reads nothing is dropped once its backlog has
passed a quarter of the bound for `stalled` seconds, and past the bound at once."""
from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from tests.test_service import apoll
from torchherd.engine.protocol.control import Appended, EventLines, Hello
from torchherd.engine.protocol.messages import Notice, StepMetrics
from torchherd.engine.rundir.directory import RunDirectory
from torchherd.engine.rundir.lines import encode_line
from torchherd.engine.serve import remote
from torchherd.engine.serve.remote import RemoteRun
from torchherd.engine.serve.runtime import publish, withdraw
from torchherd.engine.serve.server import ControlServer
from torchherd.engine.serve.wire import FrameReader, encode

LINE = encode_line(StepMetrics(pipeline="p", epoch=0, step=1, loss=0.5, lr=0.1, samples_per_s=1.0))


class HeldRun:
    """What a ControlServer asks of its supervisor, over a real RunDirectory, for a run that trains nothing:
    events come from the test."""

    run_id = "held"

    def __init__(self, run_dir: Path):
        self.run_dir, self.dir, self.taps, self.recorded = run_dir, RunDirectory(run_dir), [], []

    def tap(self, fn, steps=None) -> None:
        self.taps.append(fn)

    def record(self, event) -> None:
        self.recorded.append(event)

    def events_written(self) -> int:
        return self.dir.written()

    def views(self) -> list:
        return []

    def publish(self, lines: int) -> None:
        """`lines` step lines that events.jsonl does not keep: what the socket carries itself."""
        event = StepMetrics(pipeline="p", epoch=0, step=1, loss=0.5, lr=0.1, samples_per_s=1.0)
        for _ in range(lines):
            for tap in self.taps:
                tap(event, LINE, False)

    def publish_event(self, event, kept: bool = True) -> None:
        """One event, written to events.jsonl first when kept (a step report waits in its buffer, as a
        supervisor's do), then to every tap."""
        line = encode_line(event)
        if kept:
            self.dir.write(event, line)
        for tap in self.taps:
            tap(event, line, kept)


@pytest.fixture
def held(tmp_path):
    run = HeldRun(tmp_path / "run")
    yield run
    run.dir.close()


@pytest.fixture
def sock():
    folder = Path(tempfile.mkdtemp(prefix="th-test-"))  # AF_UNIX paths hold at most 107 bytes
    yield folder / "c.sock"
    shutil.rmtree(folder, ignore_errors=True)


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    client.sendall(encode(Hello(pid=0, read_only=True, live=True)))
    return client


def read_lines(client: socket.socket, got: list[int]) -> None:
    """Read frames until the connection ends, counting the event lines."""
    frames = FrameReader()
    while data := client.recv(1 << 20):
        got[0] += sum(msg.data.count(b"\n") for msg in frames.feed(data) if isinstance(msg, EventLines))


async def test_a_burst_written_in_one_turn_drops_no_client_that_reads_it(held, sock):
    server = ControlServer(held, sock, max_backlog=4 << 20, stalled=0.5)
    await server.start()
    client, got = connect(sock), [0]
    reader = threading.Thread(target=read_lines, args=(client, got), daemon=True)
    reader.start()
    try:
        await apoll(lambda: server.clients, 30, "the client to attach")
        lines = (5 << 20) // 2 // len(LINE)  # 2.5 MiB in one turn: past a quarter of the bound, under it
        held.publish(lines)
        await apoll(lambda: got[0] >= lines, 60, "the client to read the whole burst")
        held.publish(1)  # a flush after the client has caught up: it stays
        await apoll(lambda: got[0] == lines + 1, 30, "the last line")
        assert server.dropped == 0 and len(server.clients) == 1
    finally:
        await server.close()
        client.shutdown(socket.SHUT_RDWR)  # wakes the reader's recv
        await asyncio.to_thread(reader.join, 10)
        client.close()


async def test_a_client_that_reads_nothing_is_dropped_once_stalled_and_one_far_behind_at_once(held, sock):
    server = ControlServer(held, sock, max_backlog=4 << 20, stalled=0.5)
    await server.start()
    stopped = connect(sock)  # says hello, then never reads
    try:
        await apoll(lambda: server.clients, 30, "the client to attach")
        held.publish((5 << 20) // 2 // len(LINE))

        def still_sending() -> bool:
            held.publish(10)  # events keep coming: each flush asks how far behind it is
            return server.dropped == 1
        await apoll(still_sending, 30, "the stopped client to be dropped", interval=0.1)
        notes = [e.text for e in held.recorded if isinstance(e, Notice)]
        assert len(notes) == 1 and "read nothing for 0.5 s" in notes[0] and "was dropped" in notes[0], notes

        far = connect(sock)
        await apoll(lambda: server.clients, 30, "the second client to attach")
        held.publish((5 << 20) // len(LINE))  # 5 MiB in one turn: past the bound
        await apoll(lambda: server.dropped == 2, 5, "the client past the bound to be dropped at its first flush")
        assert "fell more than 4 MiB behind" in held.recorded[-1].text
        far.close()
    finally:
        await server.close()
        stopped.close()


def _step(i: int) -> StepMetrics:
    return StepMetrics(pipeline="p", epoch=0, step=i, loss=1.0 / i, lr=0.1, samples_per_s=1.0)


async def test_a_client_reads_the_file_in_pieces_and_gets_telemetry_after_what_came_before_it(held, sock,
                                                                                                 monkeypatch):
    monkeypatch.setattr(remote, "READ_AT_ONCE", 512)  # a few lines a read: the run below is a hundred reads
    run = held
    run.publish_event(_step(1))  # before the client: its history, not its live stream
    server = ControlServer(run, sock)
    await server.start()
    publish(run.run_dir, sock)
    client = None
    try:
        client = await RemoteRun.connect(run.run_dir, read_only=True, history=False)
        stream = client.subscribe(replay=False)
        sent = [_step(i) for i in range(2, 200)]
        sent.insert(100, Notice(pipeline="p", level="info", text="x" * 3000))  # one line longer than a read
        for event in sent:
            run.publish_event(event)
        telemetry = Notice(pipeline="p", level="info", text="not kept: from the socket")
        run.publish_event(telemetry, kept=False)
        got = []
        async with asyncio.timeout(60):
            async for event in stream:
                got.append(event)
                if event == telemetry:
                    break
        assert got == [*sent, telemetry]
        # The supervisor held nothing for it but a few small frames.
        assert all(c.backlog() < 4096 for c in server.clients)
    finally:
        if client is not None:
            await client.close()
        await server.close()
        withdraw(run.run_dir, sock)


async def test_a_client_that_reads_nothing_holds_one_appended_frame_however_long_the_run(held, sock):
    run = held
    server = ControlServer(run, sock)
    await server.start()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(sock))
        client.sendall(encode(Hello(pid=0, read_only=True, live=True)))
        await apoll(lambda: server.clients, 30, "the client to attach")
        conn = server.clients[0]
        conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        for i in range(1, 2001):  # a flush for each: 2,000 frames, far more than the kernel takes
            run.publish_event(_step(i))
            server._send()
        assert conn.backlog() < 200, conn.backlog()  # the newest `appended`, and at most a part of one more
        # Read at last, it is told where the file ends: nothing was lost by keeping only the newest.
        frames, told = FrameReader(), []

        def read_to_the_end() -> None:
            client.settimeout(30)
            while data := client.recv(1 << 16):
                told.extend(m.events_bytes for m in frames.feed(data) if isinstance(m, Appended))
        reading = asyncio.ensure_future(asyncio.to_thread(read_to_the_end))
        await apoll(lambda: told and told[-1] == run.dir.written(), 30, "the client to be told where the file ends")
        assert len(told) < 100, len(told)
        # Caught up, it is told of what follows at once, as any client is.
        run.publish_event(_step(2001))
        server._send()
        await apoll(lambda: told[-1] == run.dir.written(), 30, "the client to be told of the next event")
        assert conn.backlog() == 0
        await server.close()
        await asyncio.wait_for(reading, 60)
    finally:
        client.close()
