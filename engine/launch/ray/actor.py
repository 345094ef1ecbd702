"""What one attempt is on a Ray node: an actor that starts the same child a local run starts, there.

`ChildHost` does on its node what `ProcessLauncher` does on this one: it starts
`python -P -m torchherd.engine.launch.child SPEC` in a session of its own with fds 1 and 2
in the pipeline's log, signals its process group when asked, and reports its exit
status. The actor itself only waits: training runs in the child, so Ray's worker
threads, signal handling and stdout never touch it, and a signal reaches its
DataLoader workers as it does locally. A rank of a GPU gang starts its child once every
rank's actor has named the GPU Ray gave it, and the child sees them all. The actor is
async so that every method runs on one long-lived thread: the child's parent-death
signal is tied to the thread that forked it (the actor dying takes the child with it).
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, TypedDict

from ..environment import visible_devices

if TYPE_CHECKING:
    from ray import ObjectRef

POLL = 0.05  # seconds between looks at the child's exit status


class Started(TypedDict):
    """What `ChildHost.start` answers: the child's pid, its actor's, and where they run."""

    pid: int
    actor_pid: int
    node_id: str
    host: str


class ChildHost:
    """A Ray actor hosting one torchherd child process on its node."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.peers_lost: BaseException | None = None  # a GPU gang's peer actor died before naming its GPU

    async def visible_gpus(self) -> str:
        """The GPU Ray gave this actor, as its CUDA_VISIBLE_DEVICES names it ("" for none)."""
        import ray

        if "CUDA_VISIBLE_DEVICES" in os.environ:
            return os.environ["CUDA_VISIBLE_DEVICES"]
        return visible_devices(ray.get_gpu_ids())  # a cluster that asked Ray not to set it

    async def start(self, module: str, spec_path: str, log_path: str, env: dict[str, str], cwd: str,
                    header: str, snapshot_root: str = "", own_root: bool = False,
                    gang_gpus: list[ObjectRef[str]] | None = None) -> Started:
        """Start the child (first making `snapshot_root` on this node, when given, and with `own_root`
        owning it); returns its pid and where it runs. `gang_gpus`, for a rank of a GPU gang: every rank
        actor's `visible_gpus` (object refs, in rank order); the child sees them all, as under torchrun."""
        import ray

        if snapshot_root:  # snapshots stay in this node's shared memory, for this node's validator
            from .rundir import ensure_root

            ensure_root(snapshot_root, own_root)

        full = dict(os.environ)  # this node's environment (PATH, the venv), not the supervisor's
        for key in [k for k in full if k.startswith("RAY_")]:
            del full[key]  # the child is no Ray worker: nothing of the actor's session leaks into it
        full.update(env)
        if gang_gpus:  # Ray set this actor's GPU alone; its peers' are on this node too
            try:
                full["CUDA_VISIBLE_DEVICES"] = visible_devices([await ref for ref in gang_gpus])
            except Exception as exc:  # wait() ends the attempt: no child will come
                self.peers_lost = exc
                raise
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(header.encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", module, spec_path], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=full,
                cwd=cwd if os.path.isdir(cwd) else os.path.dirname(log_path))
        context = ray.get_runtime_context()
        return {"pid": self.proc.pid, "actor_pid": os.getpid(), "node_id": context.get_node_id(),
                "host": socket.gethostname()}

    async def wait(self) -> int:
        """The child's exit status once it exits (negative: the signal that ended it)."""
        while self.proc is None or self.proc.poll() is None:
            if self.peers_lost is not None:
                raise RuntimeError(f"a rank of its gang was lost before it started: {self.peers_lost!r}")
            await asyncio.sleep(POLL)
        return self.proc.returncode

    async def signal(self, sig: int, group: bool = True) -> None:
        """Send `sig` to the child's process group (it and its DataLoader workers), or to the child alone."""
        if self.proc is None or (self.proc.poll() is not None and not group):
            return
        try:
            if group:
                os.killpg(self.proc.pid, sig)  # start_new_session made its pid the group id
            else:
                os.kill(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    async def shutdown(self) -> None:
        """End the child's whole group at once, reap it, and end this actor (its resources free)."""
        import ray

        if self.proc is not None:
            await self.signal(signal.SIGKILL)
            end = time.monotonic() + 1.0  # seconds: a SIGKILLed process is gone within milliseconds
            while self.proc.poll() is None and time.monotonic() < end:
                await asyncio.sleep(0.01)
        ray.actor.exit_actor()
