"""The supervisor's end of the dial-back transport: one listening TCP socket that children on other
machines connect to, each opening with its attempt's token.

A launcher asks `expect()` for a fresh token and says what to do with the connection that brings
it; a connection that sends anything else, or nothing within `HELLO_TIMEOUT`, is closed unread, and
no more than `MAX_GREETING` connections wait to say who they are at once (one more is closed at once).
What follows a token is msgpack (protocol/channel.py), never pickle.
Everything runs on the event loop through `add_reader`: nothing here blocks.
"""
from __future__ import annotations

import asyncio
import hmac
import secrets
import socket
from collections.abc import Callable

from ...protocol.channel import TOKEN_CHARS

HELLO_TIMEOUT = 30.0  # seconds a new connection gets to send its token
MAX_GREETING = 64  # connections that have not yet sent a token, held at once: more than a launch wave dials
BACKLOG = 128  # connections the kernel queues before we accept them


class DialBackListener:
    """Accepts children's connections and hands each to whoever expects its token."""

    def __init__(self, host: str):
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(BACKLOG)
        self._sock.setblocking(False)
        port = self._sock.getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._expected: dict[str, Callable[[socket.socket], None]] = {}
        self._greeting: dict[socket.socket, bytearray] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rejected = 0  # connections dropped for a wrong or missing token

    def expect(self, on_connected: Callable[[socket.socket], None]) -> str:
        """A new token; the connection that presents it goes to `on_connected` (once)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a launcher that outlived its loop (tests make many)
            self._loop = loop
            loop.add_reader(self._sock.fileno(), self._accept)
        token = secrets.token_hex(TOKEN_CHARS // 2)
        self._expected[token] = on_connected
        return token

    def forget(self, token: str) -> None:
        """The attempt ended: a late connection with its token is refused."""
        self._expected.pop(token, None)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the child retries nothing, but the loop goes on
                return
            if len(self._greeting) >= MAX_GREETING:  # a flood of silent connections: no room held for it
                self.rejected += 1
                conn.close()
                continue
            conn.setblocking(False)
            self._greeting[conn] = bytearray()
            assert self._loop is not None
            self._loop.add_reader(conn.fileno(), self._hello, conn)
            self._loop.call_later(HELLO_TIMEOUT, self._expire, conn)

    def _hello(self, conn: socket.socket) -> None:
        buf = self._greeting.get(conn)
        if buf is None:
            return
        try:
            data = conn.recv(TOKEN_CHARS - len(buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf += data
        if len(buf) < TOKEN_CHARS:
            return
        self._release(conn)
        # Compare in constant time, as bytes (compare_digest refuses a str with non-ASCII characters): the
        # token is the only thing between the network and our workers.
        token = bytes(buf)
        match = next((t for t in self._expected if hmac.compare_digest(t.encode("ascii"), token)), None)
        if match is None:
            self.rejected += 1
            conn.close()
            return
        self._expected.pop(match)(conn)

    def _expire(self, conn: socket.socket) -> None:
        if conn in self._greeting:
            self._drop(conn)

    def _release(self, conn: socket.socket) -> None:
        del self._greeting[conn]
        assert self._loop is not None
        self._loop.remove_reader(conn.fileno())

    def _drop(self, conn: socket.socket) -> None:
        self.rejected += 1
        self._release(conn)
        conn.close()

    def close(self) -> None:
        """Stop listening and close connections that never said who they were."""
        if self._sock.fileno() < 0:
            return  # closed already
        for conn in list(self._greeting):
            self._release(conn)
            conn.close()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._expected.clear()
