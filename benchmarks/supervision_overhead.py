"""What supervision costs: training speed bare vs under the supervisor, the status channel's capacity, and
the supervisor's CPU per step event in the run directory sink.

Prints samples/s of one task trained by a plain loop in this process and by a
supervised worker (same task, one thread each, best of several alternating runs),
their ratio, how many step events per second 4 workers push into the supervisor,
the worker-side CPU per reported step, and the CPU per step event of publishing it on the
supervisor's bus into a RunDirectory (now: one msgspec encoding, buffered writes, a worker's batch of step
reports published at once; before: JSON encoded per record by to_record + json.dumps, each line written to
events.jsonl and metrics.jsonl), with none and with 4 client fan-out taps.
and the same with the MLflow and W&B sinks' feed tapped on the bus (their hosts are processes of their own; what
counts is this process's CPU, their feed's writer threads included).
Run: python benchmarks/supervision_overhead.py [--only sink|trackers] [--quick] (--quick: every part once at the
least size)
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.hardware.devices import Inventory  # noqa: E402
from torchherd.engine.launch.process import LaunchSpec, ProcessLauncher  # noqa: E402
from torchherd.engine.protocol.spec import WorkerSpec  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, Notice, StepMetrics  # noqa: E402
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402

PARAMS = {"samples": 40_000, "features": 64, "hidden": 256, "lr": 0.01}
EPOCHS = 3
BATCH = 64


def bare_samples_per_s() -> float:
    """The task trained by the loop anyone would write, in this process, one thread."""
    import torch

    from torchherd.engine.runners.task.builtin import regression

    torch.set_num_threads(1)
    task = regression(PARAMS)
    loader = torch.utils.data.DataLoader(task.train_data, batch_size=BATCH, shuffle=True)
    model, opt = task.model, task.optimizer
    samples, start = 0, time.perf_counter()
    for _ in range(EPOCHS):
        for x, y in loader:
            loss = task.loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            samples += len(y)
        loss.item()
    return samples / (time.perf_counter() - start)


async def supervised_samples_per_s(tmp: Path) -> float:
    data = {"runs_dir": str(tmp), "pipelines": [{"name": "bench", "task": "regression", "params": PARAMS,
                                                 "max_epochs": EPOCHS, "batch_size": BATCH,
                                                 "log_every_n_steps": 10}],
            "devices": {"placement": "cpu", "cpu_slots": 1, "threads_per_worker": 1},
            "validation": {"mode": "off"}, "telemetry": {"enabled": False}}
    config = parse_config(data, str(tmp / "bench.toml"), tmp)
    sup = Supervisor(config, inventory=Inventory(cpu_count=os.cpu_count() or 1))
    stream = sup.subscribe()
    await sup.start()
    await sup.wait()
    await sup.shutdown()
    samples = duration = 0.0
    async for ev in stream:
        if isinstance(ev, EpochEnd):
            samples += ev.samples_per_s * ev.duration
            duration += ev.duration
    return samples / duration


async def channel_capacity(tmp: Path, workers: int = 4, count: int = 200_000) -> dict[str, float]:
    """Step events/s from `workers` flood workers into an asyncio reader, and their CPU per step."""
    launcher = ProcessLauncher()
    received = 0
    reports: list[dict] = []
    done = asyncio.Event()

    def on_events(events):
        nonlocal received
        for ev in events:
            if isinstance(ev, StepMetrics):
                received += 1
            elif isinstance(ev, Notice):
                reports.append(json.loads(ev.text))
                if len(reports) == workers:
                    done.set()

    handles = []
    tmp.mkdir(parents=True, exist_ok=True)  # the launcher makes a worker's folder inside its run folder, not this
    start = time.perf_counter()
    for i in range(workers):
        spec = LaunchSpec(child=WorkerSpec(pipeline={"name": f"w{i}", "params": {"count": count}}, validation={},
                                            device="cpu", threads=1, pipeline_dir=str(tmp / f"w{i}"), attempt=1),
                          log_path=tmp / f"w{i}" / "log.txt", gpu_index=None, module="benchmarks._flood_worker",
                          env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        handle = launcher.launch(spec)
        handle.attach(on_events)
        handles.append(handle)
    first = None
    while not done.is_set():
        await asyncio.sleep(0.01)
        if first is None and received:
            first = time.perf_counter()  # exclude interpreter start-up from the rate
    elapsed = time.perf_counter() - (first or start)
    for h in handles:
        h.proc.wait()
        h.close()
    assert received == workers * count, (received, workers * count)
    return {"events_per_s": received / elapsed,
            "loop_us": 1e6 * sum(r["loop_cpu"] for r in reports) / (workers * count),
            "total_us": 1e6 * sum(r["total_cpu"] for r in reports) / (workers * count)}


class OldRunDirectory:
    """The run directory sink as it was before events were encoded once: each event turned into a dict
    (to_record), encoded by json.dumps, and the text written to events.jsonl and to metrics.jsonl."""

    def __init__(self, path: Path):
        from torchherd.engine.rundir.directory import dumps
        from torchherd.engine.protocol.records import to_record

        path.mkdir(parents=True, exist_ok=True)
        self._dumps, self._to_record = dumps, to_record
        self._events = open(path / "events.jsonl", "a", encoding="utf-8")
        self._metrics: dict[str, object] = {}
        self.path = path

    def write(self, event) -> None:
        line = self._dumps(self._to_record(event)) + "\n"
        self._events.write(line)
        fh = self._metrics.get(event.pipeline)
        if fh is None:
            (self.path / event.pipeline).mkdir(exist_ok=True)
            fh = self._metrics[event.pipeline] = open(self.path / event.pipeline / "metrics.jsonl", "a",
                                                      encoding="utf-8")
        fh.write(line)

    def close(self) -> None:
        self._events.close()
        for fh in self._metrics.values():
            fh.close()


def sink_cost(tmp: Path, events: int = 200_000, rounds: int = 3) -> None:
    """CPU per step event published on the bus into the run directory: before vs now, best of `rounds`."""
    from torchherd.engine.rundir.directory import RunDirectory
    from torchherd.engine.serve.summary import HistorySummary
    from torchherd.engine.supervise.bus import EventBus

    steps = [StepMetrics(pipeline=f"p{i % 4}", epoch=0, step=i, loss=0.5 + 1e-6 * i, lr=0.01, samples_per_s=1280.0)
             for i in range(events)]

    def old(path: Path, clients: int) -> float:
        from torchherd.engine.serve.wire import encode

        out = OldRunDirectory(path)
        pending = [bytearray() for _ in range(clients)]

        def tap(event) -> None:  # the fan-out before: a frame encoded per event, copied to every client
            frame = encode(event)
            for buf in pending:
                buf += frame
        sinks = [out.write, tap] if clients else [out.write]  # the bus before: a loop over its sinks, no encoding

        def publish(event) -> None:
            for sink in sinks:
                sink(event)
        c = time.process_time()
        for i, event in enumerate(steps):
            publish(event)
            if i % 256 == 255:
                for buf in pending:
                    buf.clear()
        used = time.process_time() - c
        out.close()
        return used

    # A worker's batch: its own pipeline's step reports, at most 250 (what publish_steps takes in the supervisor).
    runs = [steps[k::4][j:j + 250] for j in range(0, events // 4, 250) for k in range(4)]

    def new(path: Path, clients: int, batched: bool = False) -> float:
        bus, out = EventBus(history=1), RunDirectory(path)
        bus.add_writer(out.write, out.write_steps)
        summary, pending = HistorySummary(), bytearray()

        def tap(event, line, kept) -> None:  # the fan-out now: the line, once, shared by every client
            summary.add(line, event.pipeline)
            if clients:
                pending.extend(line)
        bus.add_tap(tap)
        c = time.process_time()
        if batched:
            for run in runs:
                bus.publish_steps(run)
                pending.clear()
        else:
            for i, event in enumerate(steps):
                bus.publish(event)
                if i % 256 == 255:
                    pending.clear()
        used = time.process_time() - c
        out.close()
        return used

    for clients in (0, 4):
        before = min(old(tmp / f"old-{clients}-{r}", clients) for r in range(rounds))
        now = min(new(tmp / f"new-{clients}-{r}", clients) for r in range(rounds))
        batch = min(new(tmp / f"batch-{clients}-{r}", clients, batched=True) for r in range(rounds))
        print(f"run directory sink{' + 4 clients' if clients else ''}: {1e6 * before / events:.2f} us CPU per step "
              f"event before, {1e6 * now / events:.2f} us published one by one, {1e6 * batch / events:.2f} us a "
              f"worker's batch at a time (publish_steps, as the supervisor does); before/now {before / batch:.1f}x, "
              f"one by one/a batch at a time {now / batch:.2f}x ({events:,} events, best of {rounds})")


async def _publish_with_trackers(path: Path, runs: list, trackers: bool) -> float:
    """CPU of this process (every thread) to publish `runs` on a bus into a RunDirectory, with the MLflow and W&B
    sinks' feed tapped on it (step reports thinned to `[tracking] points_per_s`, its default) or not, until every
    line it hands on is in the hosts' pipes. The hosts are started and have imported their trackers before the clock starts; they are ended
    without waiting after it stops."""
    from torchherd.engine.rundir.directory import RunDirectory
    from torchherd.engine.sinks.feed import SinkFeed
    from torchherd.engine.supervise.bus import EventBus

    config = parse_config({"runs_dir": str(path.parent), "pipelines": [{"name": f"p{i}", "task": "regression"}
                                                                        for i in range(4)],
                           "tracking": {"mlflow": f"sqlite:///{path.parent / 'mlflow.db'}", "wandb": "offline",
                                        "buffer": 10_000_000}}, str(path.parent / "bench.toml"), path.parent)
    bus, out = EventBus(history=1), RunDirectory(path)
    out.save_config(config)
    bus.add_writer(out.write, out.write_steps)
    feed = None
    if trackers:
        feed = SinkFeed(config.tracking.specs(), path, False, config.tracking.buffer, lambda text, level: None,
                        config.tracking.points_per_s)
        while not all(h.ready or h.gone for h in feed.hosts):  # imported and connected: not the supervisor's CPU
            await asyncio.sleep(0.05)
        bus.add_tap(feed.on_event, feed.on_steps)
    c = time.process_time()
    for run in runs:
        bus.publish_steps(run)
        await asyncio.sleep(0)  # the loop turns between a worker's batches, as in the supervisor: hand-overs run
    while feed is not None and any(host.flush() for host in feed.hosts):  # every line into the pipes, counted
        await asyncio.sleep(0.01)
    used = time.process_time() - c
    out.close()
    if feed is not None:
        for host in feed.hosts:
            host.close(0.0)
    return used


def trackers_cost(tmp: Path, events: int, rounds: int) -> None:
    """The supervisor's CPU per step event with the MLflow and W&B sinks on vs off (goal <= 1.1x)."""
    steps = [StepMetrics(pipeline=f"p{i % 4}", epoch=0, step=i, loss=0.5 + 1e-6 * i, lr=0.01, samples_per_s=1280.0)
             for i in range(events)]
    runs = [steps[k::4][j:j + 250] for j in range(0, events // 4, 250) for k in range(4)]
    off, on = [], []
    for r in range(rounds):  # alternate, so drift on a shared machine hits both alike
        off.append(asyncio.run(_publish_with_trackers(tmp / f"off-{r}" / "run", runs, False)))
        on.append(asyncio.run(_publish_with_trackers(tmp / f"on-{r}" / "run", runs, True)))
    a, b = min(off), min(on)
    print(f"tracking sinks (MLflow + W&B offline): {1e6 * a / events:.2f} us supervisor CPU per step event off, "
          f"{1e6 * b / events:.2f} us on; on/off {b / a:.2f}x (goal <= 1.1; {events:,} events, best of {rounds} "
          "alternating)")


def main() -> None:
    global EPOCHS
    quick = "--quick" in sys.argv[1:]
    rounds = 1 if quick else int(os.environ.get("ROUNDS", "3"))
    if quick:  # CI's check that every part still runs: the least that takes each path
        EPOCHS = 1
        PARAMS["samples"] = 640
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        only = [a for a in sys.argv[1:] if a != "--quick"]
        if only != ["--only", "trackers"]:
            sink_cost(tmp / "sink", 2_000 if quick else 200_000, rounds)
        if only != ["--only", "sink"]:
            trackers_cost(tmp / "trackers", 2_000 if quick else 200_000, rounds)
        if only:
            return
        bare, supervised = [], []
        for i in range(rounds):  # alternate, so drift on a shared machine hits both alike
            bare.append(bare_samples_per_s())
            supervised.append(asyncio.run(supervised_samples_per_s(tmp / f"run{i}")))
            print(f"round {i + 1}: bare {bare[-1]:,.0f} samples/s, supervised {supervised[-1]:,.0f} samples/s")
        b, s = max(bare), max(supervised)
        print(f"training speed: bare {b:,.0f} samples/s, supervised {s:,.0f} samples/s, "
              f"ratio supervised/bare {s / b:.3f} (goal >= 0.97)")
        cap = asyncio.run(channel_capacity(tmp / "flood", count=2_000 if quick else 200_000))
        print(f"status channel: {cap['events_per_s']:,.0f} step events/s from 4 workers into one reader "
              f"(goal >= 100,000)")
        print(f"worker CPU per reported step: {cap['loop_us']:.2f} us in the training thread, "
              f"{cap['total_us']:.2f} us including the sender thread's pickling and writes (goal <= 10 us)")


if __name__ == "__main__":
    main()
