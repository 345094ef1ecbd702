"""The control socket's rule for dropping clients, on real sockets: a burst written in one turn drops no
client that reads it, while a client that reads nothing is dropped once its backlog has passed a quarter of
the bound for `stalled` seconds; past the bound it goes at once. What the socket carries itself is what
events.jsonl does not keep (telemetry): the lines here are that."""
from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from tests.test_service import apoll
from torchherd.engine.protocol.control import EventLines, Hello
from torchherd.engine.protocol.messages import Notice, StepMetrics
from torchherd.engine.rundir.lines import encode_line
from torchherd.engine.serve.server import ControlServer
from torchherd.engine.serve.wire import FrameReader, encode

LINE = encode_line(StepMetrics(pipeline="p", epoch=0, step=1, loss=0.5, lr=0.1, samples_per_s=1.0))


class HeldRun:
    """What a ControlServer asks of its supervisor, for a run that trains nothing: events come from the test."""

    run_id = "drops"

    def __init__(self, run_dir: Path):
        self.run_dir, self.taps, self.recorded = run_dir, [], []

    def tap(self, fn, steps=None) -> None:
        self.taps.append(fn)

    def record(self, event) -> None:
        self.recorded.append(event)

    def events_written(self) -> int:
        return 0

    def views(self) -> list:
        return []

    def publish(self, lines: int) -> None:
        event = StepMetrics(pipeline="p", epoch=0, step=1, loss=0.5, lr=0.1, samples_per_s=1.0)
        for _ in range(lines):
            for tap in self.taps:
                tap(event, LINE, False)  # not kept in events.jsonl: sent on the socket


@pytest.fixture
def held(tmp_path):
    return HeldRun(tmp_path)


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
