"""A run's supervisor as a service: `spawn` starts `python -m torchherd.engine.serve.service` in a session of
its own (no terminal, immune to SIGHUP) and returns once it serves its control socket; the service runs
the run to its end, writing nothing anywhere but the run directory.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..protocol.nolinks import open_fd

if TYPE_CHECKING:
    from ..supervise.supervisor import Supervisor
    from .server import ControlServer

READY = "torchherd-service-ready "  # the line that says the service serves, then its details as JSON
LOG = "supervisor.log"  # the service's own stdout and stderr, in the run directory


class ServiceFailed(RuntimeError):
    """The service did not start; the message is what it printed (the config's problems, a traceback)."""


class StartCancelled(RuntimeError):
    """Ctrl-C while the service was starting: it was told to stop, and it ended leaving no run behind."""


CANCEL_WAIT = 60.0  # seconds a cancelled service may take to stop what it started before it is killed
_cancelled = threading.Event()  # SIGTERM before the service serves: stop what was started, keep no run


@dataclass(frozen=True)
class Started:
    run_dir: Path
    socket: Path
    pid: int


def spawn(config: Path | None = None, runs_dir: Path | None = None, resume: Path | None = None,
          only: list[str] | None = None, check_builds: bool = False) -> Started:
    """Start the service for a config (or to resume a run) and wait until it serves (blocking). `check_builds`:
    the workers' first builds are the run's task check (engine/supervise/build_check.py)."""
    args = ["--resume", str(resume)] if resume is not None else ["--config", str(config)]
    if check_builds:
        args.append("--check-builds")
    if runs_dir is not None:
        args += ["--runs-dir", str(runs_dir)]
    for name in only or []:
        args += ["--only", name]
    # Ctrl-C is held from before Popen (inside it, it would lose the child already forked) until the service
    # serves, and any that landed meanwhile cancels the start: none can slip between two handlers and be lost.
    interrupted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum)) if main else None
    proc: subprocess.Popen | None = None
    try:
        try:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "torchherd.engine.serve.service", *args],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
            out = _read_until_served(proc, interrupted)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)  # a Ctrl-C pending at this moment is recorded first
        if interrupted:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        if proc is not None:
            _cancel(proc)
        raise StartCancelled("interrupted while the run was starting: stopped what it had started; "
                             "no run is kept") from None
    assert proc.stdout is not None
    proc.stdout.close()
    for line in out.splitlines():
        if line.startswith(READY):
            info = json.loads(line[len(READY):])
            # It goes on without us; should it end while we still run, this reaps it (no zombie).
            threading.Thread(target=proc.wait, name="torchherd-service-reaper", daemon=True).start()
            return Started(Path(info["run_dir"]), Path(info["socket"]), proc.pid)
    proc.wait()
    raise ServiceFailed(out.strip() or f"the torchherd service exited with status {proc.returncode}")


def _read_until_served(proc: subprocess.Popen, interrupted: list[int]) -> str:
    """The service's output until it serves (its output moves to its log) or exits; KeyboardInterrupt as soon as
    a Ctrl-C is recorded in `interrupted`."""
    assert proc.stdout is not None
    fd, chunks = proc.stdout.fileno(), list[bytes]()
    while True:
        if interrupted:
            raise KeyboardInterrupt
        if select.select([fd], [], [], 0.1)[0]:  # a poll, so a recorded Ctrl-C is seen within 0.1 s
            data = os.read(fd, 1 << 16)
            if not data:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(data)


def _cancel(proc: subprocess.Popen) -> None:
    """Ctrl-C during `spawn`: SIGTERM tells the starting service to stop what it started and remove its run;
    wait for that (more Ctrl-C is ignored meanwhile), killing it after CANCEL_WAIT seconds."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        proc.terminate()
        try:
            proc.wait(CANCEL_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        signal.signal(signal.SIGINT, previous)


def _supervisor(args: argparse.Namespace) -> Supervisor:
    from ..config.load import load_config
    from ..supervise.supervisor import Supervisor

    if args.resume:
        return Supervisor.resume_run(args.resume, only=args.only or None)
    return Supervisor(load_config(args.config), runs_dir=args.runs_dir, check_builds=args.check_builds)


def _to_log(run_dir: Path) -> None:
    """From now on stdout and stderr go to the run's supervisor.log (the spawner's pipe closes)."""
    fd = open_fd(run_dir / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def settle_the_heap() -> None:
    """What the service has made to start (its imports, the config, the supervisor's parts) lives as long as it
    does: moved out of the collector's sight (`gc.freeze`), so the collections a flood of events brings do not
    walk it again and again; and young objects are collected less often (`spare_the_young`: events are freed by
    their reference counts)."""
    from .remote import spare_the_young

    gc.collect()
    gc.freeze()
    spare_the_young()


async def serve(args: argparse.Namespace) -> int:
    from ..config.problems import ConfigError
    from ..rundir.directory import RunTaken
    from .runtime import publish, socket_path, withdraw
    from .server import ControlServer

    try:
        sup = _supervisor(args)
        await sup.start()
    except (ConfigError, RunTaken, OSError, ValueError) as exc:
        print(f"torchherd: {exc}", flush=True)
        return 2
    if _cancelled.is_set():
        return await _cancelled_start(sup, bool(args.resume))
    sock = socket_path(sup.run_dir)
    server = ControlServer(sup, sock)
    await server.start()
    publish(sup.run_dir, sock)
    settle_the_heap()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: sup.stop(reason="SIGTERM"))  # from now on: a stop
    if _cancelled.is_set():  # it came before the handler above
        await server.close()
        withdraw(sup.run_dir, sock)
        return await _cancelled_start(sup, bool(args.resume))
    print(READY + json.dumps({"run_dir": str(sup.run_dir), "socket": str(sock)}), flush=True)
    _to_log(sup.run_dir)
    try:
        await sup.wait()
        await sup.shutdown(graceful=True)
    finally:
        await server.close()
        withdraw(sup.run_dir, sock)
        await _drained(server, loop.time() + 5.0)
        if sup.task_check.refused:  # a task did not build, nothing trained: like a bad config, no run is left
            shutil.rmtree(sup.run_dir, ignore_errors=True)
    return 0


async def _cancelled_start(sup: Supervisor, resumed: bool) -> int:
    """SIGTERM before the service served (the spawner's Ctrl-C): end every worker started and keep no run (a
    resumed one's directory holds what it trained before: it stays, as it was)."""
    await sup.shutdown(graceful=False)
    if not resumed:
        shutil.rmtree(sup.run_dir, ignore_errors=True)
    print("torchherd: cancelled while starting", flush=True)
    return 3


async def _drained(server: ControlServer, deadline: float) -> None:
    """Give clients a moment to read the last events before the process ends."""
    loop = asyncio.get_running_loop()
    while any(c.transport.get_write_buffer_size() for c in server.clients) and loop.time() < deadline:
        await asyncio.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchherd.engine.serve.service")
    parser.add_argument("--config", type=Path)
    parser.add_argument("--runs-dir", type=Path)
    parser.add_argument("--resume", type=Path)
    parser.add_argument("--only", action="append")
    parser.add_argument("--check-builds", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal is ours; a hangup is none of our business
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the clients, which ask us to stop
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over a file size limit: a write fails (EFBIG) like a full disk
    signal.signal(signal.SIGTERM, lambda *_: _cancelled.set())  # until it serves: the spawner's Ctrl-C
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
