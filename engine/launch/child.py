"""The entry of every supervised child: `python -P -m torchherd.engine.launch.child SPEC.json`.

It reads the spec, dies with the supervisor (and takes its process group along), dumps stacks on a crash or on SIGUSR1,
ignores the terminal's Ctrl-C (the supervisor decides when to stop), runs the
worker or the validator by the spec's role, ships every queued event and exits
with the body's code.
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..protocol.channel import ControlReceiver, StatusSender, SupervisorGone, WorkerExit, dial_back
from ..protocol.spec import ValidatorSpec, read_spec

PR_SET_PDEATHSIG = 1


PARENT_GONE = signal.SIGUSR2  # the parent-death signal; children unblock it (runners/script/process.py)


def die_with_parent(parent_pid: int) -> None:
    """When the supervisor dies, take this child's whole process group with it: the worker, a script and what
    the script started, DataLoader workers. Linux sends PARENT_GONE; it is blocked in every thread but one
    that waits for it, so it is handled at once even while the main thread is stuck in C (a collective, a
    kernel), and that thread SIGKILLs the group. The control pipe's EOF is the fallback."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {PARENT_GONE})  # before any other thread exists
        threading.Thread(target=_kill_group_when_parent_dies, name="torchherd-parent-watch", daemon=True).start()
        libc.prctl(PR_SET_PDEATHSIG, PARENT_GONE, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return
    if parent_pid and os.getppid() != parent_pid:  # it died before prctl took effect
        kill_own_group()


def _kill_group_when_parent_dies() -> None:
    signal.sigwait({PARENT_GONE})
    kill_own_group()


def kill_own_group() -> None:
    """SIGKILL this process, and everything it started when it leads a process group of its own."""
    try:
        if os.getpgrp() == os.getpid():  # a group of its own (every local child): everything it started too
            os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None, override: dict[str, Any] | None = None) -> None:
    """Run the child the spec file argv[0] describes; `override`: transport fields that replace the spec's (a child
    forked by a warm start: its pipes' numbers there and the process it dies with, engine/launch/warm.py)."""
    argv = sys.argv[1:] if argv is None else argv
    spec, written = read_spec(Path(argv[0]))
    transport = replace(written, **override) if override else written
    die_with_parent(transport.supervisor_pid)
    faulthandler.enable(all_threads=True)  # a segfault leaves its stack in the log
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the supervisor's "where are you stuck?"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # over a file size limit a checkpoint fails (EFBIG), as on a full disk
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    print(f"torchherd {spec.role} pid {os.getpid()} {spec.name} attempt {spec.attempt} device {spec.device}",
          flush=True)
    if transport.address:  # on a cluster node: one connection back to the supervisor
        try:
            status, commands = dial_back(transport.address, transport.token)
        except OSError as exc:
            print(f"torchherd: cannot reach the supervisor at {transport.address}: {exc}", file=sys.stderr,
                  flush=True)
            os._exit(WorkerExit.ORPHANED)
    else:
        status = Connection(transport.status_fd, readable=False)
        commands = Connection(transport.control_fd, writable=False)
    sender = StatusSender(status)
    control = ControlReceiver(commands)
    body: Callable[[Any, StatusSender, ControlReceiver], int]  # the spec's kind of child
    if isinstance(spec, ValidatorSpec):
        from ..validation.validator import serve as body
    else:
        from ..runners.run import run as body
    try:
        code = body(spec, sender, control)
    except SupervisorGone:
        print("torchherd: the supervisor went away; exiting", file=sys.stderr, flush=True)
        os._exit(WorkerExit.ORPHANED)
    except BaseException:
        traceback.print_exc()
        code = WorkerExit.ERROR
    sender.close(timeout=10.0)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: DataLoader and compile threads can hang it.
    os._exit(code)


if __name__ == "__main__":
    main()
