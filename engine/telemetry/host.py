"""This machine's side of telemetry, read through psutil: worker process trees and the host's CPU and memory.

`ProcessTrees` sums each worker with its descendants (DataLoader workers ...);
`HostReader` reads the host. A process that vanished or is hidden is left out, never an error.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..protocol.telemetry import OWNER_OTHER, OWNER_UNKNOWN

# CPU seconds (summed over cores) a host reading must span: five of /proc/stat's 10 ms ticks
MIN_CPU_DELTA = 0.05


@dataclass(frozen=True)
class TreeReading:
    """A worker and its live descendants, summed."""

    cpu_percent: float | None  # percent of one core, summed over the tree
    rss: int  # bytes, summed
    pids: tuple[int, ...]  # the worker first, then the descendants that answered


class ProcessTrees:
    """Worker process trees, read each pass; a full /proc scan for new descendants only every `tree_every` s.

    Not thread-safe: the sampler holds its lock around every call.
    """

    def __init__(self, tree_every: float = 5.0, in_container: bool | None = None) -> None:
        # seconds between full /proc scans for new descendants (DataLoader workers);
        # known ones are read every pass, and a change of worker pids forces a scan
        self.tree_every = tree_every
        # Inside a container NVML may report host pids, which could collide with
        # unrelated pids here: anything not ours is then "unknown owner".
        self.in_container = detect_container() if in_container is None else in_container
        self._procs: dict[int, psutil.Process] = {}  # cached so cpu_percent spans passes
        self._descendants: dict[int, list[int]] = {}  # worker pid -> descendant pids
        self._scanned_roots: frozenset[int] = frozenset()
        self._last_scan = float("-inf")  # monotonic seconds

    def clear(self) -> None:
        """Forget every cached process; the next pass scans afresh."""
        self._procs.clear()
        self._descendants.clear()
        self._scanned_roots = frozenset()

    def trees(self, workers: dict[str, int]) -> dict[str, list[int]]:
        """Pipeline -> [worker pid, descendant pids...]; a full /proc scan only every `tree_every` s."""
        roots = frozenset(workers.values())
        now = time.monotonic()
        if roots != self._scanned_roots or now - self._last_scan >= self.tree_every:
            children = defaultdict(list)
            for pid, ppid in ppid_map().items():
                children[ppid].append(pid)
            self._descendants = {root: _walk(root, children) for root in roots}
            self._scanned_roots, self._last_scan = roots, now
        trees = {name: [pid, *self._descendants.get(pid, ())] for name, pid in workers.items()}
        live = {pid for pids in trees.values() for pid in pids}
        for pid in [p for p in self._procs if p not in live]:  # exited or no longer ours
            del self._procs[pid]
        return trees

    def read(self, root: int, tree: list[int]) -> TreeReading | None:
        """CPU and RSS of a worker and its live descendants; None when the worker itself is gone."""
        cpu_total, rss_total, live, root_fresh = 0.0, 0, [], False
        for pid in tree:
            fresh = pid not in self._procs
            try:
                proc = psutil.Process(pid) if fresh else self._procs[pid]
                # no oneshot(): for these two reads it costs more than it saves (~2x, measured)
                cpu = proc.cpu_percent()  # percent of one core since this object's last call
                rss = proc.memory_info().rss  # bytes
                if not rss:  # ended and not yet reaped: Linux reads a zombie as using no memory
                    raise psutil.ZombieProcess(pid)
            except psutil.Error:  # NoSuchProcess, ZombieProcess, AccessDenied: leave it out
                self._procs.pop(pid, None)
                if pid == root:
                    return None  # the worker is gone: dropped silently
                if pid in (known := self._descendants.get(root, [])):
                    known.remove(pid)
                continue
            self._procs[pid] = proc
            root_fresh = root_fresh or (pid == root and fresh)
            cpu_total += cpu  # a fresh child adds 0.0 once
            rss_total += rss
            live.append(pid)
        # a fresh worker's first cpu_percent has nothing to compare against
        return TreeReading(None if root_fresh else cpu_total, rss_total, tuple(live))

    def foreign_owner(self, pid: int) -> str:
        """Whose a GPU process is when it is none of our workers': OWNER_OTHER or OWNER_UNKNOWN."""
        if self.in_container:
            return OWNER_UNKNOWN  # may be a host pid: a local match would be a guess
        return OWNER_OTHER if psutil.pid_exists(pid) else OWNER_UNKNOWN


