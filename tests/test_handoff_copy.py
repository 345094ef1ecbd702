"""The hand-off's copy engines and its one-copy-in-flight state machine, on the CPU.

A scripted engine stands in for CUDA's: its copies land when the test says so, so in flight, published,
dropped while in flight and failed are each driven by hand. The real CPU engine is tested beside it.
"""
from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from torchherd.engine.config.schema import ValidationConfig
from torchherd.engine.protocol.messages import Notice, SnapshotTaken
from torchherd.engine.worker import snapshot
from torchherd.engine.worker.copy_engine import (BLOCKING, DIRECT, HOST, STAGED, Copy, CopyEngine, HostCopy,
                                                 copy_mode)
from torchherd.engine.worker.handoff import HandOff
from torchherd.engine.worker.snapshot import IN_FLIGHT, SnapshotReader, SnapshotWriter

WAIT = 10.0  # seconds: a bound on waiting for the publisher thread, never a pause


class ScriptedCopy:
    """A copy whose bytes are in the slot at once but which counts as running until `land()` (or `fail()`)."""

    def __init__(self) -> None:
        self._landed = threading.Event()
        self.error: BaseException | None = None

    def land(self) -> None:
        self._landed.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._landed.set()

    def done(self) -> bool:
        return self._landed.is_set() and self.error is None

    def wait(self) -> None:
        self._landed.wait()
        if self.error is not None:
            raise self.error


class ScriptedEngine:
    """CopyEngine with CUDA's shape: copies that the test completes, and staging memory it reports."""

    name = "scripted"

    def __init__(self, tensors, slots, views, staging_bytes: int = 0, notices=()):
        self.tensors, self.views = tensors, views
        self.staging_bytes = staging_bytes
        self.notices = list(notices)
        self.copies: list[ScriptedCopy] = []
        self.closed = False

    def start(self, slot: int) -> Copy:
        assert not self.copies or self.copies[-1]._landed.is_set(), "two copies in flight"
        torch._foreach_copy_(self.views[slot], self.tensors)
        self.copies.append(ScriptedCopy())
        return self.copies[-1]

    def close(self) -> None:
        self.closed = True


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def scripted_writer(tmp_path, m, **engine_args) -> tuple[SnapshotWriter, ScriptedEngine]:
    made = []

    def make(tensors, slots, views):
        made.append(ScriptedEngine(tensors, slots, views, **engine_args))
        return made[0]

    writer = SnapshotWriter(tmp_path / "p", m, 2, "latest", False, {}, make_engine=make)
    return writer, made[0]


def loaded_equal(reader: SnapshotReader, m: nn.Module) -> bool:
    found = reader.newest()
    assert found is not None
    copy = model()
    assert reader.load_into(copy, found[0]) is not None
    return all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), m.state_dict().values()))


def test_the_scripted_engine_has_the_real_engines_interface():
    tensors = list(model().state_dict().values())
    host = HostCopy(tensors, [[torch.empty_like(t) for t in tensors]])
    assert isinstance(host, CopyEngine) and isinstance(ScriptedEngine(tensors, [], []), CopyEngine)
    assert isinstance(host.start(0), Copy) and isinstance(ScriptedCopy(), Copy)


def test_cpu_weights_use_the_host_copy_and_round_trip_exactly(tmp_path):
    m = model()
    writer = SnapshotWriter(tmp_path / "p", m, 2, "latest", False, {}, staging=False)
    assert writer.engine.name == HOST and writer.engine.staging_bytes == 0 and writer.opening_notices() == []
    info = writer.hand_off(epoch=0, step=5)
    assert info["dropped"] is False and info["reason"] == ""
    reader = SnapshotReader(tmp_path / "p")
    assert reader.meta["copy"] == HOST and reader.meta["staging_bytes"] == 0
    assert loaded_equal(reader, m)
    writer.close()


def test_copy_modes_by_where_the_weights_live():
    cpu, c0, c1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert copy_mode([cpu, cpu], staging=True) == HOST
    assert copy_mode([c0, c0], staging=True) == STAGED
    assert copy_mode([c0, c0], staging=False) == DIRECT  # handoff_staging = false
    assert copy_mode([c0, c1], staging=True) == BLOCKING  # several GPUs: the blocking copy of old
    assert copy_mode([c0, cpu], staging=True) == BLOCKING
    assert copy_mode([torch.device("meta")], staging=True) == BLOCKING


def test_a_copy_in_flight_is_published_only_once_it_lands(tmp_path):
    m = model()
    writer, engine = scripted_writer(tmp_path, m)
    info = writer.hand_off(epoch=1, step=10)
    assert info["dropped"] is False and info["slot"] >= 0
    reader = SnapshotReader(tmp_path / "p")
    assert writer.in_flight() and reader.newest() is None  # the bytes may be torn until the copy lands
    engine.copies[0].land()
    assert writer.flush(WAIT)
    assert not writer.in_flight()
    found = reader.newest()
    assert found is not None and found[1] == info["seq"]
    loaded = reader.load_into(model(), found[0])
    assert loaded is not None and (loaded.epoch, loaded.step) == (1, 10)
    writer.close()


