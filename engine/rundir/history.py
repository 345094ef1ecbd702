"""A run's events read back fast: each line of events.jsonl decoded straight into its class by msgspec,
and a line that path cannot take (a NaN loss written as null, a field from another version) by the exact
one, `records.from_record`; types this version does not know are skipped, as `read_events` skips them.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import msgspec

from ..protocol.messages import Event
from ..protocol.records import _TYPES, from_record

_PREFIX = b'{"type":"'
_START = len(_PREFIX)


@functools.cache
def _decoder(tag: bytes) -> msgspec.json.Decoder | None:
    """The decoder of the event type `tag` names; None for a type that is not an event of this version."""
    cls = _TYPES.get(tag.decode(errors="replace"))
    return msgspec.json.Decoder(cls) if cls is not None and issubclass(cls, Event) else None


def _slow(line: bytes) -> Event | None:
    try:
        record = json.loads(line)
        for k in ("loss", "train_loss"):
            if k in record and record[k] is None:
                record[k] = float("nan")
        event = from_record(record)
    except (ValueError, TypeError):
        return None
    return event if isinstance(event, Event) else None


def decode_lines(data: bytes) -> list[Event]:
    """The events in `data`, whole lines of events.jsonl; a torn last line is left out."""
    events: list[Event] = []
    add = events.append
    for line in data.split(b"\n"):
        if not line:
            continue
        decoder = None
        if line.startswith(_PREFIX):
            end = line.find(b'"', _START)
            decoder = _decoder(line[_START:end]) if end > 0 else None
        if decoder is not None:
            try:
                add(decoder.decode(line))
                continue
            except msgspec.DecodeError:
                pass
        event = _slow(line)
        if event is not None:
            add(event)
    return events


def read_history(run_dir: Path, limit: int | None = None) -> list[Event]:
    """The events in the first `limit` bytes of a run's events.jsonl (all of it when None)."""
    try:
        with open(Path(run_dir) / "events.jsonl", "rb") as fh:
            data = fh.read() if limit is None else fh.read(limit)
    except OSError:
        return []
    if limit is None and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]  # a line still being written
    return decode_lines(data)
