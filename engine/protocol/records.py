"""Messages as the JSON records of `events.jsonl` and `telemetry.jsonl`, and back.

`to_record` flattens a message into JSON-ready primitives with its `type` first;
`from_record` rebuilds it by that tag, every field checked against its declared type (`typed`): a file or a
peer may hold anything, and a record that does not fit is a RecordError, never a message of wrong fields.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, TypeVar

import msgspec

from . import control, health, telemetry  # noqa: F401  (their events are in events.jsonl too)
from .jsonvalue import JsonObject
from .messages import Message
from .old_records import upgraded

_TYPES: dict[str, type[Message]] = {}
M = TypeVar("M", bound=Message)


class RecordError(ValueError):
    """A record that is no message of this version: an unknown type, or fields not of their declared types."""


def _register(cls: type[Message]) -> None:
    for sub in cls.__subclasses__():
        _TYPES[sub.type] = sub
        _register(sub)


_register(Message)


def to_record(msg: Message) -> dict[str, Any]:
    """The JSON-ready dict of a message, with its `type` first."""
    record: dict[str, Any] = {"type": msg.type}
    for f in dataclasses.fields(msg):
        record[f.name] = _plain(getattr(msg, f.name))
    return record


def _plain(value: object) -> object:
    """A field in JSON-ready form: tuples become lists, nested dataclasses dicts."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def from_record(record: JsonObject) -> Message:
    """Rebuild a message from `to_record` output (or an older version's, brought up to date); unknown fields are
    ignored, and a field not of its declared type is a RecordError."""
    record = upgraded(record)
    kind = record.get("type")
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise RecordError(f"unknown message type {str(kind)[:80]!r}")
    return typed(cls, record)


def typed(cls: type[M], fields: object) -> M:
    """`cls` from a dict of its fields (a `type` key and fields it does not have are ignored), each of its declared
    type; a null where a float belongs is NaN, as events.jsonl writes NaN as null. RecordError if they do not fit."""
    if not isinstance(fields, dict):
        raise RecordError(f"{cls.type}: not a record")
    hints = _hints(cls)  # type: ignore[arg-type]  # mypy reads a dataclass's __hash__ = None as its class's
    fields = {k: _lenient(hints.get(k), v) for k, v in fields.items() if k != "type"}
    try:
        return msgspec.convert(fields, cls, strict=False)
    except (msgspec.ValidationError, RecursionError, TypeError) as exc:
        raise RecordError(f"{cls.type}: {exc}") from None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: msgspec reads it, or refuses the record
        return {}


def _lenient(hint: object, value: object) -> object:
    """A field's value as a writer may have meant it: null for a float is NaN, and a metric that is not a
    number (a path, a string) is left out of its dict rather than losing the whole report."""
    if value is None and hint is float:
        return math.nan
    if hint == dict[str, float] and isinstance(value, dict):
        return {k: v for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return value


def message_types() -> dict[str, type[Message]]:
    """Every known `type` tag and its class."""
    return dict(_TYPES)
