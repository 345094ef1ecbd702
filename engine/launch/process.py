"""The launcher protocol (`launch(spec) -> Handle`) and its local implementation, the only code that spawns,
signals and reaps.

`ProcessLauncher` starts each child as a fresh `python -P -m torchherd.engine.launch.child` in a session of
its own (a signal to its group reaches its DataLoader workers; the terminal's Ctrl-C does not), its
output in the pipeline's log from the first byte. The supervisor sees only `Handle`s.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Protocol

from ..protocol.channel import decode_batch
from ..protocol.messages import Command, Event
from ..protocol.spec import CHILD_MODULE, ChildSpec, Transport, write_spec



def python_module_command(module: str) -> list[str]:
    """The command that runs `module` with this Python, as `python -m` would, minus the shadowing.

    `-P` keeps the working directory off sys.path: a user's project may hold its own
    `torchherd.py`, `engine.py` or `tui.py`, and none of them may stand in for ours.
    """
    return [sys.executable, "-P", "-m", module]


@dataclass(frozen=True)
class LaunchSpec:
    """Where and how to start one child: its spec, its log, its GPU and any extra environment."""

    child: ChildSpec
    log_path: Path
    gpu_index: int | None  # physical GPU for CUDA_VISIBLE_DEVICES; None on CPU
    env: dict[str, str] = field(default_factory=dict)
    module: str = CHILD_MODULE
    node: str = ""  # the cluster node the scheduler placed it on (its slot's node); "" for this machine


class Handle(Protocol):
    """A running child as the supervisor sees it, whatever launched it and wherever it runs."""

    pid: int  # the child's main process, as people see it
    node: str  # where it runs: "" for this machine

    @property
    def pids(self) -> tuple[int, ...]:
        """Every process the launcher started for it (their descendants are found by telemetry)."""

    def poll(self) -> int | None:
        """The exit status once it has exited (negative: ended by that signal), else None."""

    def terminate(self) -> None:
        """Ask it to end now: it and its helpers (DataLoader workers) get the polite signal."""

    def kill(self) -> None:
        """End it and its helpers at once."""

    def dump_stacks(self) -> None:
        """Have it write every thread's stack to its log (for a hang)."""

    def send(self, command: Command) -> bool:
        """Deliver a command; False if the child can no longer hear it."""

    def attach(self, on_events: Callable[[list[Event]], None]) -> None:
        """Call `on_events` on the event loop whenever the child sends a batch."""

    def drain(self) -> list[Event]:
        """Whatever the child sent that was not delivered yet (called after it exited)."""

    def close(self) -> None:
        """Release its channels and reap stragglers of its process group."""


class Launcher(Protocol):
    """Turns a launch spec into a running handle; raises OSError if it cannot."""

    def launch(self, spec: LaunchSpec) -> Handle: ...


class FrameReader:
    """Splits a byte stream into the messages `Connection.send_bytes` framed (a length, then the bytes)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out = []
        while True:
            if len(self._buf) < 4:
                return out
            size = int.from_bytes(self._buf[:4], "big", signed=True)
            start = 4
            if size == -1:  # over 2 GiB: an 8-byte length follows
                if len(self._buf) < 12:
                    return out
                size, start = int.from_bytes(self._buf[4:12], "big"), 12
            if len(self._buf) < start + size:
                return out
            out.append(bytes(self._buf[start:start + size]))
            del self._buf[:start + size]


class ProcessHandle:
    """A real worker process with its status and control pipes."""

    node = ""

    def __init__(self, proc: subprocess.Popen, status: Connection, control: Connection):
        self.proc = proc
        self.pid = proc.pid
        self._status = status
        # Non-blocking: a worker frozen half-way through writing a batch must not freeze the loop.
        os.set_blocking(status.fileno(), False)
        self._frames = FrameReader()
        self._control = control
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_events: Callable[[list[Event]], None] | None = None
        self._reading = False

    def poll(self) -> int | None:
        return self.proc.poll()

    @property
    def pids(self) -> tuple[int, ...]:
        return (self.pid,)

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def dump_stacks(self) -> None:
        try:
            os.kill(self.pid, signal.SIGUSR1)  # faulthandler writes every thread's stack to the log
            # A stopped process (SIGSTOP) would hold the request until it is continued: it is about
            # to be ended anyway, so continue it for the length of the dump.
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # start_new_session made pid its own group id
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def send(self, command: Command) -> bool:
        try:
            self._control.send(command)
            return True
        except (OSError, ValueError):
            return False

    def attach(self, on_events: Callable[[list[Event]], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_events = on_events
        self._loop.add_reader(self._status.fileno(), self._readable)
        self._reading = True

    def _stop_reading(self) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self._status.fileno())
            self._reading = False

    def _readable(self) -> None:
        batches, eof = self._read_available()
        if eof:
            self._stop_reading()  # the worker closed its end; its exit is seen by poll()
        if self._on_events is not None:
            for events in batches:
                self._on_events(events)

    def _read_available(self) -> tuple[list[list[Event]], bool]:
        """Every whole batch readable now, and whether the worker closed its end."""
        fd = self._status.fileno()
        chunks = []
        eof = False
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            if len(chunk) < 1 << 16:
                break
        return [decode_batch(p) for p in self._frames.feed(b"".join(chunks))], eof

    def drain(self) -> list[Event]:
        events: list[Event] = []
        if self._status.closed:
            return events
        while True:
            batches, eof = self._read_available()
            for batch in batches:
                events += batch
            if eof or not batches:
                return events

    def close(self) -> None:
        self._stop_reading()
        # DataLoader workers outlive a SIGKILLed leader; the group id still reaches them.
        self.kill()
        for conn in (self._status, self._control):
            try:
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass


class ProcessLauncher:
    """Starts children as fresh Python interpreters (the `spawn` model) in their own sessions."""

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        child = spec.child
        transport = Transport(status_fd=status_w, control_fd=control_r, supervisor_pid=os.getpid())
        spec_path = write_spec(spec.log_path.parent / f"{child.stem}.json", child, transport)
        env = dict(os.environ)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"  # the log file shows prints as they happen
        if spec.gpu_index is None:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.setdefault("OMP_NUM_THREADS", str(child.threads))
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(spec.gpu_index)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML and CUDA agree on indices
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(spec.log_path, "ab")
        log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt {child.attempt} ====\n".encode())
        log.flush()
        try:
            # Popen is called from the event-loop thread on purpose: the parent-death
            # signal fires when the *thread* that forked the child exits.
            proc = subprocess.Popen(
                python_module_command(spec.module) + [str(spec_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(status_w, control_r), start_new_session=True, env=env,
                cwd=os.getcwd())
        finally:
            log.close()
            os.close(status_w)
            os.close(control_r)
        return ProcessHandle(proc, Connection(status_r, writable=False), Connection(control_w, readable=False))
