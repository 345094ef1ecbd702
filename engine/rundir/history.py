"""A run's events read back fast: each line of events.jsonl decoded straight into its class by msgspec,
and a line that path cannot take (a NaN loss written as null, a field from another version) by the exact
one, `records.from_record`; types this version does not know are skipped, as `read_events` skips them.
"""
from __future__ import annotations

import functools
import gc
import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import msgspec

from ..protocol.messages import Event, Notice, PipelineFinished, StepMetrics
from ..protocol.records import _TYPES, from_record

_PREFIX = b'{"type":"'
_START = len(_PREFIX)
_STEP = b'{"type":"step",'  # how every step report's line starts (the tag first, as encode_line writes it)
_NEXT_STEP = b"\n" + _STEP
_STEPS = msgspec.json.Decoder(StepMetrics)  # its decode_lines: step lines as they are, blank ones skipped


@functools.cache
def _decoder(tag: bytes) -> msgspec.json.Decoder | None:
    """The decoder of the event type `tag` names; None for a type that is not an event of this version."""
    cls = _TYPES.get(tag.decode(errors="replace"))
    if cls is PipelineFinished or cls is Notice:  # rare, perhaps an older version's: the exact path upgrades them
        return None
    return msgspec.json.Decoder(cls) if cls is not None and issubclass(cls, Event) else None


def _slow(line: bytes) -> Event | None:
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            return None
        for k in ("loss", "train_loss"):
            if k in record and record[k] is None:
                record[k] = float("nan")
        event = from_record(record)
    except (ValueError, TypeError, RecursionError):  # not JSON, not UTF-8, nested too deep, fields that fit not
        return None
    return event if isinstance(event, Event) else None


def _decode_line(line: bytes, add: Callable[[Event], object]) -> None:
    decoder = None
    if line.startswith(_PREFIX):
        end = line.find(b'"', _START)
        decoder = _decoder(line[_START:end]) if end > 0 else None
    if decoder is not None:
        try:
            add(decoder.decode(line))
            return
        except msgspec.DecodeError:
            pass
    event = _slow(line)
    if event is not None:
        add(event)


def _decode_steps(lines: list[bytes], events: list[Event]) -> None:
    """A run of step lines in one msgspec call (most of a live stream: no Python per line); a run that call
    refuses (a NaN loss written as null, a torn last line) line by line."""
    try:
        events += _STEPS.decode_lines(b"\n".join(lines))
    except msgspec.DecodeError:
        for line in lines:
            _decode_line(line, events.append)


def decode_lines(data: bytes) -> list[Event]:
    """The events in `data`, whole lines of events.jsonl; a torn last line is left out."""
    return decode_stretch(data)[0]


def decode_stretch(data: bytes) -> tuple[list[Event], bool]:
    """`decode_lines`, and whether every line was a step report (then no event in it changes a status)."""
    if data.startswith(_STEP) and data.endswith(b"\n"):  # most of a live stream: all step reports, one call
        try:
            steps = _STEPS.decode_lines(data)
        except msgspec.DecodeError:
            steps = []  # line by line, below
        # A JSON string escapes its newlines, so STEP after a newline starts a line: as many as lines decoded
        # (msgspec ignores the tag; a line of another type that decodes as a step report is one more).
        if steps and len(steps) == data.count(_NEXT_STEP) + 1:
            return cast("list[Event]", steps), True  # step reports, each an event
    events: list[Event] = []
    run: list[bytes] = []
    for line in data.split(b"\n"):
        if line.startswith(_STEP):
            run.append(line)
            continue
        if run:
            _decode_steps(run, events)
            run = []
        if line:
            _decode_line(line, events.append)
    if run:
        _decode_steps(run, events)
    return events, False


def decode_history(data: bytes) -> list[Event]:
    """`decode_lines` for a history, which is kept whole: the collector waits until it is decoded (each
    collection in the middle of it would walk the events decoded so far again: a third of the time)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return decode_lines(data)
    finally:
        if collecting:
            gc.enable()


def read_history(run_dir: Path, limit: int | None = None) -> list[Event]:
    """The events in the first `limit` bytes of a run's events.jsonl (all of it when None)."""
    try:
        with open(Path(run_dir) / "events.jsonl", "rb") as fh:
            data = fh.read() if limit is None else fh.read(limit)
    except OSError:
        return []
    if limit is None and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]  # a line still being written
    return decode_history(data)
