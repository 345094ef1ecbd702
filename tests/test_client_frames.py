"""The frames between torchherd.client and the script runner: a bounded line reader, and fields checked for their
types, so that no line a script (or a bug in one) sends ends the runner's reader thread."""
from __future__ import annotations

import json
import socket
import types
import threading

import pytest

from torchherd import client_frames as wire
from torchherd.engine.protocol.messages import EpochEnd, Notice, StepMetrics
from torchherd.engine.runners.script.events import ScriptEvents
from torchherd.engine.runners.script.frames import ClientFrames


class Sent:
    """A status sender that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list = []

    def send(self, event) -> None:
        self.events.append(event)


class Reading(ClientFrames):
    """The runner's half of the client socket, with only what its frames touch."""

    def __init__(self, sock: socket.socket):
        self.sock, self._sock_lock, self.client = sock, threading.Lock(), False
        self.name, self.sender = "a", Sent()
        self.events = ScriptEvents("a", epochs_total=10)
        self.paused = self.stopping = self.stopped_by_signal = self.polls_stop = self.client_beats = False
        self.client_seen = False
        self.spec = types.SimpleNamespace(rank=0, world_size=1)  # one process: no rank reports its own pace

    def _emit(self, event, loss) -> None:
        self.sender.send(event)


def line(**fields) -> bytes:
    return (json.dumps(fields) + "\n").encode()


def test_frames_of_the_wrong_types_are_left_out_and_the_reader_reads_on():
    # Regression: `metrics=[1]` or `epoch="x"` raised in the runner's reader thread and ended it; the script's
    # next blocking send then stalled its training for good.
    ours, theirs = socket.socketpair()
    runner = Reading(ours)
    reader = threading.Thread(target=runner._read_client, daemon=True)
    reader.start()
    theirs.sendall(line(t="step", step=1, metrics=[1]) + line(t="epoch_end", epoch="x")
                   + line(t="step", step=2, loss={"no": 1}) + line(t="epoch_end", epoch=True)
                   + line(t="step", step=3, loss=0.5) + line(t="epoch_end", epoch=0, step=3, loss=0.5))
    theirs.close()
    reader.join(timeout=30)
    assert not reader.is_alive()  # ended by the close, not by a frame
    kinds = [type(e) for e in runner.sender.events]
    assert kinds == [StepMetrics, EpochEnd]
    assert runner.sender.events[0].step == 3


def test_a_line_without_end_is_never_kept_past_its_bound():
    # Regression: 25 MiB without a newline grew the buffer without bound, re-joined on every chunk: 15 s of CPU.
    reader = wire.LineReader(max_line=1 << 16)
    chunk = b"x" * 4096
    for _ in range(1024):  # 4 MiB in pieces
        assert reader.feed(chunk) == []
        assert len(reader._buf) <= (1 << 16)
    assert reader.feed(b"tail\n" + line(t="beat", step=1)) == [line(t="beat", step=1)[:-1]]
    assert reader.dropped == 1


def test_an_over_long_line_costs_the_runner_a_notice_not_its_reader():
    ours, theirs = socket.socketpair()
    runner = Reading(ours)
    reader = threading.Thread(target=runner._read_client, daemon=True)
    reader.start()
    theirs.sendall(b"y" * (wire.MAX_LINE + 10) + b"\n" + line(t="epoch_end", epoch=0, step=1, loss=1.0))
    theirs.close()
    reader.join(timeout=30)
    notices = [e for e in runner.sender.events if isinstance(e, Notice)]
    assert len(notices) == 1 and "left out" in notices[0].text
    assert [type(e) for e in runner.sender.events if not isinstance(e, Notice)] == [EpochEnd]


@pytest.mark.parametrize("text", [b"[" * 100_000, b'{"t": "step", "metrics": ' + b"[" * 100_000, b"\xff\xfe",
                                  b'{"t": "checkpoint", "path": 3}', b'{"t": "snapshot", "epoch": 1}'],
                         ids=["deep-list", "deep-in-a-frame", "not-utf8", "path-not-text", "fields-missing"])
def test_garbage_is_not_a_frame(text):
    assert wire.decode(text, wire.TO_RUNNER) is None


def test_every_frame_round_trips():
    for frame in (wire.Hello(pid=3), wire.StepReport(step=1, loss=float("nan"), metrics={"lr": 0.1}),
                  wire.Saved(path="/x", epoch=1), wire.Snapshot(epoch=0, step=1, seq=2, slot=0, stall_ms=1.5,
                                                                nbytes=10, checksum=None)):
        decoded = wire.decode(wire.encode(frame)[:-1], wire.TO_RUNNER)
        assert type(decoded) is type(frame)
