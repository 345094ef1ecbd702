"""A training script's process as the script runner holds it: started, signalled, measured.

The script runs as `python train.py ARGS` in the worker's process group (so the
supervisor's kill reaches it and whatever it starts), with its output on one pipe,
and death with the worker. Signals the runner sends (its stop signal, SIGSTOP/SIGCONT
to pause) go to the script and its descendants only, never to the worker that shares
their group.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

# Runs between fork and the script: Ctrl-C back to its default (the worker ignores it, and an
# ignored SIGINT would survive exec), SIGUSR2 unblocked (the worker blocks it), death with the worker,
# then the script itself in this pid.
_EXEC = ("import ctypes, os, signal, sys\n"
         "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
         "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})\n"  # the worker's parent-death signal
         "try:\n    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
         "except (OSError, AttributeError):\n    pass\n"
         "if os.getppid() != int(sys.argv[1]):\n    os._exit(13)\n"
         "os.execv(sys.argv[2], sys.argv[2:])\n")


# The script's Python runs this at start-up (its folder first on PYTHONPATH): SIGUSR1 then makes faulthandler
# write every thread's stack to its stderr, the pipeline's log, without stopping it (`d`, `torchherd stacks`);
# a sitecustomize of the user's that this one shadows runs after it, as it would have.
_STACKS_SITE = """import faulthandler, signal
faulthandler.register(signal.SIGUSR1, all_threads=True)


def _theirs():
    import importlib.machinery, importlib.util, os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_theirs()
"""


def stacks_site(folder: Path) -> dict[str, str]:
    """Write the start-up file that lets the script dump its stacks on SIGUSR1 into `folder`; the environment
    (PYTHONPATH) that makes its Python run it."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".sitecustomize.{os.getpid()}.tmp"  # the ranks of a gang write it at once: whole or not at all
    tmp.write_text(_STACKS_SITE)
    os.replace(tmp, folder / "sitecustomize.py")
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(folder) + (os.pathsep + rest if rest else "")}


def forward_stacks(pid: int, asked: Callable[[], None]) -> None:
    """SIGUSR1 to this worker (the supervisor asking for stacks) dumps the worker's own, then reaches the
    script `pid`, which dumps its own (see `stacks_site`); `asked()` is called each time."""
    import faulthandler

    def forward(signum: int, frame: FrameType | None) -> None:
        asked()
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    # faulthandler keeps the handler it first replaced: unregister, so that the one it chains to is ours.
    faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, forward)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)


def free_port() -> int:
    """A TCP port nobody listens on now, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script_environment(attempt: int, device: str, threads: int, extra: dict[str, str],
                       world_size: int = 1, torchrun_env: bool = False) -> dict[str, str]:
    """The worker's environment (CUDA_VISIBLE_DEVICES, thread counts) and TORCHHERD_RESTART_COUNT.

    A rank of a gang already has torchrun's variables for its rank from the launcher; a one-process
    script gets them only with `torchrun_env`, since scripts that find RANK set take their
    distributed branch (and on a CPU box fail where `python train.py` works).
    """
    env = dict(os.environ)
    if world_size == 1:
        env["TORCHHERD_RESTART_COUNT"] = str(max(attempt - 1, 0))
        if torchrun_env:
            env.update(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(PYTHONUNBUFFERED="1", **extra)
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


class ScriptProcess:
    """The running script: `python SCRIPT ARGS` with its output (stdout and stderr) on one pipe."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], pass_fd: int):
        # Started from the worker's main thread on purpose: the parent-death signal follows that thread.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _EXEC, str(os.getpid()), sys.executable, *argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(pass_fd,), cwd=cwd, env=env)
        self.pid = self.proc.pid
        assert self.proc.stdout is not None  # stdout=PIPE
        self.output_fd = self.proc.stdout.fileno()

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int) -> None:
        """`sig` to the script alone (SIGINT: what a person's Ctrl-C would do)."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def tree(self) -> list[Any]:
        """The script and every live process it started (psutil.Process objects)."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def signal_tree(self, sig: int) -> None:
        """`sig` to the script and its descendants, parent first (SIGSTOP stops it before it can react)."""
        import psutil

        for proc in self.tree():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass

    def cpu_seconds(self) -> float:
        """CPU time the script and its live descendants have used (seconds)."""
        import psutil

        total = 0.0
        for proc in self.tree():
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total
