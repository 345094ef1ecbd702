"""GPU, worker-process and host telemetry sampled on a background thread.

`TelemetrySampler` reads NVML (one pass over every visible GPU) and psutil
(each worker and its descendants, plus the host) at a fixed cadence, hands each
`TelemetrySnapshot` to a callback and appends some of them to `telemetry.jsonl`.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

from ..hardware.devices import GpuInfo, filter_visible, list_gpus, nvml_reason, visible_from_env
from ..protocol.messages import OWNER_OTHER, OWNER_UNKNOWN, GpuProcess, GpuSample, ProcessSample, TelemetrySnapshot
from ..protocol.records import to_record

log = logging.getLogger(__name__)

NVML_ERROR_GPU_IS_LOST = 15  # pynvml's value; a lost GPU is not asked again
# CPU seconds (summed over cores) a host reading must span: five of /proc/stat's 10 ms ticks
MIN_CPU_DELTA = 0.05


@dataclass
class _Gpu:
    info: GpuInfo
    handle: Any
    lost: str = ""  # why NVML gave up on it; set once, then no more calls


@dataclass(frozen=True)
class _TreeReading:
    cpu_percent: float | None  # percent of one core, summed over the tree
    rss: int  # bytes, summed
    pids: tuple[int, ...]  # the worker first, then the descendants that answered


class TelemetrySampler:
    """Samples GPUs, worker process trees and the host every `interval` seconds on its own thread.

    `pids` maps pipeline name to worker pid; it is called from the sampler thread
    once a pass, so it must be cheap and thread-safe. `on_snapshot` is called from
    the sampler thread too. `latest` holds the newest snapshot for readers that poll.
    """

    def __init__(self, interval: float = 1.0,
                 pids: Callable[[], dict[str, int]] | None = None,
                 on_snapshot: Callable[[TelemetrySnapshot], None] | None = None,
                 nvml: Any = None,
                 persist_path: Path | None = None,
                 persist_every: float = 10.0,
                 *,
                 tree_every: float = 5.0,
                 in_container: bool | None = None,
                 extend: Callable[[TelemetrySnapshot], TelemetrySnapshot] | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"telemetry interval must be > 0 seconds, got {interval}")
        self.interval = interval  # seconds
        self.persist_path = Path(persist_path) if persist_path is not None else None
        self.persist_every = persist_every  # seconds between telemetry.jsonl lines
        # seconds between full /proc scans for new descendants (DataLoader workers);
        # known ones are read every pass, and a change of worker pids forces a scan
        self.tree_every = tree_every
        self.latest: TelemetrySnapshot | None = None
        self._pids = pids or dict
        self._on_snapshot = on_snapshot
        # adds what other nodes sampled (engine/launch/ray/telemetry.py); runs on the sampler thread, off the loop
        self._extend = extend
        self._nvml_given = nvml
        # Inside a container NVML may report host pids, which could collide with
        # unrelated pids here: anything not ours is then "unknown owner".
        self._in_container = _detect_container() if in_container is None else in_container

        self._lock = threading.Lock()  # one pass at a time; guards every cache below
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._nvml_state = "new"  # "new" -> "ready" | "off"; "off" is never retried
        self._gpus: list[_Gpu] = []
        self._gpu_note = ""
        self._procs: dict[int, psutil.Process] = {}  # cached so cpu_percent spans passes
        self._descendants: dict[int, list[int]] = {}  # worker pid -> descendant pids
        self._scanned_roots: frozenset[int] = frozenset()
        self._last_scan = float("-inf")  # monotonic seconds
        # host (total, idle) CPU seconds at the start of the current measurement, taken now so
        # the first pass already has something to compare against
        self._last_cpu: tuple[float, float] | None = _cpu_counters()
        self._host_percent: float | None = None  # the newest host reading, repeated until the next one
        self._out: TextIO | None = None
        self._last_persist = float("-inf")  # monotonic seconds
        self._warned: set[str] = set()  # problems already logged; a 1 Hz loop must not spam

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the sampler thread (NVML is opened on it, so a slow init never blocks the caller)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="torchherd-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting at most `timeout` seconds), shut NVML down, close telemetry.jsonl."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            if thread is threading.current_thread():  # called from on_snapshot: the loop closes up
                return
            thread.join(timeout)
            if thread.is_alive():  # stuck in a driver call: it closes up if it ever returns
                log.warning("telemetry sampler did not stop within %.1f s", timeout)
                return
        with self._lock:
            self._close()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                snapshot = self.sample_once()
            except Exception:  # a bug in a pass must not end telemetry for the run
                self._warn_once("pass", "telemetry pass failed", exc_info=True)
            else:
                if self._extend is not None:
                    try:
                        snapshot = self.latest = self._extend(snapshot)
                    except Exception:  # other nodes' figures are extra: this node's still go out
                        self._warn_once("extend", "telemetry extend callback failed", exc_info=True)
                self._persist(snapshot)
                if self._on_snapshot is not None:
                    try:
                        self._on_snapshot(snapshot)
                    except Exception:
                        self._warn_once("callback", "telemetry on_snapshot callback failed", exc_info=True)
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # fell behind (suspended, slow driver): skip ticks, do not burst
                next_at = now + self.interval
            self._stop.wait(next_at - now)
        with self._lock:
            self._close()  # NVML is shut down on the thread that used it

    def _close(self) -> None:  # idempotent
        if self._nvml_state == "ready":
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml_state, self._gpus = "new", []
        if self._out is not None:
            self._out.close()
            self._out = None
        self._procs.clear()
        self._descendants.clear()
        self._scanned_roots = frozenset()

    # --------------------------------------------------------------------- pass

    def sample_once(self) -> TelemetrySnapshot:
        """Take one snapshot now (opening NVML on first use); safe to call from any thread."""
        with self._lock:
            started = time.perf_counter()
            workers = self._workers()
            trees = self._worker_trees(workers)
            # workers first: a GPU process is ours only if it is in a tree we could read this pass
            read = {name: r for name, tree in trees.items() if (r := self._read_tree(workers[name], tree))}
            owner_of = {pid: name for name, r in read.items() for pid in r.pids}
            gpus, gpu_memory = self._sample_gpus(owner_of)
            processes = tuple(
                ProcessSample(pipeline=name, pid=workers[name], cpu_percent=r.cpu_percent, rss=r.rss,
                              children=len(r.pids) - 1,
                              gpu_memory=None if gpu_memory is None else gpu_memory.get(name, 0))
                for name, r in read.items())
            self.latest = TelemetrySnapshot(gpus=gpus, processes=processes, **self._sample_host(),
                                            gpu_note=self._gpu_note,
                                            sample_ms=(time.perf_counter() - started) * 1000.0)
            return self.latest

    def _workers(self) -> dict[str, int]:
        try:
            # a pid not yet known (None, 0) must not become psutil.Process(None): that is us
            return {name: pid for name, pid in self._pids().items() if isinstance(pid, int) and pid > 0}
        except Exception:  # the caller's bug: keep GPU and host telemetry going
            self._warn_once("pids", "telemetry pids() callback failed", exc_info=True)
            return {}

    def _warn_once(self, key: str, text: str, *args: Any, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text, *args, exc_info=exc_info)

    # --------------------------------------------------------------------- GPUs

    def _open_nvml(self) -> None:
        """Init NVML and list the visible GPUs, once; on failure record why and never retry."""
        nvml = self._nvml_given
        try:
            if nvml is None:
                import pynvml as nvml  # from nvidia-ml-py
            nvml.nvmlInit()
        except ImportError:
            self._nvml_state, self._gpu_note = "off", "nvidia-ml-py is not installed; no GPU telemetry"
            return
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._nvml_state, self._gpu_note = "off", f"no NVIDIA GPU ({nvml_reason(exc)})"
            return
        try:
            found, skipped = list_gpus(nvml)
        except Exception as exc:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml_state, self._gpu_note = "off", f"NVML failed ({nvml_reason(exc)})"
            return
        handles = {info.index: handle for info, handle in found}
        visible = filter_visible([info for info, _ in found], visible_from_env())
        self._nvml, self._nvml_state = nvml, "ready"
        self._gpus = [_Gpu(info, handles[info.index]) for info in visible]
        if not self._gpus:
            skipped.append("no NVIDIA GPU visible to torchherd")
        self._gpu_note = "; ".join(skipped)

    def _sample_gpus(self, owner_of: dict[int, str]) -> tuple[tuple[GpuSample, ...], dict[str, int] | None]:
        """One pass over every GPU; also GPU bytes per pipeline (None when no process list was read)."""
        if self._nvml_state == "new":
            self._open_nvml()
        if self._nvml_state != "ready":
            return (), None
        samples = []
        per_pipeline: dict[str, int] | None = None
        for gpu in self._gpus:
            sample, procs = self._read_gpu(gpu, owner_of)
            samples.append(sample)
            if procs is not None:
                per_pipeline = per_pipeline if per_pipeline is not None else defaultdict(int)
                for p in procs:
                    if p.pid in owner_of and p.used_memory is not None:
                        per_pipeline[p.owner] += p.used_memory
        return tuple(samples), per_pipeline

    def _read_gpu(self, gpu: _Gpu, owner_of: dict[int, str]) -> tuple[GpuSample, tuple[GpuProcess, ...] | None]:
        nvml, errors = self._nvml, []

        def read(name: str, *args: Any) -> Any:
            fn = getattr(nvml, name)  # outside the try: a missing function is our bug, not an absence
            if gpu.lost:
                return None
            try:
                return fn(gpu.handle, *args)
            except Exception as exc:  # NotSupported, NoPermission, GpuIsLost, ...
                errors.append(exc)
                if getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST or "GpuIsLost" in type(exc).__name__:
                    gpu.lost = nvml_reason(exc)
                return None

        util = read("nvmlDeviceGetUtilizationRates")
        mem = read("nvmlDeviceGetMemoryInfo")
        # nvmlDeviceGetTemperature is deprecated in nvidia-ml-py 13 and due to go in CUDA 14
        temp_fn = "nvmlDeviceGetTemperature" if hasattr(nvml, "nvmlDeviceGetTemperature") else "nvmlDeviceGetTemperatureV"
        temperature = read(temp_fn, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        power = read("nvmlDeviceGetPowerUsage")  # milliwatts
        limit = read("nvmlDeviceGetEnforcedPowerLimit")  # milliwatts
        raw = read("nvmlDeviceGetComputeRunningProcesses")

        procs = None
        if raw is not None:
            procs = tuple(GpuProcess(pid=int(p.pid), used_memory=_int(p.usedGpuMemory),
                                     owner=owner_of.get(int(p.pid)) or self._foreign_owner(int(p.pid)))
                          for p in raw)
        if gpu.lost:
            note = gpu.lost
        elif errors and all(v is None for v in (util, mem, temperature, power, limit, raw)):
            note = nvml_reason(errors[0])
        else:
            note = ""
        info = gpu.info
        return GpuSample(
            index=info.index, uuid=info.uuid, name=info.name,
            util_gpu=_int(getattr(util, "gpu", None)), util_mem=_int(getattr(util, "memory", None)),
            mem_used=_int(getattr(mem, "used", None)),
            mem_total=_int(getattr(mem, "total", None)) if mem is not None else info.memory_total,
            temperature=_int(temperature),
            power_draw=power / 1000.0 if power is not None else None,
            power_limit=limit / 1000.0 if limit is not None else None,
            processes=procs,
            mem_other=None if procs is None else sum(
                p.used_memory for p in procs if p.pid not in owner_of and p.used_memory is not None),
            note=note,
        ), procs

    def _foreign_owner(self, pid: int) -> str:
        if self._in_container:
            return OWNER_UNKNOWN  # may be a host pid: a local match would be a guess
        return OWNER_OTHER if psutil.pid_exists(pid) else OWNER_UNKNOWN

    # ------------------------------------------------------------ worker trees

    def _worker_trees(self, workers: dict[str, int]) -> dict[str, list[int]]:
        """Pipeline -> [worker pid, descendant pids...]; a full /proc scan only every `tree_every` s."""
        roots = frozenset(workers.values())
        now = time.monotonic()
        if roots != self._scanned_roots or now - self._last_scan >= self.tree_every:
            children = defaultdict(list)
            for pid, ppid in _ppid_map().items():
                children[ppid].append(pid)
            self._descendants = {root: _walk(root, children) for root in roots}
            self._scanned_roots, self._last_scan = roots, now
        trees = {name: [pid, *self._descendants.get(pid, ())] for name, pid in workers.items()}
        live = {pid for pids in trees.values() for pid in pids}
        for pid in [p for p in self._procs if p not in live]:  # exited or no longer ours
            del self._procs[pid]
        return trees

    def _read_tree(self, root: int, tree: list[int]) -> _TreeReading | None:
        """CPU and RSS of a worker and its live descendants; None when the worker itself is gone."""
        cpu_total, rss_total, live, root_fresh = 0.0, 0, [], False
        for pid in tree:
            fresh = pid not in self._procs
            try:
                proc = psutil.Process(pid) if fresh else self._procs[pid]
                # no oneshot(): for these two reads it costs more than it saves (~2x, measured)
                cpu = proc.cpu_percent()  # percent of one core since this object's last call
                rss = proc.memory_info().rss  # bytes
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
        return _TreeReading(None if root_fresh else cpu_total, rss_total, tuple(live))

    # --------------------------------------------------------------------- host

    def _sample_host(self) -> dict[str, Any]:
        host: dict[str, Any] = {"host_cpu_percent": self._host_cpu()}
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

    def _host_cpu(self) -> float | None:
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

    # -------------------------------------------------------------- persistence

    def _persist(self, snapshot: TelemetrySnapshot) -> None:
        """Append the snapshot to telemetry.jsonl if `persist_every` seconds have passed."""
        if self.persist_path is None:
            return
        now = time.monotonic()
        if now - self._last_persist < self.persist_every:
            return
        self._last_persist = now
        try:
            if self._out is None:
                self.persist_path.parent.mkdir(parents=True, exist_ok=True)
                self._out = open(self.persist_path, "a", encoding="utf-8")
            self._out.write(json.dumps(to_record(snapshot)) + "\n")
            self._out.flush()
        except OSError as exc:  # disk full, directory removed: telemetry goes on in memory
            self._warn_once("persist", "cannot write %s: %s", self.persist_path, exc)


def _ppid_map() -> dict[int, int]:
    """{pid: ppid} for every process, in one /proc pass.

    Process.children(recursive=True) makes this same pass once per call, i.e.
    once per worker; psutil exposes the one-shot map only privately, hence the fallback.
    """
    scan = getattr(psutil, "_ppid_map", None)
    if scan is not None:
        try:
            return scan()
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


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _detect_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    if "KUBERNETES_SERVICE_HOST" in os.environ:
        return True
    try:
        cgroup = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(key in cgroup for key in ("docker", "kubepods", "containerd", "libpod", "lxc"))
