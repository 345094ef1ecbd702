"""What the TensorBoard files cost: the supervisor loop's time per event (against writing the same event to
events.jsonl, which it does anyway), the writer thread's (for every step report, and for the points of a run
reporting 1,000 steps a second that the thinning keeps), the one-time import, and a real run's training
throughput and wall time with them on and off.

The files are written in the supervisor, so a worker should train at the same speed either way; the last
figures check that on this machine. Usage: python benchmarks/tensorboard_cost.py [--events 20000]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torchherd.engine.config.load import parse_config  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, RunFinished, StepMetrics, ValResult  # noqa: E402
from torchherd.engine.rundir.directory import RunDirectory, read_events  # noqa: E402
from torchherd.engine.rundir.tensorboard import (STEP_EVERY, StepThinning, TensorBoardExport,  # noqa: E402
                                                 TensorBoardTap)
from torchherd.engine.supervise.supervisor import Supervisor  # noqa: E402


T0 = 1_700_000_000.0  # the worker's clock at the first report


def stream(n: int) -> list:
    """A run's events as they come, 1,000 step reports a second of the worker's clock, with an epoch end and a
    validation result every 100."""
    out = []
    for step in range(1, n + 1):
        out.append(StepMetrics(pipeline="p", epoch=step // 100, step=step, loss=1.0 / step, lr=0.01,
                               samples_per_s=5000.0, time=T0 + step / 1000))
        if step % 100 == 0:
            out.append(EpochEnd(pipeline="p", epoch=step // 100 - 1, step=step, train_loss=0.5, duration=1.0,
                                samples_per_s=5000.0, epochs_total=n // 100, steps_per_epoch=100))
            out.append(ValResult(pipeline="p", epoch=step // 100 - 1, step=step, metrics={"val_loss": 0.4}))
    return out


def per_event(n: int, config) -> tuple:
    """(import seconds, then microseconds per event: events.jsonl (the baseline), the loop's share of the
    TensorBoard files (thinning and queueing), the writer thread's for every event and for those the thinning
    keeps, then the points written, then tensorboardX's writer for comparison)."""
    events = stream(n)
    with tempfile.TemporaryDirectory() as tmp:
        rundir = RunDirectory(Path(tmp) / "run")
        t = time.perf_counter()
        for e in events:
            rundir.write(e)
        rundir.flush()
        base = (time.perf_counter() - t) / len(events) * 1e6
        rundir.close()
        t = time.perf_counter()
        import tensorboardX  # noqa: F401  (and torch with it, once per supervisor)
        imported = time.perf_counter() - t
        tap = TensorBoardTap(Path(tmp) / "tap", config)

        async def feed() -> float:  # on a running loop, as the supervisor's: a worker's batch per turn
            t = time.perf_counter()
            for i in range(0, len(events), 250):
                for e in events[i:i + 250]:
                    tap.on_event(e)
                await asyncio.sleep(0)
            return time.perf_counter() - t
        loop = asyncio.run(feed()) / len(events) * 1e6
        tap.on_event(RunFinished(ok=True, statuses={}))  # waits for the thread to drain
        tb = TensorBoardExport(Path(tmp) / "tb", config)
        t = time.process_time()
        for e in events:
            tb.on_event(e)
        tb.close()
        thread = (time.process_time() - t) / len(events) * 1e6
        tb, thinning, points = TensorBoardExport(Path(tmp) / "thin", config), StepThinning(), 0
        t = time.process_time()
        for e in events:  # as the tap hands them over: the thinning is the loop's, the rest the thread's
            for kept in ([e] if thinning.keep(e) else []) if type(e) is StepMetrics else [*thinning.release(e), e]:
                tb.on_event(kept)
                points += type(kept) is StepMetrics
        tb.close()
        thinned = (time.process_time() - t) / len(events) * 1e6
        before = {crc: tensorboardx_writer(Path(tmp) / f"x-{crc}", events, crc) for crc in ("native", "python")}
    return imported, base, loop, thread, thinned, points, before


def tensorboardx_writer(folder: Path, events: list, crc: str) -> float:
    """CPU microseconds per event of the same step scalars through tensorboardX's own EventsWriter (as torchherd
    wrote them before tfrecord.py), its checksums in C (`crc32c` installed) or in its pure-Python fallback."""
    import tensorboardX.record_writer as rw
    from tensorboardX.crc32c import _crc32c
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event as TfEvent
    from tensorboardX.proto.summary_pb2 import Summary

    saved = rw.crc32c
    rw.crc32c = saved if crc == "native" else _crc32c
    try:
        folder.mkdir()
        w = EventsWriter(str(folder / "events"))
        t = time.process_time()
        for e in events:
            if isinstance(e, StepMetrics):
                values = [("train/loss", e.loss), ("train/lr", e.lr), ("train/samples_per_s", e.samples_per_s)]
                summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values])
                w.write_event(TfEvent(wall_time=e.time, step=e.step, summary=summary))
        w.close()
        return (time.process_time() - t) / len(events) * 1e6
    finally:
        rw.crc32c = saved


