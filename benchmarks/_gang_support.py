"""What the gang benchmarks share: one DDP script, run by torchrun or by torchherd as a 2-rank script gang.

`Torchrun` starts `torchrun --standalone` on the script and timestamps every line it
prints; `herd_config` is the torchherd config that runs the same script unchanged.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from torchherd.engine.config.load import parse_config
from torchherd.engine.config.schema import RunConfig

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "tasks" / "scripts" / "ddp_loop.py"
RANKS = 2
STEP_LINE = r"step (?P<step>\d+) loss (?P<loss>\S+)"


def torchrun_command() -> list[str]:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


class Torchrun:
    """`torchrun --standalone --nproc-per-node 2 SCRIPT ARGS`, its output lines kept with their times."""

    def __init__(self, args: list[str], max_restarts: int, cwd: Path):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            torchrun_command() + ["--standalone", f"--nproc-per-node={RANKS}", f"--max-restarts={max_restarts}",
                                  "--monitor-interval=0.1", str(SCRIPT), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env,
            start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def ranks(self) -> list[int]:
        """The pids of the script's rank processes now alive (children of torchrun's agent)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in kids:
            try:
                if str(SCRIPT) in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_for_new_ranks(self, old: set[int], timeout: float) -> float | None:
        """When every rank alive is a new one (none of `old`); None if not within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.ranks()
            if len(now) == RANKS and not set(now) & old:
                return time.monotonic()
            if self.proc.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    def first_line_after(self, since: float, needle: str, timeout: float) -> float | None:
        """When a line holding `needle` was printed after `since`; None if none came within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if at > since and needle in line:
                    return at
            if self.proc.poll() is not None and not self._reader.is_alive():
                return None
            time.sleep(0.02)
        return None

    def end(self) -> None:
        """Kill torchrun and its ranks: they run in process groups of their own, and a SIGKILLed
        torchrun leaves them training as orphans."""
        ranks = [psutil.Process(pid) for pid in self.ranks() if psutil.pid_exists(pid)]
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for rank in ranks:
            try:
                rank.kill()
            except psutil.Error:
                pass
        self.proc.wait()


def herd_config(tmp: Path, args: list[str], max_restarts: int, name: str = "gang") -> RunConfig:
    """The same script as a torchherd script gang of 2 CPU ranks, restarting at once."""
    data = {"runs_dir": str(tmp / "runs"), "name": name,
            "pipelines": [{"name": name, "script": str(SCRIPT), "args": args, "ranks": RANKS,
                           "metrics": STEP_LINE}],
            "devices": {"placement": "cpu", "cpu_slots": RANKS, "threads_per_worker": 1},
            "restart": {"max_restarts": max_restarts, "backoff": 0.0, "min_uptime": 0.5},
            "validation": {"mode": "off"}, "telemetry": {"enabled": False}}
    return parse_config(data, str(tmp / "gang.toml"), tmp)
