"""The control socket's bounds, on real sockets: what a client of the same user that misbehaves (never reads,
floods, sends half frames, nests msgpack deep, names a FIFO) can cost a run, which is little and bounded."""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading

import msgspec
import pytest

from tests.test_server_drops import HeldRun, sock  # noqa: F401  (the `sock` fixture)
from tests.test_service import apoll
from torchherd.engine.protocol.control import Action, ClientCommand, Hello, Reply, Request
from torchherd.engine.protocol.messages import Notice, StepMetrics
from torchherd.engine.serve import server as server_module
from torchherd.engine.serve.server import ControlServer
from torchherd.engine.serve.summary import HistorySummary
from torchherd.engine.serve.wire import FrameError, FrameReader, decode, encode


class Steered(HeldRun):
    """A held run that knows no pipeline: every action on a name is refused, as a supervisor refuses one."""

    def pause(self, name: str) -> None:
        raise KeyError(f"no pipeline named {name!r}")


@pytest.fixture
def held(tmp_path):
    run = Steered(tmp_path / "run")
    yield run
    run.dir.close()


def client(path, *, live: bool = False, read_only: bool = False, may_be_turned_away: bool = False) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(path))
    try:
        conn.sendall(encode(Hello(pid=os.getpid(), read_only=read_only, live=live)))
    except (BrokenPipeError, ConnectionResetError):
        if not may_be_turned_away:  # a server over its cap may close the connection before the hello is sent
            raise
    return conn


def closed_by_peer(conn: socket.socket, timeout: float = 30.0) -> bool:
    """Whether the server ends the connection (read what it sent until then) within `timeout` seconds."""
    conn.settimeout(timeout)
    try:
        while conn.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False
    return True


async def test_a_refused_requests_name_is_recorded_cut_short(held, sock):
    # Regression: every refused request was recorded with its name as sent: 1,500 requests with 20 KB names
    # added 60 MB to events.jsonl.
    server = ControlServer(held, sock)
    await server.start()
    conn = await asyncio.to_thread(client, sock, read_only=True)
    try:
        await asyncio.to_thread(conn.sendall, encode(Request(id=1, action=Action.PAUSE, pipeline="n" * 20_000)))
        recorded = await apoll(lambda: [e for e in held.recorded if isinstance(e, ClientCommand)], 30, "the record")
        assert not recorded[0].ok and len(recorded[0].pipeline) < 400 and len(recorded[0].text) < 800
    finally:
        conn.close()
        await server.close()


async def test_replies_a_client_leaves_unread_are_bounded(held, sock):
    # Regression: replies to a client that does not follow the run were queued without bound (1,500 requests
    # never read: the supervisor grew from 42 to 190 MiB and never gave it back).
    server = ControlServer(held, sock)
    await server.start()
    conn = await asyncio.to_thread(client, sock)
    many = b"".join(encode(Request(id=i, action=Action.PAUSE, pipeline="n" * 250)) for i in range(12_000))
    writer = threading.Thread(target=lambda: _send_until_closed(conn, many), daemon=True)
    writer.start()
    try:
        dropped = await apoll(lambda: [e for e in held.recorded if isinstance(e, Notice)], 120, "the drop")
        assert "unread" in dropped[0].text
        assert not server.connections
    finally:
        conn.close()
        await server.close()


def _send_until_closed(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:  # the server dropped it: what it wrote was never read
        pass


async def test_a_frame_longer_than_any_request_ends_the_connection(held, sock):
    # Regression: each connection could hold a partial frame of 64 MiB.
    server = ControlServer(held, sock)
    await server.start()
    conn = await asyncio.to_thread(client, sock)
    try:
        await asyncio.to_thread(conn.sendall, struct.pack("!I", 32 << 20) + b"x" * 1024)
        assert await asyncio.to_thread(closed_by_peer, conn)
    finally:
        conn.close()
        await server.close()


async def test_connections_beyond_the_cap_are_closed_as_they_come(held, sock, monkeypatch):
    # Regression: connections were not counted: each could hold its buffers and a slot in every flush.
    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 4)
    server = ControlServer(held, sock)
    await server.start()
    conns = [await asyncio.to_thread(client, sock) for _ in range(4)]
    await apoll(lambda: len(server.connections) == 4, 30, "four admitted")
    conns += [await asyncio.to_thread(client, sock, may_be_turned_away=True) for _ in range(2)]
    try:
        await apoll(lambda: server.turned_away == 2, 30, "two turned away")
        assert len(server.connections) == 4
        assert all([await asyncio.to_thread(closed_by_peer, c, 30) for c in conns[4:]])
    finally:
        for c in conns:
            c.close()
        await server.close()


async def test_a_connection_that_never_says_hello_is_closed(held, sock, monkeypatch):
    monkeypatch.setattr(server_module, "HELLO_WITHIN", 0.2)
    server = ControlServer(held, sock)
    await server.start()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await asyncio.to_thread(silent.connect, str(sock))
    try:
        assert await asyncio.to_thread(closed_by_peer, silent)
        assert not server.connections
    finally:
        silent.close()
        await server.close()


def test_msgpack_nested_too_deep_is_a_frame_error():
    # Regression: 100k levels of nesting raised RecursionError, which the frame handling did not catch.
    deep = msgspec.msgpack.encode(("request", {"id": 1, "action": "stop"}))[:-1]
    for body in (b"\x92\xa7request" + b"\x91" * 100_000 + b"\xc0", deep + b"\x91" * 100_000 + b"\xc0"):
        with pytest.raises(FrameError):
            decode(body)


async def test_adding_a_config_that_is_a_fifo_is_refused_and_the_run_goes_on(held, sock, tmp_path):
    # Regression: add_config read its file on the event loop: a FIFO froze every client and the run for as
    # long as nobody wrote to it.
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    server = ControlServer(held, sock)
    await server.start()
    conn = await asyncio.to_thread(client, sock)
    replied = threading.Event()
    # On the old code the loop blocks in open(): a writer then lets it go, so the test fails instead of hanging.
    threading.Thread(target=lambda: replied.wait(20) or open(fifo, "w").close(), daemon=True).start()
    try:
        await asyncio.to_thread(conn.sendall, encode(Request(id=7, action=Action.ADD_CONFIG, path=str(fifo))))
        frames, reply = FrameReader(), None
        while reply is None:
            data = await asyncio.to_thread(conn.recv, 1 << 16)
            assert data, "the server closed the connection"
            reply = next((m for m in frames.feed(data) if isinstance(m, Reply)), None)
        replied.set()
        assert not reply.ok and "not a regular file" in reply.text
    finally:
        replied.set()
        conn.close()
        await server.close()


async def test_the_history_in_short_is_read_at_start_in_pieces(held, sock, monkeypatch):
    # Regression: start-up read all of events.jsonl into memory at once (gigabytes for a long run).
    for i in range(200):
        held.publish_event(StepMetrics(pipeline="p", epoch=0, step=i, loss=0.5, lr=0.1, samples_per_s=1.0))
        if i % 50 == 0:
            held.publish_event(Notice(text="x" * (i + 1)))
    held.events_written()  # out of the buffer, onto the disk
    whole = HistorySummary()
    whole.add_file((held.run_dir / "events.jsonl").read_bytes())
    monkeypatch.setattr(server_module, "READ_AT_START", 97)  # bytes: every line cut somewhere
    server = ControlServer(held, sock)
    await server.start()
    try:
        assert server.summary.data() == whole.data() and server.summary.steps_seen == 200
    finally:
        await server.close()