async def throughput(tmp: Path, tensorboard: bool, samples: int = 20000, epochs: int = 3) -> tuple[float, float]:
    """(median samples/s of its step reports, wall seconds) of one real 2-pipeline run over `samples` a pipeline."""
    config = parse_config({
        "runs_dir": str(tmp / "runs"), "tensorboard": tensorboard,
        "defaults": {"task": "regression", "max_epochs": epochs, "batch_size": 64, "log_every_n_steps": 5,
                     "params": {"samples": samples, "hidden": 128}},
        "pipelines": [{"name": "a"}, {"name": "b"}],
        "devices": {"placement": "cpu", "cpu_slots": 2}, "validation": {"mode": "inline"},
        "telemetry": {"enabled": False}}, str(tmp / "bench.toml"), tmp)
    sup = Supervisor(config)
    t = time.perf_counter()
    await sup.start()
    try:
        await sup.wait()
    finally:
        await sup.shutdown(graceful=False)
    wall = time.perf_counter() - t
    steps = [e for e in read_events(sup.run_dir) if isinstance(e, StepMetrics)]
    rates = [e.samples_per_s for e in steps if e.step > 20] or [e.samples_per_s for e in steps]  # a --quick run's few
    return statistics.median(rates), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3, help="runs each way, alternating")
    ap.add_argument("--quick", action="store_true", help="every part once at the least size (CI: it still runs)")
    args = ap.parse_args()
    samples, epochs = 20000, 3
    if args.quick:  # and the runs' workers forked from one process that imported torch once
        args.events, args.rounds, samples, epochs = 500, 1, 640, 1
    from _quick import warm

    with warm(args.quick), tempfile.TemporaryDirectory() as tmp:
        config = parse_config({"defaults": {"task": "regression"}, "pipelines": [{"name": "p"}]},
                              str(Path(tmp) / "x.toml"), Path(tmp))
        imported, base, loop, thread, thinned, points, before = per_event(args.events, config)
        steps = sum(isinstance(e, StepMetrics) for e in stream(args.events))
        print(f"supervisor loop, per event: events.jsonl {base:.1f} us, TensorBoard thinning and queueing {loop:.1f} "
              f"us (ratio {loop / base:.2f}); writer thread, every step report a point: {thread:.1f} us CPU per "
              f"event (ratio {thread / base:.2f})")
        print(f"  thinned as a live run's (1,000 reports/s, one point per {1000 * STEP_EVERY:.0f} ms): {points:,} "
              f"of {steps:,} step reports written, {thinned:.2f} us CPU per event offered "
              f"(thinning and writing; {thread / thinned:.1f}x less than every report)")
        print(f"  before, through tensorboardX's EventsWriter: {before['python']:.1f} us CPU per event with its "
              f"pure-Python CRC ({before['python'] / thread:.1f}x the writer thread's now), {before['native']:.1f} "
              f"us with crc32c ({before['native'] / thread:.1f}x); importing tensorboardX (and torch), which the "
              f"files no longer need but a sweep's HParams do: {imported:.2f}s")
        on, off = [], []
        for i in range(args.rounds):
            for flag, into in ((False, off), (True, on)):
                into.append(asyncio.run(throughput(Path(tmp) / f"{flag}-{i}", flag, samples, epochs)))
        rate_on, rate_off = statistics.median(r for r, _ in on), statistics.median(r for r, _ in off)
        wall_on, wall_off = statistics.median(w for _, w in on), statistics.median(w for _, w in off)
        print(f"worker samples/s: off {rate_off:,.0f}, on {rate_on:,.0f} (ratio on/off {rate_on / rate_off:.3f})")
        print(f"run wall time: off {wall_off:.1f}s, on {wall_on:.1f}s (ratio on/off {wall_on / wall_off:.3f})")


if __name__ == "__main__":
    main()
