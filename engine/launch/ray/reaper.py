"""Ends the processes of a private Ray torchherd started (`[cluster] address = "local"`) when it dies.

`ray.init()` without an address starts Ray's head inside the supervisor's process tree;
its GCS and raylet die with the supervisor, but the agents the raylet starts
(DashboardAgent, RuntimeEnvAgent) and idle workers are reparented and live on after a
SIGKILL. `start_reaper()` starts `python -P -m torchherd.engine.launch.ray.reaper PID FD`
in a session of its own: it notes the supervisor's Ray descendants every half second
and, once the supervisor is gone (the pipe it holds closes), kills those still running.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

LOOK_EVERY = 0.5  # seconds between looks at the supervisor's descendants


def _is_ray(cmdline: list[str]) -> bool:
    line = " ".join(cmdline)
    return line.startswith("ray::") or "/ray/" in line or "site-packages/ray" in line


def watch(parent: int, fd: int) -> None:
    """Note `parent`'s Ray descendants until `fd` reaches EOF, then SIGKILL the ones still running."""
    import psutil

    try:
        root = psutil.Process(parent)
    except psutil.NoSuchProcess:
        return
    seen: dict[int, psutil.Process] = {}
    me = os.getpid()
    while True:
        try:
            for p in root.children(recursive=True):
                if p.pid != me and p.pid not in seen and _is_ray(p.cmdline()):
                    seen[p.pid] = p
        except psutil.Error:
            pass
        ready, _, _ = select.select([fd], [], [], LOOK_EVERY)
        if ready and not os.read(fd, 64):
            break
    for p in seen.values():
        try:
            if p.is_running():  # the same process: psutil checks its start time, not just the pid
                p.kill()
        except psutil.Error:
            pass


def start_reaper() -> None:
    """Start the reaper for this process; it keeps one end of a pipe only this process holds."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, False)
    subprocess.Popen([sys.executable, "-P", "-m", "torchherd.engine.launch.ray.reaper", str(os.getpid()), str(read_fd)],
                     pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(read_fd)
    # Kept open for the life of this process: its closing, by exit or SIGKILL, wakes the reaper.
    start_reaper.write_fd = write_fd  # type: ignore[attr-defined]


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), int(sys.argv[2]))