class HostReader:
    """The host's CPU share, memory and load; its CPU baseline is taken when it is made."""

    def __init__(self) -> None:
        # host (total, idle) CPU seconds at the start of the current measurement, taken now so
        # the first pass already has something to compare against
        self._last_cpu: tuple[float, float] | None = _cpu_counters()
        self._host_percent: float | None = None  # the newest host reading, repeated until the next one

    def sample(self) -> dict[str, Any]:
        """TelemetrySnapshot's host fields that could be read: host_cpu_percent, host_mem_*, load1."""
        host: dict[str, Any] = {"host_cpu_percent": self.cpu_percent()}
        try:
            mem = psutil.virtual_memory()
            # total minus available: what people mean by "used", unlike psutil's `used`
            host["host_mem_used"], host["host_mem_total"] = mem.total - mem.available, mem.total
        except (OSError, psutil.Error):
            pass
        try:
            host["load1"] = os.getloadavg()[0]
        except (OSError, AttributeError):  # not on every platform
            pass
        return host

    def cpu_percent(self) -> float | None:
        """Percent of all cores busy since the previous reading, from our own cpu_times deltas.

        psutil.cpu_percent() keeps one module-wide baseline that any other caller
        in the process would reset, so the sampler keeps its own. /proc/stat moves
        in clock ticks (10 ms per core): a pass sooner than MIN_CPU_DELTA after the
        baseline keeps the baseline and repeats the last reading, instead of
        reporting nothing (or a 0%/100% guess from one tick).
        """
        now = _cpu_counters()
        if now is None:
            return None
        last = self._last_cpu
        if last is None or now[0] < last[0]:  # first pass, or counters reset (a restored VM)
            self._last_cpu = now
            return self._host_percent
        elapsed = now[0] - last[0]  # CPU seconds, summed over every core
        if elapsed < MIN_CPU_DELTA:
            return self._host_percent
        busy = 1.0 - (now[1] - last[1]) / elapsed
        self._last_cpu = now
        self._host_percent = round(min(100.0, max(0.0, busy * 100.0)), 1)
        return self._host_percent


def ppid_map() -> dict[int, int]:
    """{pid: ppid} for every process, in one /proc pass.

    Process.children(recursive=True) makes this same pass once per call, i.e.
    once per worker; psutil exposes the one-shot map only privately, hence the fallback.
    """
    scan = getattr(psutil, "_ppid_map", None)
    if scan is not None:
        try:
            found: dict[int, int] = scan()
            return found
        except psutil.Error:  # AccessDenied under hidepid
            pass
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"]) if p.info["ppid"] is not None}


def _cpu_counters() -> tuple[float, float] | None:
    """Host (total, idle) CPU seconds summed over every core; None when they cannot be read."""
    try:
        t = psutil.cpu_times()
    except (OSError, psutil.Error):
        return None
    # guest time is already inside user/nice on Linux
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return total, t.idle + getattr(t, "iowait", 0.0)


def _walk(root: int, children: dict[int, list[int]]) -> list[int]:
    out, stack, seen = [], list(children.get(root, ())), {root}
    while stack:
        pid = stack.pop()
        if pid in seen:  # pid 0's entry lists itself on some systems
            continue
        seen.add(pid)
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def detect_container() -> bool:
    """Whether this process runs in a container (Docker, Podman, Kubernetes, LXC), by the usual marks."""
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(key in cgroup for key in ("docker", "kubepods", "containerd", "libpod", "lxc"))
