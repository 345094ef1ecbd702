"""Warm starts: a process that has imported torch once forks each later child of the session, so a queued
pipeline (a sweep's next trial) trains within milliseconds of getting its slot instead of after seconds of
`import torch`; `WarmStarter` is the supervisor's end, `serve` the forking process.

A child forked here is what `python -P -m torchherd.engine.launch.child SPEC` would be (own session, output
in its log, its environment, the child entry), less the imports; it dies with the forking process, which
dies with the supervisor. A child whose environment could change what torch does at import starts cold.
"""
from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

WARM_MODULE = "torchherd.engine.launch.warm"
# What every trainer imports before its first step: torch, and torch._dynamo, which torch's own optimizers
# import when they are built (as long again as torch itself on a CPU); then torchherd's worker side.
PRELOAD = ("torch", "torch._dynamo", "torchherd.engine.launch.child", "torchherd.engine.runners.run",
           "torchherd.engine.runners.task", "torchherd.engine.runners.task.trainer")
# Variables read after start (by CUDA's first call, torch.distributed, torchherd's worker): a child may differ
# from the forking process in these alone. OMP_NUM_THREADS too: the worker sets its slot's threads itself;
# XDG_RUNTIME_DIR: torchherd reads it when it opens a socket, nothing at import. Two that libraries set in the
# supervisor's own environment once it has imported them, each read when called: Lightning's import sets
# PYTORCH_NVML_BASED_CUDA_CHECK (torch.cuda.is_available reads it), torch's inductor TORCHINDUCTOR_CACHE_DIR
# (its cache_dir() reads it); without them here, a session that checked a Lightning pipeline started every
# later child cold. tensorboardX's import sets CRC32C_SW_MODE ("auto" where unset, which is what its absence
# means), read at that import alone: a sweep's TensorBoard thread imports it while the forking process starts.
LATE_KEYS = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "RANK", "LOCAL_RANK",
    "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "XDG_RUNTIME_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK",
    "TORCHINDUCTOR_CACHE_DIR", "CRC32C_SW_MODE"})
LATE_PREFIXES = ("TORCHELASTIC_", "TORCHHERD_")
MESSAGE = 1 << 20  # bytes: the largest request (an environment) or report
REPLY_WAIT = 5.0  # seconds a start waits for its pid before the launcher starts the child cold instead
# Seconds queued pipelines wait for the imports before they start cold: as long as a cold start's own imports
# take on a loaded machine, which waiting saves them.
WARM_HOLD = 30.0
CLOSE_WAIT = 1.0  # seconds it has to exit once the session ends, before it is killed
OWN_SESSION_WAIT = 2.0  # seconds the forking process waits for a fork's setsid before it tells the pid anyway


def _early(env: Mapping[str, str], late: Iterable[str] = ()) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in LATE_KEYS and k not in late and not k.startswith(LATE_PREFIXES)}


def compatible(env: Mapping[str, str], base: Mapping[str, str], late: Iterable[str] = ()) -> bool:
    """A child with environment `env` can be forked from a process started with `base`: they differ only in
    variables read after start (and in `late`, more that the caller knows nothing reads at import)."""
    late = frozenset(late)
    return _early(env, late) == _early(base, late)


class WarmProcess:
    """A forked child as `subprocess.Popen` shows one to `ProcessHandle`: pid, poll, wait."""

    def __init__(self, starter: WarmStarter, pid: int):
        self._starter, self.pid = starter, pid

    def poll(self) -> int | None:
        return self._starter.returncode(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and timeout is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(WARM_MODULE, timeout)
            self._starter.wait_report(0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic())))
        return code


