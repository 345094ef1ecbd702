"""`RayHandle`: one attempt running as a Ray actor's child, as the supervisor sees it.

Commands wait in it until the child dials back; from then on the connection is read as a local worker's
pipe is (`ChannelHandle`). Its signals go to the actor, which passes them to the child's process group.
"""
from __future__ import annotations

import os
import signal
import socket
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

from ...protocol.messages import Event, Notice
from ...protocol.names import Intent
from ..channel_handle import ChannelHandle

if TYPE_CHECKING:
    from ray import ObjectRef

    from .actor import Started
    from .placement import ClusterInventory


class HandleOwner(Protocol):
    """What a handle asks of the launcher that made it (launcher.py's RayLauncher)."""

    @property
    def inventory(self) -> ClusterInventory:
        """The cluster's devices, to name a node in people's words."""
        ...

    def why_lost(self, handle: RayHandle, exc: BaseException) -> str:
        """People's words for an actor that died without its child reporting an exit."""
        ...

    def ended(self, handle: RayHandle) -> None:
        """The attempt is over: its room frees and its actor ends."""
        ...


class RayHandle(ChannelHandle):
    """One attempt running as a Ray actor's child, as the supervisor sees it.

    Until the child dials back, commands wait here (as they would in a pipe) and there is nothing
    to read; from then on the connection is read exactly as a local worker's pipe is.
    """

    def __init__(self, launcher: HandleOwner, key: str, name: str, actor: Any, node_id: str, label: str):
        super().__init__()  # no channel yet: see `connected`
        self._launcher, self.key, self.name, self.actor = launcher, key, name, actor
        self._node_id = node_id
        self.label = launcher.inventory.label(node_id)
        self.node = label  # "" when it runs on this machine's node
        self.pid = 0  # known once the actor has started the child
        self.actor_pid = 0
        self.token = ""
        self._start_ref: ObjectRef[Started] | None = None  # once started
        self._exit_ref: ObjectRef[int] | None = None
        self._code: int | None = None
        self.cause: Intent | None = None  # NODE_LEFT: classified by the lifecycle (BY_INTENT), not a crash
        self._lost = ""  # why the actor died under us, for people

    @property
    def node_id(self) -> str:
        """Ray's id of the node it runs on: telemetry asks that node's sampler for its processes."""
        return self._node_id

    def started(self, start_ref: ObjectRef[Started], exit_ref: ObjectRef[int]) -> None:
        self._start_ref, self._exit_ref = start_ref, exit_ref

    # ------------------------------------------------------------ channel

    def connected(self, sock: socket.socket) -> None:
        """The child dialled back with our token: the connection becomes its status and control channel."""
        if self._closed:
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fd = sock.detach()
        # Both ends share one non-blocking file description: a stuck child never blocks the loop.
        self.open_channel(Connection(fd, writable=False), Connection(os.dup(fd), readable=False))
        if self._on_events is not None:  # where it runs, for people (the launch said only which slot)
            self._on_events([Notice(pipeline="" if self.name == "validator" else self.name, level="info",
                                    text=f"{self.name} runs on node {self.label} (Ray)")])
        self._readable()  # it may have written before we looked

    def drain(self) -> list[Event]:
        events = super().drain()
        if self._lost:
            events.append(Notice(pipeline=self.name if self.name != "validator" else "", level="error",
                                 text=self._lost))
            self._lost = ""
        return events

    # ------------------------------------------------------------ the actor

    def _resolve_start(self) -> None:
        import ray

        if self.pid or self._start_ref is None or not ray.wait([self._start_ref], timeout=0)[0]:
            return
        try:
            info = ray.get(self._start_ref)
        except Exception:  # the actor died or start failed: poll() reports it from the exit ref
            self._start_ref = None
            return
        self.pid, self.actor_pid = info["pid"], info["actor_pid"]

    @property
    def pids(self) -> tuple[int, ...]:
        self._resolve_start()
        return (self.pid,) if self.pid else ()

    def poll(self) -> int | None:
        import ray

        if self._code is not None:
            return self._code
        self._resolve_start()
        if not ray.wait([self._exit_ref], timeout=0)[0]:
            return None
        assert self._exit_ref is not None  # ray.wait took it: an object ref, not None
        try:
            self._code = int(ray.get(self._exit_ref))
        except ray.exceptions.RayActorError as exc:
            self._code = -signal.SIGKILL  # its process (or its node) is gone: the child went with it
            self._lost = self._launcher.why_lost(self, exc)
        except ray.exceptions.RayTaskError as exc:
            self._code = 1
            self._lost = f"could not start on {self.node or 'this node'}: {exc.cause!r}"
        return self._code

    def _signal(self, sig: int, group: bool = True) -> None:
        if not self._closed and self._code is None:
            self.actor.signal.remote(int(sig), group)  # fire and forget: a round trip costs milliseconds

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def dump_stacks(self) -> None:
        self._signal(signal.SIGUSR1, group=False)  # faulthandler in the child writes every stack to its log

    def close(self) -> None:
        if self._closed:
            return
        self.close_channel()
        self._launcher.ended(self)
