"""The local backend: `ProcessLauncher` starts each attempt as a process on this machine, the only code
that spawns, signals and reaps.

Each child is a fresh `python -P -m torchherd.engine.launch.child` in a session of its own
(a signal to its group reaches its DataLoader workers; the terminal's Ctrl-C does not), its
output in the pipeline's log from the first byte. The supervisor sees only `Handle`s.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from multiprocessing.connection import Connection

from ..protocol.nolinks import make_dirs, open_file
from ..protocol.spec import CHILD_MODULE, Transport, write_spec
from .backend import Backend, LaunchSpec
from .channel_handle import ChannelHandle
from .environment import child_env
from .warm import WARM_HOLD, WARM_MODULE, WarmProcess, WarmStarter

__all__ = ["LaunchSpec", "ProcessHandle", "ProcessLauncher", "keep_warm", "kept", "let_go", "local_env",
           "python_module_command"]


def python_module_command(module: str) -> list[str]:
    """The command that runs `module` with this Python, as `python -m` would, minus the shadowing.

    `-P` keeps the working directory off sys.path: a user's project may hold its own
    `torchherd.py`, `engine.py` or `tui.py`, and none of them may stand in for ours.
    """
    return [sys.executable, "-P", "-m", module]


def local_env(spec: LaunchSpec, inherit: Mapping[str, str]) -> dict[str, str]:
    """The environment a child of this machine starts with, from `inherit` (this process's): its GPUs by
    NVML index (a gang's rank sees the gang's), its threads, its spec's own variables."""
    return child_env(spec.env, spec.child.threads, spec.visible_gpus, inherit=inherit)


class ProcessHandle(ChannelHandle):
    """A real worker process on this machine, heard over its status pipe and commanded over its control pipe."""

    def __init__(self, proc: subprocess.Popen[bytes] | WarmProcess, status: Connection, control: Connection):
        super().__init__(status, control)
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

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

    def close(self) -> None:
        self.pause_reading()
        # DataLoader workers outlive a SIGKILLed leader; the group id still reaches them.
        self.kill()
        self.close_channel()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass


_kept: WarmStarter | None = None  # keep_warm's forking process


def keep_warm(late: Iterable[str] = ()) -> WarmStarter:
    """Start a forking process now and keep it for every later local session of this interpreter (a test suite,
    a program that supervises runs one after another): their children fork warm from the first, where a
    session's own forking process starts only once its pipelines queue. Started again if it went. `late`:
    variables that change between sessions and that nothing reads at import (a test runner's own)."""
    global _kept
    if _kept is None or _kept.gone:
        _kept = _forking_process(late)
    return _kept


def _forking_process(late: Iterable[str] = ()) -> WarmStarter:
    """A new forking process with this process's environment."""
    return WarmStarter({**os.environ, "PYTHONUNBUFFERED": "1"}, python_module_command(WARM_MODULE), late)


def kept() -> WarmStarter | None:
    """keep_warm's forking process, while it is there."""
    return _kept if _kept is not None and not _kept.gone else None


def let_go() -> None:
    """End keep_warm's forking process (every child it forked has ended)."""
    global _kept
    if _kept is not None:
        _kept.close()
        _kept = None


class ProcessLauncher(Backend):
    """The local backend: children as fresh Python interpreters (the `spawn` model) in their own sessions.

    Once more pipelines wait than fit (`hold_launches`), or in a sweep that restarts its trials (`expect_restarts`),
    their children are forked from a process that has imported torch already (engine/launch/warm.py);
    every other ability is Backend's default: this machine's devices and slots, one validator here, gangs
    meeting on the loopback, no remote telemetry.
    """

    _warm: WarmStarter | None = None  # the forking process, once pipelines wait for slots or restart
    warm_start = True  # [cluster] warm_start: false starts every child cold

    def __init__(self, warm_start: bool = True):
        self.warm_start = warm_start

    def hold_launches(self, queued: int, free: int) -> bool:
        """More pipelines wait than fit (a sweep): start the forking process, and hold them until its imports
        are done (for WARM_HOLD seconds at most), so even the first of them skip theirs. Pipelines that all fit
        are never held: they start at once, cold while the forking process is not ready."""
        if queued <= free:
            return False
        self._start_forker()
        warm = self._forker()
        return warm is not None and not warm.ready() and not warm.gone and warm.age() < WARM_HOLD

    def expect_restarts(self) -> None:
        """A sweep that restarts its trials, or a gang that may restart, is starting: start the forking process
        now, if there is none (pipelines that all fit their slots start none otherwise). Its first wave is not
        held for it (a trial queued while a slot is free would read to PBT as one waiting for a slot); its
        restarts skip the imports: a gang's ranks come back in a fraction of a second, not a cold import each
        (benchmarks/recovery.py)."""
        self._start_forker()

    def _start_forker(self) -> None:
        """Start the session's forking process, unless there is one (or warm starts are off)."""
        if self._forker() is None and self.warm_start:
            # Popen from the event-loop thread, as every child: the parent-death signal follows that thread.
            self._warm = _forking_process()

    def _forker(self) -> WarmStarter | None:
        """The session's own forking process, else the one this interpreter keeps (`keep_warm`)."""
        if self._warm is not None or not self.warm_start:
            return self._warm
        return kept()

    def close(self) -> None:
        if self._warm is not None:
            self._warm.close()
            self._warm = None

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        child = spec.child
        transport = Transport(status_fd=status_w, control_fd=control_r, supervisor_pid=os.getpid())
        folder = spec.log_path.parent  # the pipeline's (or the validator's) folder in the run folder
        try:
            make_dirs(folder, folder.parent)
            spec_path = write_spec(folder / f"{child.stem}.json", child, transport)
            log = open_file(spec.log_path, "ab")
        except BaseException:
            for fd in (status_r, status_w, control_r, control_w):
                os.close(fd)
            raise
        env = local_env(spec, os.environ)
        log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt {child.attempt} ====\n".encode())
        log.flush()
        try:
            warm = self._warm_start(spec, str(spec_path), env, (log.fileno(), status_w, control_r))
            # Popen is called from the event-loop thread on purpose: the parent-death
            # signal fires when the *thread* that forked the child exits.
            proc = warm or subprocess.Popen(
                [*python_module_command(spec.module), str(spec_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(status_w, control_r), start_new_session=True, env=env,
                cwd=os.getcwd())
        finally:
            log.close()
            os.close(status_w)
            os.close(control_r)
        return ProcessHandle(proc, Connection(status_r, writable=False), Connection(control_w, readable=False))

    def _warm_start(self, spec: LaunchSpec, spec_path: str, env: dict[str, str],
                    fds: tuple[int, int, int]) -> WarmProcess | None:
        """The child forked from the warm process, when that is ready and the child's environment allows;
        None to start it cold."""
        warm = self._forker()
        if warm is None or spec.module != CHILD_MODULE or not warm.ready() or not warm.fits(env):
            return None
        try:
            return warm.start(spec_path, env, os.getcwd(), fds)
        except OSError:
            return None
