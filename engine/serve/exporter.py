"""`torchherd exporter`'s figures: every live run of the user on this box (found as `ls` finds them) as
Prometheus metrics, labelled by run and pipeline, and the device ledger's holdings.

Each run's events.jsonl is read from where the last scrape stopped and folded as the app folds it
(protocol/progress.py), so a scrape never asks a supervisor anything and costs the runs nothing.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..protocol import messages as m
from ..protocol.health import Alert
from ..protocol.progress import PipelineProgress, apply
from ..protocol.states import WorkerState
from ..rundir.history import decode_lines
from .runtime import live_runs

BLOCK = 8 << 20  # bytes of events.jsonl read at once: a long run's first scrape reads it in pieces
PIPE = ["run", "pipeline"]


@dataclass
class RunTail:
    """One live run's events.jsonl, read on from where the last scrape stopped: each pipeline's progress, its
    newest validation figures and its alerts by rule (run-wide ones under pipeline "")."""

    path: Path
    offset: int = 0  # bytes of events.jsonl folded so far (whole lines)
    inode: int = 0
    pipelines: dict[str, PipelineProgress] = field(default_factory=dict)
    validation: dict[str, dict[str, float]] = field(default_factory=dict)  # pipeline -> its newest result
    alerts: dict[tuple[str, str], int] = field(default_factory=dict)  # (pipeline, rule) -> times fired

    @property
    def run_id(self) -> str:
        return self.path.name

    def read_on(self) -> None:
        """Fold what the run wrote since the last call; a file replaced or cut shorter is read again whole."""
        try:
            fh = open(self.path / "events.jsonl", "rb")
        except OSError:
            return
        with fh:
            info = os.fstat(fh.fileno())
            if info.st_ino != self.inode or info.st_size < self.offset:  # from the start, as a new run
                self.offset, self.inode = 0, info.st_ino
                self.pipelines, self.validation, self.alerts = {}, {}, {}
            fh.seek(self.offset)
            while True:
                data = fh.read(BLOCK)
                whole = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next scrape
                if not whole:
                    return
                self.offset += len(whole)
                self._fold(decode_lines(whole))
                if len(whole) < len(data) or len(data) < BLOCK:
                    return
                fh.seek(self.offset)

    def _fold(self, events: list[m.Event]) -> None:
        # Between two other events of a pipeline, its step reports and epoch ends only overwrite the same
        # figures: the first step report (where the step rate counts from) and the newest of each, in their
        # order, give what folding them all would, and they are most of a live stream.
        pending: dict[str, dict[object, tuple[int, m.Event]]] = {}
        for i, event in enumerate(events):
            if isinstance(event, (m.StepMetrics, m.EpochEnd)):
                kept = pending.setdefault(event.pipeline, {})
                if isinstance(event, m.StepMetrics):
                    kept.setdefault("first", (i, event))
                kept[type(event)] = (i, event)
                continue
            for _, held in sorted(pending.pop(m.pipeline_of(event), {}).values(), key=_first):
                self._apply(held)
            self._apply(event)
        for kept in pending.values():
            for _, held in sorted(kept.values(), key=_first):
                self._apply(held)

    def _apply(self, event: m.Event) -> None:
        if isinstance(event, (m.RunStarted, m.ConfigAdded)):
            for name in event.pipelines:
                self.pipelines.setdefault(name, PipelineProgress(name))
            return
        name = m.pipeline_of(event)
        if isinstance(event, Alert):
            key = (name, event.rule)
            self.alerts[key] = self.alerts.get(key, 0) + max(1, event.count)
            return
        if not name:
            return
        if isinstance(event, m.ValResult) and not event.error:
            self.validation[name] = dict(event.metrics)
        progress = self.pipelines.get(name) or PipelineProgress(name)
        try:
            self.pipelines[name] = apply(progress, event)
        except ValueError:  # a state this version does not know (the file is data anyone may have written)
            self.pipelines[name] = progress


def _first(item: tuple[int, m.Event]) -> int:
    return item[0]


@dataclass(frozen=True)
class Holding:
    """One lease of the device ledger, as exported."""

    device: str
    run: str
    pipeline: str
    rank: int
    memory: int | None  # bytes of the GPU reserved; None: the whole device


def ledger_holdings() -> list[Holding]:
    """Every live lease of the user's device ledger on this machine; none when it cannot be read."""
    from ..hardware.ledger import Ledger

    try:
        return [Holding(x.device, x.run, x.pipeline, x.rank, x.memory) for x in Ledger().leases()]
    except (OSError, RuntimeError):
        return []


