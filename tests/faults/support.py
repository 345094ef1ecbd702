"""Helpers shared by the fault tests: configs on the faulty task, a supervised run, process checks."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable

import psutil

from torchherd.engine.config.schema import RunConfig
from torchherd.engine.launch.process import LaunchSpec, ProcessHandle, ProcessLauncher
from torchherd.engine.protocol.messages import Event
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import EventStream, Supervisor
from tests.conftest import REPO, TASKS, make_config, repo_env

FAULTY = f"{TASKS / 'faulty.py'}:build"


def faulty_config(tmp_path: Path, pipelines: list[dict[str, Any]], **top: Any) -> RunConfig:
    """make_config on tests/tasks/faulty.py, telemetry off (these tests do not read it)."""
    top["defaults"] = {"task": FAULTY, **top.get("defaults", {})}
    top.setdefault("telemetry", {"enabled": False})
    return make_config(tmp_path, pipelines, **top)


class RecordingLauncher(ProcessLauncher):
    """The real launcher, keeping each pipeline's newest handle: the seam fault tests reach workers through."""

    def __init__(self) -> None:
        self.handles: dict[str, ProcessHandle] = {}  # pipeline name (or "validator") -> newest attempt

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        handle = super().launch(spec)
        self.handles[spec.child.name] = handle
        return handle


@contextlib.asynccontextmanager
async def supervised(sup: Supervisor) -> AsyncIterator[EventStream]:
    """Start `sup`, yield its event stream, and always shut it down (killing what is left)."""
    stream = sup.subscribe()
    await sup.start()
    try:
        yield stream
    finally:
        await sup.shutdown(graceful=False)


async def finish(sup: Supervisor, timeout: float = 90.0) -> dict[str, str]:
    """Wait (bounded) until every pipeline has a final status."""
    return await asyncio.wait_for(sup.wait(), timeout)


def of(events: Iterable[Event], kind: type, pipeline: str | None = None, **fields: Any) -> list:
    """The events of one type (and pipeline, and field values)."""
    return [e for e in events if isinstance(e, kind) and (pipeline is None or e.pipeline == pipeline)
            and all(getattr(e, k) == v for k, v in fields.items())]


def run_events(sup: Supervisor) -> list[Event]:
    return read_events(sup.run_dir)


def is_alive(proc: psutil.Process) -> bool:
    """A process that still exists and is not a zombie (same pid *and* start time as when we saw it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree(pid: int) -> list[psutil.Process]:
    """`pid` and all its descendants, as psutil handles (so a reused pid is not mistaken for them)."""
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def wait_gone(procs: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until none of `procs` is alive or `timeout` seconds pass; returns those still alive."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    left = [p for p in procs if is_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if is_alive(p)]
    return left


def kill_all(procs: Iterable[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def poll_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """The first truthy `predicate()`; fails after `timeout` seconds saying what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def records(run_dir: Path) -> list[dict[str, Any]]:
    """events.jsonl as dicts (a torn last line skipped)."""
    out = []
    path = run_dir / "events.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def write_toml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


class HeadlessCli:
    """`python -m torchherd run CONFIG --headless --runs-dir DIR` in a session of its own."""

    def __init__(self, config: Path, runs_dir: Path, stdout: Any = None):
        self.runs_dir = runs_dir
        self.output = runs_dir.parent / "cli-output.txt"
        self._out = stdout if stdout is not None else open(self.output, "wb")
        env = repo_env(PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchherd", "run", str(config), "--headless", "--runs-dir", str(runs_dir)],
            stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=REPO, env=env)
        self.known: list[psutil.Process] = []  # every descendant we have seen, for the orphan check

    def run_dir(self) -> Path | None:
        dirs = [d for d in self.runs_dir.iterdir() if d.is_dir()] if self.runs_dir.exists() else []
        return dirs[0] if len(dirs) == 1 else None

    def records(self) -> list[dict[str, Any]]:
        d = self.run_dir()
        return records(d) if d is not None else []

    def wait_records(self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float, what: str) -> Any:
        def check():
            if self.proc.poll() is not None:
                raise AssertionError(f"the CLI exited ({self.proc.returncode}) while waiting for {what}:\n"
                                     + self.text())
            self.remember()
            return predicate(self.records())
        return poll_until(check, timeout, what)

    def service(self) -> psutil.Process | None:
        """The run's supervisor: a service in a session of its own, not a child of the CLI."""
        d = self.run_dir()
        try:
            return psutil.Process(int((d / "supervisor.pid").read_text().split()[0])) if d is not None else None
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
            return None

    def remember(self) -> None:
        service = self.service()  # a child of the CLI that started it, or of nobody once that CLI is gone
        found = tree(self.proc.pid)[1:] + (tree(service.pid) if service is not None else [])
        for p in found:
            if p.pid not in {k.pid for k in self.known}:
                self.known.append(p)

    def text(self) -> str:
        try:
            return self.output.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill_supervisor(self) -> None:
        """SIGKILL the run's supervisor (its service); the attached CLI then ends, saying the run was cut short."""
        self.remember()
        service = self.service()
        assert service is not None, "the run has no live supervisor"
        service.send_signal(signal.SIGKILL)
        assert self.proc.wait(30) == 1, self.text()

    def cleanup(self) -> list[str]:
        """Kill what is left (the CLI's session and every descendant seen); returns what had been left."""
        self.remember()
        left = [p for p in self.known if is_alive(p)]
        if self.proc.poll() is not None:  # a run that ended: its service and workers finish within seconds
            left = psutil.wait_procs(left, timeout=15)[1]
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        kill_all(left)
        if hasattr(self._out, "close"):
            self._out.close()
        return [f"{p.pid} {' '.join(p.cmdline()[:4]) if is_alive(p) else ''}" for p in left]
