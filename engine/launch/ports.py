"""TCP ports held for gangs' rendezvous (MASTER_PORT), so two live gangs of this process never share one.

A gang's rank 0 binds its port only once it has imported torch (seconds later), and until
then the kernel may offer the same port again: this process remembers what it handed out.
"""
from __future__ import annotations

import socket

_held: set[int] = set()  # ports handed to gangs of this process that are still live


def take_port() -> int:
    """A free TCP port for a gang's MASTER_PORT that no other live gang of this process holds."""
    for _ in range(64):
        with socket.socket() as s:
            s.bind(("", 0))  # rank 0's store listens on every interface: the port must be free on all
            port: int = s.getsockname()[1]
        if port not in _held:
            _held.add(port)
            return port
    raise OSError("no free TCP port for the gang's rendezvous")


def hold_port(port: int) -> bool:
    """Hold a port found free elsewhere (on a cluster node) for a gang; False if a live gang holds it."""
    if port in _held:
        return False
    _held.add(port)
    return True


def release_port(port: int) -> None:
    """The gang's attempt is over: its port may be handed out again."""
    _held.discard(port)
