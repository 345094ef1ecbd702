"""Messages as the JSON records of `events.jsonl` and `telemetry.jsonl`, and back.

`to_record` flattens a message into JSON-ready primitives with its `type` first;
`from_record` rebuilds it by that tag, turning lists back into tuples by the annotations.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from . import control, health, telemetry  # noqa: F401  (their events are in events.jsonl too)
from .jsonvalue import JsonObject
from .messages import Message
from .old_records import upgraded

_TYPES: dict[str, type[Message]] = {}


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
    ignored."""
    record = upgraded(record)
    cls = _TYPES.get(typing.cast(str, record.get("type", "")))  # not a string: no type (a list raises TypeError)
    if cls is None:
        raise ValueError(f"unknown message type {record.get('type')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    hints = _hints(cls)  # type: ignore[arg-type]  # mypy reads a dataclass's __hash__ = None as its class's
    kwargs: dict[str, Any] = {k: _decode(hints.get(k), v) for k, v in record.items() if k in names}  # cls's fields
    return cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: lists still become tuples
        return {}


def _decode(hint: object, value: object) -> object:
    """Undo `_plain` by the field's annotation: lists become tuples, dicts dataclasses."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`
        hint = next((a for a in typing.get_args(hint) if a is not type(None)), None)
    if isinstance(value, list):
        args = typing.get_args(hint)  # tuple[X, ...] -> (X, Ellipsis)
        return tuple(_decode(args[0] if args else None, v) for v in value)
    if isinstance(value, dict) and isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = _hints(hint)
        return hint(**{k: _decode(hints.get(k), v) for k, v in value.items() if k in hints})
    return value


def message_types() -> dict[str, type[Message]]:
    """Every known `type` tag and its class."""
    return dict(_TYPES)
