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
from ..protocol.records import _TYPES, RecordError, from_record
from .lines import Unreadable

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


def _slow(line: bytes) -> Event | bool | None:
    """The event a line holds; None for a line that is no event of this version (a command's record, a type it
    does not know), False for one nobody can read (not a JSON object, fields not of their types)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return False
    if not isinstance(record, dict):
        return False
    try:
        event = from_record(record)
    except RecordError:
        kind = record.get("type")
        return False if isinstance(kind, str) and kind in _TYPES else None
    return event if isinstance(event, Event) else None


def _decode_line(line: bytes, add: Callable[[Event], object]) -> bool:
    """Add the event `line` holds, if it is one; False for a line nobody can read."""
    decoder = None
    if line.startswith(_PREFIX):
        end = line.find(b'"', _START)
        decoder = _decoder(line[_START:end]) if end > 0 else None
    if decoder is not None:
        try:
            add(decoder.decode(line))
            return True
        except msgspec.DecodeError:
            pass
    event = _slow(line)
    if event is False:
        return False
    if event is not None and event is not True:
        add(event)
    return True


def _decode_steps(lines: list[bytes], events: list[Event]) -> int:
    """A run of step lines in one msgspec call (most of a live stream: no Python per line); a run that call
    refuses (a NaN loss written as null, a torn last line) line by line. Returns the lines nobody can read."""
    try:
        events += _STEPS.decode_lines(b"\n".join(lines))
        return 0
    except msgspec.DecodeError:
        return sum(not _decode_line(line, events.append) for line in lines)


def decode_lines(data: bytes) -> list[Event]:
    """The events in `data`, whole lines of events.jsonl; a torn last line is left out."""
    return _decode(data)[0]


def decode_stretch(data: bytes) -> tuple[list[Event], bool]:
    """`decode_lines`, and whether every line was a step report (then no event in it changes a status)."""
    events, steps_only, _ = _decode(data)
    return events, steps_only


def _decode(data: bytes) -> tuple[list[Event], bool, int]:
    """`decode_stretch`, and how many lines nobody can read were skipped."""
    if data.startswith(_STEP) and data.endswith(b"\n"):  # most of a live stream: all step reports, one call
        try:
            steps = _STEPS.decode_lines(data)
        except msgspec.DecodeError:
            steps = []  # line by line, below
        # A JSON string escapes its newlines, so STEP after a newline starts a line: as many as lines decoded
        # (msgspec ignores the tag; a line of another type that decodes as a step report is one more).
        if steps and len(steps) == data.count(_NEXT_STEP) + 1:
            return cast("list[Event]", steps), True, 0  # step reports, each an event
    events: list[Event] = []
    run: list[bytes] = []
    bad = 0
    for line in data.split(b"\n"):
        if line.startswith(_STEP):
            run.append(line)
            continue
        if run:
            bad += _decode_steps(run, events)
            run = []
        if line.strip():
            bad += not _decode_line(line, events.append)
    if run:
        bad += _decode_steps(run, events)
    return events, False, bad


def decode_history(data: bytes, unreadable: Unreadable | None = None, path: str = "events.jsonl") -> list[Event]:
    """`decode_lines` for a history, which is kept whole: the collector waits until it is decoded (each
    collection in the middle of it would walk the events decoded so far again: a third of the time). Lines
    nobody can read are counted in `unreadable` under `path`."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        events, _, bad = _decode(data)
    finally:
        if collecting:
            gc.enable()
    if unreadable is not None:
        unreadable.add(path, bad)
    return events


def read_history(run_dir: Path, limit: int | None = None, unreadable: Unreadable | None = None) -> list[Event]:
    """The events in the first `limit` bytes of a run's events.jsonl (all of it when None); lines nobody can
    read are skipped and counted in `unreadable`."""
    path = Path(run_dir) / "events.jsonl"
    try:
        with open(path, "rb") as fh:
            data = fh.read() if limit is None else fh.read(limit)
    except OSError:
        return []
    if limit is None and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]  # a line still being written
    return decode_history(data, unreadable, str(path))
