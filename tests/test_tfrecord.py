"""The event files torchherd encodes by hand: TensorBoard's own reader (which checks every record's CRC) gets
back each scalar with its step and time, and the HParams summary travels whole."""
from __future__ import annotations

import pytest

from torchherd.engine.rundir.tfrecord import EventFile

pytest.importorskip("tensorboard")


def read_file(path):
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    return list(LegacyEventFileLoader(str(path)).Load())  # parsed as written, CRCs checked


def test_tensorboard_reads_back_every_scalar_with_its_step_and_time(tmp_path):
    w = EventFile(tmp_path / "p")
    w.scalars([("train/loss", 0.25), ("train/lr", 1e-3)], 7, 1_700_000_000.5)
    w.scalars([("train/loss", -3.5), ("epoch/train_loss", 1e30)], 2**40 + 3, 1_700_000_001.25)
    w.scalars([("val/ünïcode", 2.0)], 0, 1.0)
    w.scalars([], 9, 1.0)  # nothing to say: no event
    w.close()
    events = read_file(w.path)
    assert events[0].file_version == "brain.Event:2"
    got = [(e.wall_time, e.step, [(v.tag, v.simple_value) for v in e.summary.value]) for e in events[1:]]
    assert got == [(1_700_000_000.5, 7, [("train/loss", 0.25), ("train/lr", pytest.approx(1e-3))]),
                   (1_700_000_001.25, 2**40 + 3, [("train/loss", -3.5), ("epoch/train_loss", pytest.approx(1e30))]),
                   (1.0, 0, [("val/ünïcode", 2.0)])]


def test_a_summary_message_is_written_whole(tmp_path):
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag="hparams/x", simple_value=1.5)])
    w = EventFile(tmp_path / "p")
    w.summary(summary, 3, 10.0)
    w.flush()
    (event,) = read_file(w.path)[1:]  # flushed: readable while the file is still open
    assert (event.step, event.wall_time, event.summary) == (3, 10.0, summary)
    w.close()