class BoxCollector(Collector):
    """A Prometheus collector of every live run of the user on this box: at each scrape the runs that ended
    drop out, the runs started since come in, and each run's new events are folded."""

    def __init__(self) -> None:
        self._tails: dict[Path, RunTail] = {}
        self._lock = threading.Lock()  # two scrapes at once fold each file once

    def refresh(self) -> list[RunTail]:
        """Every live run's tail, read on to now."""
        with self._lock:
            live = {p.resolve(): p for p in live_runs()}
            self._tails = {key: self._tails.get(key) or RunTail(path) for key, path in live.items()}
            for tail in self._tails.values():
                tail.read_on()
            return sorted(self._tails.values(), key=lambda t: t.run_id)

    def collect(self) -> Iterator[Metric]:
        tails = self.refresh()
        yield from run_metrics(tails)
        yield from ledger_metrics(ledger_holdings())


def _gauge(name: str, text: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"torchherd_{name}", text, labels=labels)


def run_metrics(tails: list[RunTail]) -> Iterator[Metric]:
    """Each run's and each pipeline's figures as metric families."""
    runs = _gauge("run_live", "a live run of the user on this box (1), with its run directory", ["run", "run_dir"])
    state = _gauge("pipeline_state", "1 for the pipeline's state, 0 for every other", [*PIPE, "state"])
    step = _gauge("pipeline_step", "optimizer steps so far, every epoch", PIPE)
    epoch = _gauge("pipeline_epoch", "the epoch in progress, from 0", PIPE)
    loss = _gauge("pipeline_train_loss", "the newest training loss reported", PIPE)
    val = _gauge("pipeline_validation", "the newest validation result, by metric", [*PIPE, "metric"])
    rate = _gauge("pipeline_samples_per_second", "training throughput at the newest step report", PIPE)
    device = _gauge("pipeline_device", "a device the pipeline's worker runs on (1)", [*PIPE, "device"])
    ranks = _gauge("pipeline_ranks", "processes its running attempt trains in (a gang's ranks)", PIPE)
    most = _gauge("pipeline_ranks_max", "an elastic gang's MAX ranks (ranks = \"MIN:MAX\")", PIPE)
    restarts = CounterMetricFamily("torchherd_pipeline_restarts", "restarts after a crash, from the budget",
                                   labels=PIPE)
    alerts = CounterMetricFamily("torchherd_alerts", "times an alert rule fired (pipeline \"\": the whole run)",
                                 labels=[*PIPE, "rule"])
    for tail in tails:
        run = tail.run_id
        runs.add_metric([run, str(tail.path)], 1)
        for name, p in tail.pipelines.items():
            for s in WorkerState:
                state.add_metric([run, name, s.value], float(p.state == s))
            step.add_metric([run, name], p.step)
            epoch.add_metric([run, name], p.epoch)
            restarts.add_metric([run, name], p.restarts)
            if p.train_loss is not None:
                loss.add_metric([run, name], p.train_loss)
            if p.samples_per_s is not None:
                rate.add_metric([run, name], p.samples_per_s)
            for key, value in tail.validation.get(name, {}).items():
                val.add_metric([run, name, key], value)
            if p.pid is not None:  # a worker runs: the devices it holds
                for one in filter(None, p.device.split(",")):
                    device.add_metric([run, name, one], 1)
                ranks.add_metric([run, name], p.ranks or 1)
            if p.elastic:
                most.add_metric([run, name], p.max_ranks)
        for (name, rule), count in sorted(tail.alerts.items()):
            alerts.add_metric([run, name, rule], count)
    yield from (runs, state, step, epoch, loss, val, rate, device, ranks, most, restarts, alerts)


def ledger_metrics(holdings: list[Holding]) -> Iterator[Metric]:
    """The device ledger's leases: which run's pipeline (and rank) holds which device, and how much of it."""
    labels = ["device", "run", "pipeline", "rank"]
    held = _gauge("ledger_lease", "a device lease in the user's ledger on this box (1)", labels)
    memory = _gauge("ledger_lease_memory_bytes", "bytes of the GPU's memory a lease reserves (absent: the whole "
                    "device)", labels)
    for h in holdings:
        row = [h.device, h.run, h.pipeline, str(h.rank)]
        held.add_metric(row, 1)
        if h.memory is not None:
            memory.add_metric(row, h.memory)
    yield from (held, memory)


class MetricsServer:
    """`/metrics` of a `BoxCollector` over HTTP on `host`:`port` (0: any free port), served from a thread of
    its own; OSError when it cannot listen there."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(BoxCollector())
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        address = self._server.server_address
        self.host: str = address[0] if isinstance(address[0], str) else address[0].decode()
        self.port: int = int(address[1])

    def close(self) -> None:
        """Stop serving and wait for the serving thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
