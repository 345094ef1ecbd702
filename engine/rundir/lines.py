"""An event as its line of events.jsonl, encoded once by msgspec: the same bytes go to events.jsonl, to the
pipeline's metrics.jsonl and, batched, to every attached client. NaN and infinities become null (as
`directory.dumps` writes them), so every reader can parse the line.
"""
from __future__ import annotations

import os
from typing import Any

import msgspec

from ..protocol.messages import Message


def _fallback(value: Any) -> Any:
    """What msgspec does not encode itself: paths as their text, anything else as its str()."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_fallback)
_heads: dict[type, bytes] = {}


def encode_line(msg: Message) -> bytes:
    """`msg` as one line of events.jsonl (ending in a newline): its `type` first, then its fields in order."""
    cls = type(msg)
    head = _heads.get(cls)
    if head is None:
        head = _heads[cls] = b'{"type":' + _encoder.encode(cls.type)
    body = _encoder.encode(msg)  # b'{"time":...}': a message always has its `time`
    return head + b"," + body[1:] + b"\n"