class WarmStarter:
    """The supervisor's end of the forking process: started at once, ready once its imports are done."""

    def __init__(self, env: Mapping[str, str], command: list[str], late: Iterable[str] = ()):
        self.env = dict(env)
        self.late = frozenset(late)  # variables a child may differ in besides LATE_KEYS
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([*command, str(theirs.fileno()), str(os.getpid())],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                                         start_new_session=True, env=self.env, cwd=os.getcwd())
        finally:
            theirs.close()
        self._sock = ours
        self._sock.setblocking(False)
        self.started = time.monotonic()
        self.server_pid = 0  # set when it reports its imports done
        self.gone = False
        self._codes: dict[int, int] = {}  # pid -> exit code (negative: the signal), as Popen's returncode
        self._live: set[int] = set()
        self._replies: dict[int, dict[str, Any]] = {}
        self._abandoned: set[int] = set()
        self._next = 0

    def fits(self, env: Mapping[str, str]) -> bool:
        """A child with environment `env` can be forked here."""
        return compatible(env, self.env, self.late)

    def ready(self) -> bool:
        """Its imports are done and it is still there."""
        self._pump()
        return bool(self.server_pid) and not self.gone

    def age(self) -> float:
        """Seconds since it was started."""
        return time.monotonic() - self.started

    def start(self, spec_path: str, env: Mapping[str, str], cwd: str, fds: tuple[int, int, int]) -> WarmProcess:
        """Fork a child running the child entry on `spec_path`, its output to fds[0] and its status and
        control pipes fds[1] and fds[2]; raises OSError when no pid came back (start it cold then)."""
        self._next += 1
        ask = self._next
        request = json.dumps({"start": ask, "spec": spec_path, "env": dict(env), "cwd": cwd}).encode()
        try:
            self._sock.setblocking(True)
            socket.send_fds(self._sock, [request], list(fds))
        finally:
            self._sock.setblocking(False)
        deadline = time.monotonic() + REPLY_WAIT
        while ask not in self._replies and not self.gone and time.monotonic() < deadline:
            self.wait_report(deadline - time.monotonic())
        reply = self._replies.pop(ask, None)
        if reply is None:  # started cold instead: a fork that comes late is ended at once, by the forking
            self._abandoned.add(ask)  # process as it reads this (a session may never read the late reply)
            _send(self._sock, {"abandon": ask})
        if reply is None or "pid" not in reply:
            raise OSError(reply.get("error", "no reply") if reply else "the warm start did not answer")
        self._live.add(reply["pid"])
        return WarmProcess(self, reply["pid"])

    def returncode(self, pid: int) -> int | None:
        self._pump()
        return self._codes.get(pid)

    def wait_report(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for a report, and take what came."""
        if not self.gone:
            select.select([self._sock], [], [], max(0.0, timeout))
        self._pump()

    def _pump(self) -> None:
        while not self.gone:
            try:
                data = self._sock.recv(MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # it ended: so did every child it forked (they die with it)
                self.gone = True
                for pid in self._live - self._codes.keys():
                    self._codes[pid] = -signal.SIGKILL
                return
            report = json.loads(data)
            if "ready" in report:
                self.server_pid = report["ready"]
            elif "exited" in report:
                self._codes[report["exited"]] = report["code"]
            elif report["reply"] in self._abandoned and "pid" in report:
                _kill_group(report["pid"])
            else:
                self._replies[report["reply"]] = report

    def close(self) -> None:
        """End it (its children have ended: the session is over); it exits as soon as it reads the end."""
        self._sock.close()
        self.gone = True
        try:
            self.proc.wait(timeout=CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # its own session's group, as a cold child's
    except (ProcessLookupError, PermissionError):
        pass


def _end_late(pid: int) -> None:
    """In the forking process: end a child of its own not yet reaped (so `pid` is still that child's), its
    group and itself (it may not have made its group yet)."""
    _kill_group(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------- the forking process


def _send(sock: socket.socket, report: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(report).encode())
    except OSError:
        pass  # the supervisor went away; so will this process


def _child(request: dict[str, Any], fds: list[int], parent: int) -> None:
    """In the fork: become the child `python -P -m torchherd.engine.launch.child SPEC` would be. Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()  # a session of its own, as start_new_session gives a cold child
        log, status, control = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        keep = {0, 1, 2, status, control}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()  # a fresh interpreter's draws, not the forking process's
        from . import child

        sys.argv = [child.__file__, request["spec"]]
        child.main([request["spec"]], override={"status_fd": status, "control_fd": control,
                                                 "supervisor_pid": parent})
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(1)


CUDA_ERROR_NOT_INITIALIZED = 3  # what the CUDA driver answers every call but cuInit until cuInit has run


def _cuda_touched() -> bool:
    """Whether anything imported here initialized CUDA's driver. Its library merely loaded does not count (torch
    built for CUDA 13 links it at import): asked for its device count, a driver not yet initialized answers
    CUDA_ERROR_NOT_INITIALIZED and initializes nothing. A driver that cannot be asked counts as initialized."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    with open("/proc/self/maps") as maps:
        loaded = sorted({line.split()[-1] for line in maps if "libcuda.so" in line})
    if not loaded:
        return False
    import ctypes

    try:
        driver = ctypes.CDLL(loaded[0], mode=os.RTLD_NOLOAD)  # the one loaded: never a second load
        answer: int = driver.cuDeviceGetCount(ctypes.byref(ctypes.c_int()))
        return answer != CUDA_ERROR_NOT_INITIALIZED
    except (OSError, AttributeError):
        return True


def _reap(sock: socket.socket, forked: dict[int, int]) -> None:
    """Report every child that ended, and forget the requests they were forked for."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for ask in [ask for ask, p in forked.items() if p == pid]:
            del forked[ask]
        _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _fork(sock: socket.socket, request: dict[str, Any], fds: list[int], forked: dict[int, int]) -> None:
    """Fork the child `request` asks for and reply with its pid, once the child has a session (and so a process
    group) of its own: a supervisor told the pid earlier could signal a group not there yet, which misses."""
    sys.stdout.flush()
    sys.stderr.flush()
    me = os.getpid()
    own_r, own_w = os.pipe()  # the child's end closes once it has its session (_child closes every fd it keeps not)
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(own_r)
        os.close(own_w)
        _send(sock, {"reply": request["start"], "error": f"fork failed: {exc}"})
        return
    if pid == 0:
        _child(request, fds, me)
    os.close(own_w)
    select.select([own_r], [], [], OWN_SESSION_WAIT)  # end of file: setsid is done (or the child is gone)
    os.close(own_r)
    forked[request["start"]] = pid
    _send(sock, {"reply": request["start"], "pid": pid})


def serve(fd: int, supervisor_pid: int) -> None:
    """Import what trainers need, then fork a child for each request on the socket `fd` and report how each
    ended, until the supervisor closes its end."""
    from .child import die_with_parent

    die_with_parent(supervisor_pid)
    sock = socket.socket(fileno=fd)
    for module in PRELOAD:
        try:
            __import__(module)
        except Exception:  # not installed here: its children import it themselves, or fail as a cold one would
            pass
    if _cuda_touched():
        os._exit(0)  # a fork cannot use CUDA once its parent has: every child starts cold instead
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, {"ready": os.getpid()})
    forked: dict[int, int] = {}  # request -> the pid forked for it, while it lives
    while True:
        watched: list[int | socket.socket] = [sock, wake_r]
        readable, _, _ = select.select(watched, [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(sock, forked)
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE, 3)
        except OSError:
            data, fds = b"", []
        if not data:  # the session is over: no interpreter teardown (torch's can take seconds)
            os._exit(0)
        request = json.loads(data)
        if "abandon" in request:  # the supervisor started it cold: this fork, made late, must not run too
            late = forked.pop(request["abandon"], None)
            if late is not None:
                _end_late(late)
            continue
        _fork(sock, request, fds, forked)
        for passed in fds:
            os.close(passed)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
