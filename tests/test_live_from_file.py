"""A live client reads the run's events from events.jsonl, as far as the supervisor says it is written: in
pieces of at most READ_AT_ONCE (a line longer than that whole), every event once and in order, and what the
file does not keep (telemetry) from the socket after the file's events told of before it."""
from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from tests.test_service import apoll
from torchherd.engine.protocol.control import Appended, Hello
from torchherd.engine.protocol.messages import Notice, StepMetrics
from torchherd.engine.rundir.directory import RunDirectory
from torchherd.engine.rundir.lines import encode_line
from torchherd.engine.serve import remote
from torchherd.engine.serve.remote import RemoteRun
from torchherd.engine.serve.runtime import publish, withdraw
from torchherd.engine.serve.server import ControlServer
from torchherd.engine.serve.wire import FrameReader, encode


class FileRun:
    """What a ControlServer asks of its supervisor, over a real RunDirectory: events come from the test."""

    run_id = "live"

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

    def publish(self, event, kept: bool = True) -> None:
        line = encode_line(event)
        if kept:
            self.dir.write(event, line)  # step reports wait in its buffer, as a supervisor's do
        for tap in self.taps:
            tap(event, line, kept)


@pytest.fixture
def sock():
    folder = Path(tempfile.mkdtemp(prefix="th-test-"))  # AF_UNIX paths hold at most 107 bytes
    yield folder / "c.sock"
    shutil.rmtree(folder, ignore_errors=True)


def _step(i: int) -> StepMetrics:
    return StepMetrics(pipeline="p", epoch=0, step=i, loss=1.0 / i, lr=0.1, samples_per_s=1.0)


async def test_a_client_reads_the_file_in_pieces_and_gets_telemetry_after_what_came_before_it(tmp_path, sock,
                                                                                                 monkeypatch):
    monkeypatch.setattr(remote, "READ_AT_ONCE", 512)  # a few lines a read: the run below is a hundred reads
    run = FileRun(tmp_path / "run")
    run.publish(_step(1))  # before the client: its history, not its live stream
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
            run.publish(event)
        telemetry = Notice(pipeline="p", level="info", text="not kept: from the socket")
        run.publish(telemetry, kept=False)
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
        run.dir.close()


async def test_a_client_that_reads_nothing_holds_one_appended_frame_however_long_the_run(tmp_path, sock):
    run = FileRun(tmp_path / "run")
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
            run.publish(_step(i))
            server._send()
        assert conn.backlog() < 200, conn.backlog()  # the newest `appended`, and at most a part of one more
        # Read at last, it says where the file ends: nothing it was told was lost by keeping only the newest.
        frames, told = FrameReader(), []

        def read_to_the_end() -> None:
            client.settimeout(30)
            while data := client.recv(1 << 16):
                told.extend(m.events_bytes for m in frames.feed(data) if isinstance(m, Appended))
        reading = asyncio.ensure_future(asyncio.to_thread(read_to_the_end))
        await server.close()  # the loop goes on while the client reads: what is held is written, then the end
        await asyncio.wait_for(reading, 60)
        assert told and told[-1] == run.dir.written() and len(told) < 100, (told[-3:], run.dir.written())
    finally:
        client.close()
        run.dir.close()
