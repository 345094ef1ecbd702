"""Frames on a control socket: each message as msgpack (msgspec, typed both ways), tagged with its `type`
and prefixed by its length; and the peer-credential check every connection passes first.

msgspec encodes the messages' dataclasses as they are and decodes each into its own class with its
field types checked, so no message is hand-built as a dict, and a frame that is not one is an error.
"""
from __future__ import annotations

import functools
import os
import socket
import struct

import msgspec

from ..protocol import control  # noqa: F401  (registers the socket's own messages)
from ..protocol.messages import Message

HEADER = struct.Struct("!I")
MAX_FRAME = 64 << 20  # bytes: a frame this big is a broken or hostile peer, not a message

_encoder = msgspec.msgpack.Encoder()
_envelope = msgspec.msgpack.Decoder(tuple[str, msgspec.Raw])


class FrameError(ValueError):
    """Bytes that are not a frame of a known message."""


@functools.cache
def _types() -> dict[str, type[Message]]:
    found: dict[str, type[Message]] = {}
    stack = [Message]
    while stack:
        for sub in stack.pop().__subclasses__():
            found[sub.type] = sub
            stack.append(sub)
    return found


@functools.cache
def _decoder(cls: type[Message]) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(cls)


def encode(msg: Message) -> bytes:
    """One message as a whole frame: length, then msgpack of (type, fields)."""
    body = _encoder.encode((msg.type, msg))
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Message:
    """A frame's body (without its length) back into its message."""
    try:
        tag, raw = _envelope.decode(body)
        cls = _types().get(tag)
        if cls is None:
            raise FrameError(f"unknown message type {tag!r}")
        return _decoder(cls).decode(raw)  # type: ignore[arg-type]  # mypy reads __hash__ = None as the class's
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise FrameError(str(exc)) from None
    except RecursionError:  # msgpack nested deeper than the decoder's stack: no message is
        raise FrameError("nested too deep") from None


class FrameReader:
    """Turns the bytes of a stream, as they arrive in any pieces, into messages."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame  # bytes: the longest frame this side ever expects

    @property
    def partial(self) -> int:
        """Bytes of a frame begun but not yet whole."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        pos = 0
        while len(self._buf) - pos >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf, pos)
            if size > self.max_frame:
                raise FrameError(f"a frame of {size} bytes (at most {self.max_frame})")
            if len(self._buf) - pos - HEADER.size < size:
                break
            start = pos + HEADER.size
            out.append(decode(bytes(self._buf[start:start + size])))
            pos = start + size
        del self._buf[:pos]
        return out


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected AF_UNIX socket, from the kernel."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def same_user(uid: int) -> bool:
    """Whether a peer's uid is this process's: the only user a run's socket answers."""
    return uid == os.getuid()