def test_a_hand_off_while_a_copy_is_in_flight_is_dropped_and_the_next_goes_ahead(tmp_path):
    m = model()
    writer, engine = scripted_writer(tmp_path, m)
    first = writer.hand_off(epoch=0, step=1)
    second = writer.hand_off(epoch=0, step=2)
    assert second["dropped"] is True and second["slot"] == -1 and second["reason"] == IN_FLIGHT
    assert second["seq"] == first["seq"] + 1 and len(engine.copies) == 1  # never two copies in flight
    engine.copies[0].land()
    assert writer.flush(WAIT)
    with torch.no_grad():
        m[0].weight.add_(1.0)
    third = writer.hand_off(epoch=0, step=3)
    assert third["dropped"] is False and third["slot"] != first["slot"]
    engine.copies[1].land()
    assert writer.flush(WAIT)
    reader = SnapshotReader(tmp_path / "p")
    assert reader.newest()[1] == third["seq"] and loaded_equal(reader, m)
    writer.close()


def test_close_publishes_the_copy_still_in_flight(tmp_path):
    m = model()
    writer, engine = scripted_writer(tmp_path, m)
    writer.hand_off(epoch=2, step=20)
    reader = SnapshotReader(tmp_path / "p")
    seen = []
    closing = threading.Thread(target=lambda: (writer.close(), seen.append(reader.newest())))
    closing.start()
    engine.copies[0].land()
    closing.join(WAIT)
    assert not closing.is_alive() and seen and seen[0] is not None and seen[0][1] == 1
    assert engine.closed


def test_a_failed_copy_frees_its_slot_and_is_raised_at_the_next_hand_off(tmp_path):
    m = model()
    writer, engine = scripted_writer(tmp_path, m)
    info = writer.hand_off(epoch=0, step=1)
    engine.copies[0].fail(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert writer.flush(WAIT)
    row = writer.header[info["slot"]]
    assert row[snapshot.VERSION] % 2 == 0 and row[snapshot.SEQ] == 0  # free, and no reader takes it
    assert SnapshotReader(tmp_path / "p").newest() is None
    with pytest.raises(RuntimeError, match="illegal memory access"):
        writer.hand_off(epoch=0, step=2)
    after = writer.hand_off(epoch=0, step=3)  # raised once; hand-offs go on
    assert after["dropped"] is False
    engine.copies[-1].land()
    writer.close()


# Regression: a worker killed while copying left its slot's version odd, and the next attempt's copy into
# that slot made it even, so a reader could take the slot while it was being written.
def test_a_slot_left_mid_copy_by_a_dead_worker_is_freed_by_the_next_one(tmp_path):
    m = model()
    writer, engine = scripted_writer(tmp_path, m)
    info = writer.hand_off(epoch=0, step=1)  # never lands: the worker dies here
    assert writer.header[info["slot"], snapshot.VERSION] % 2 == 1
    again = SnapshotWriter(tmp_path / "p", m, 2, "latest", False, {})
    assert again.header[info["slot"], snapshot.VERSION] % 2 == 0 and again.header[info["slot"], snapshot.SEQ] == 0
    engine.copies[0].land()
    writer.close()
    again.close()


class Recorder:
    """A StatusSender that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, event) -> None:
        self.sent.append(event)


def test_handoff_passes_handoff_staging_and_says_what_staging_costs(tmp_path, monkeypatch):
    asked = []

    def engine_for(tensors, slots, views, staging):
        asked.append(staging)
        return ScriptedEngine(tensors, slots, views, staging_bytes=3 * 2**20 if staging else 0,
                              notices=["the snapshot slots could not be page-locked"])

    monkeypatch.setattr(snapshot, "engine_for", engine_for)
    assert ValidationConfig().handoff_staging is True
    for staging in (True, False):
        sender = Recorder()
        validation = ValidationConfig(mode="background", handoff_staging=staging)
        handoff = HandOff("a", sender, validation, tmp_path / f"p-{staging}", seq=0)
        handoff.open(model(), {})
        notices = [(n.level, n.text) for n in sender.sent if isinstance(n, Notice)]
        assert ("warning", "the snapshot slots could not be page-locked") in notices
        staged = [t for level, t in notices if level == "info" and "3.0 MiB staging buffer" in t]
        assert bool(staged) is staging
        handoff.hand_off(epoch=0, step=1)
        handoff.hand_off(epoch=0, step=2)  # the first copy is still in flight
        taken = [e for e in sender.sent if isinstance(e, SnapshotTaken)]
        assert [t.dropped for t in taken] == [False, True] and taken[1].reason == IN_FLIGHT
        warned = [n.text for n in sender.sent if isinstance(n, Notice) and "dropped" in n.text]
        assert warned == [f"snapshot of epoch 1 step 2 dropped: {IN_FLIGHT}"]
        handoff.writer.engine.copies[0].land()
        handoff.close()
    assert asked == [True, False]
