"""Starting worker processes and talking to them: the only place that spawns, signals and reaps.

`ProcessLauncher.launch` starts `python -m torchherd.engine.worker` in a fresh interpreter
and a session of its own (so a signal to its process group reaches its DataLoader
workers, and the terminal's Ctrl-C does not), with stdout and stderr in the
pipeline's log file from the first byte. The supervisor sees only `WorkerHandle`,
so its state machine can be driven by a scripted launcher in tests.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import json
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Protocol

from torchherd.engine.channel import decode_batch
from torchherd.engine.messages import Command, Event



def python_module_command(module: str) -> list[str]:
    """The command that runs `module` with this Python, as `python -m` would, minus the shadowing.

    `-P` keeps the working directory off sys.path: a user's project may hold its own
    `torchherd.py`, `engine.py` or `tui.py`, and none of them may stand in for ours.
    """
    return [sys.executable, "-P", "-m", module]


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs, written as JSON by the launcher."""

    pipeline: dict  # engine.config.Pipeline, dumped
    validation: dict  # engine.config.ValidationConfig, dumped
    device: str  # "cpu" or "cuda" (CUDA_VISIBLE_DEVICES already narrows it to one GPU)
    threads: int  # torch threads for a CPU worker
    pipeline_dir: str
    attempt: int
    snapshot_dir: str = ""  # background validation: where this pipeline's snapshot slots live
    snapshot_seq: int = 0  # the highest snapshot seq handed off so far: seqs never repeat across attempts
    status_fd: int = -1
    control_fd: int = -1
    supervisor_pid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        return cls(**json.loads(text))


@dataclass(frozen=True)
class LaunchSpec:
    """Where and how to start one attempt of a pipeline's worker."""

    worker: WorkerSpec
    log_path: Path
    gpu_index: int | None  # physical GPU for CUDA_VISIBLE_DEVICES; None on CPU
    env: dict[str, str] = field(default_factory=dict)
    module: str = "torchherd.engine.worker"


class WorkerHandle(Protocol):
    """A running worker as the supervisor sees it."""

    pid: int

    def poll(self) -> int | None:
        """The exit status once it has exited (negative: killed by that signal), else None."""

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the worker's whole process group (it and its DataLoader workers)."""

    def signal_process(self, sig: int) -> None:
        """Send `sig` to the worker process alone."""

    def send(self, command: Command) -> bool:
        """Deliver a command; False if the worker can no longer hear it."""

    def attach(self, on_events: Callable[[list[Event]], None]) -> None:
        """Call `on_events` on the event loop whenever the worker sends a batch."""

    def drain(self) -> list[Event]:
        """Whatever the worker sent that was not delivered yet (called after it exited)."""

    def close(self) -> None:
        """Release pipes and reap stragglers of the process group."""


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

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # start_new_session made pid its own group id
        except ProcessLookupError:
            pass
        except PermissionError:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def signal_process(self, sig: int) -> None:
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
        self.signal_group(signal.SIGKILL)
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
    """Starts workers as fresh Python interpreters (the `spawn` model) in their own sessions."""

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        worker = WorkerSpec(**{**spec.worker.__dict__, "status_fd": status_w, "control_fd": control_r,
                               "supervisor_pid": os.getpid()})
        spec_path = Path(worker.pipeline_dir) / "worker.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(worker.to_json())
        env = dict(os.environ)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"  # the log file shows prints as they happen
        if spec.gpu_index is None:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.setdefault("OMP_NUM_THREADS", str(worker.threads))
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(spec.gpu_index)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML and CUDA agree on indices
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(spec.log_path, "ab")
        log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt {worker.attempt} ====\n".encode())
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
