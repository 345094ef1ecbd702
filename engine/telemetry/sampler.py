"""GPU, worker-process and host telemetry sampled on a background thread.

`TelemetrySampler` reads NVML (`gpus.py`: one pass over every visible GPU) and psutil
(`host.py`: each worker and its descendants, plus the host) at a fixed cadence, hands each
`TelemetrySnapshot` to a callback and appends some of them to `telemetry.jsonl`.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, cast

from ..hardware.devices import Nvml
from ..protocol.nolinks import open_file
from ..protocol.records import to_record
from ..protocol.telemetry import ProcessSample, TelemetrySnapshot
from ..rundir.lines import trim_torn_line
from .gpus import GpuReader
from .host import HostReader, ProcessTrees

log = logging.getLogger(__name__)


class TelemetrySampler:
    """Samples GPUs, worker process trees and the host every `interval` seconds on its own thread.

    `pids` maps pipeline name to worker pid; it is called from the sampler thread
    once a pass, so it must be cheap and thread-safe. `on_snapshot` is called from
    the sampler thread too. `latest` holds the newest snapshot for readers that poll.
    """

    def __init__(self, interval: float = 1.0,
                 pids: Callable[[], dict[str, int]] | None = None,
                 on_snapshot: Callable[[TelemetrySnapshot], object] | None = None,
                 nvml: Nvml | None = None,
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
        self.latest: TelemetrySnapshot | None = None
        self._pids = pids or dict
        self._on_snapshot = on_snapshot
        # adds what other nodes sampled (engine/launch/ray/telemetry.py); runs on the sampler thread, off the loop
        self._extend = extend
        self._trees = ProcessTrees(tree_every, in_container)
        self._gpus = GpuReader(nvml, self._trees.foreign_owner)
        self._host = HostReader()

        self._lock = threading.Lock()  # one pass at a time; guards the readers and the file
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
        self._gpus.close()
        if self._out is not None:
            self._out.close()
            self._out = None
        self._trees.clear()

    # --------------------------------------------------------------------- pass

    def sample_once(self) -> TelemetrySnapshot:
        """Take one snapshot now (opening NVML on first use); safe to call from any thread."""
        with self._lock:
            started = time.perf_counter()
            workers = self._workers()
            trees = self._trees.trees(workers)
            # workers first: a GPU process is ours only if it is in a tree we could read this pass
            read = {name: r for name, tree in trees.items() if (r := self._trees.read(workers[name], tree))}
            owner_of = {pid: name for name, r in read.items() for pid in r.pids}
            gpus, gpu_memory = self._gpus.sample(owner_of)
            processes = tuple(
                ProcessSample(pipeline=name, pid=workers[name], cpu_percent=r.cpu_percent, rss=r.rss,
                              children=len(r.pids) - 1,
                              gpu_memory=None if gpu_memory is None else gpu_memory.get(name, 0))
                for name, r in read.items())
            self.latest = TelemetrySnapshot(gpus=gpus, processes=processes, **self._host.sample(),
                                            gpu_note=self._gpus.note,
                                            sample_ms=(time.perf_counter() - started) * 1000.0)
            return self.latest

    def _workers(self) -> dict[str, int]:
        try:
            # a pid not yet known (None, 0) must not become psutil.Process(None): that is us
            return {name: pid for name, pid in self._pids().items() if isinstance(pid, int) and pid > 0}
        except Exception:  # the caller's bug: keep GPU and host telemetry going
            self._warn_once("pids", "telemetry pids() callback failed", exc_info=True)
            return {}

    def _warn_once(self, key: str, text: str, *args: object, exc_info: bool = False) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text, *args, exc_info=exc_info)

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
                trim_torn_line(self.persist_path)  # a resume after a crash mid-line
                self._out = cast(TextIO, open_file(self.persist_path, "a", encoding="utf-8"))  # never via a link
            self._out.write(json.dumps(to_record(snapshot)) + "\n")
            self._out.flush()
        except OSError as exc:  # disk full, directory removed: telemetry goes on in memory
            self._warn_once("persist", "cannot write %s: %s", self.persist_path, exc)

