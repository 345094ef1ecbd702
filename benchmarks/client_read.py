"""What an attached client spends on each event it reads from events.jsonl, in this process, on its own.

1. Live: the real `RemoteRun` read path (`_read_appended`: pread, decode, each stretch queued as one burst)
   and one stream's reader taking every event, as the fan-out's clients do, CPU per step event with the file
   read in stretches of `READ_AT_ONCE` over the same with stretches of 4 MiB (what it read before), rounds
   alternating. The supervisor tells a client of a few thousand new lines at a time (`--told`).
2. Collector: the same live read with the young collected every `remote.YOUNG` allocations (what
   `RemoteRun.connect` sets in a process that follows a live run) over Python's default 700, rounds alternating.
3. Decode: `decode_lines` of READ_AT_ONCE bytes of step lines (msgspec's decode_lines, the lines as they are)
   over what it did before (the lines copied into one JSON array, decoded as a list), rounds alternating.
4. History: `read_history` (the collector paused while it decodes) over `decode_lines` of the same bytes
   with the collector running, CPU per event, rounds alternating.

Usage: python benchmarks/client_read.py [--events 200000] [--told 2500] [--history 800000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import timeit
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec  # noqa: E402

from torchherd.engine.protocol.control import Welcome  # noqa: E402
from torchherd.engine.protocol.messages import EpochEnd, StepMetrics  # noqa: E402
from torchherd.engine.rundir.history import _NEXT_STEP, _STEP, decode_lines, read_history  # noqa: E402
from torchherd.engine.rundir.lines import encode_line  # noqa: E402
from torchherd.engine.serve import remote  # noqa: E402

NEW_READ = remote.READ_AT_ONCE
OLD_READ = 4 << 20  # bytes a client read at once before


def write_events(path: Path, n: int) -> int:
    """`n` events as a run writes them: 4 pipelines' step reports, an epoch end every 1,000 steps."""
    lines = []
    for i in range(n):
        name = f"p{i % 4}"
        step = i // 4 + 1
        event = EpochEnd(pipeline=name, epoch=step // 1000, step=step, train_loss=0.5, duration=1.0,
                         samples_per_s=1e4, epochs_total=9, steps_per_epoch=1000) if i % 1000 == 999 else \
            StepMetrics(pipeline=name, epoch=step // 1000, step=step, loss=0.5, lr=0.1, samples_per_s=1e4)
        lines.append(encode_line(event))
    data = b"".join(lines)
    path.write_bytes(data)
    return len(data)


async def live_read(path: Path, size: int, told: int, read_at_once: int) -> float:
    """CPU seconds for a RemoteRun to read the whole file, told of it `told` lines' worth at a time, and one
    stream's reader to take every event."""
    remote.READ_AT_ONCE = read_at_once
    welcome = Welcome(run_id="bench", run_dir=str(path.parent), supervisor_pid=0, events_bytes=0, pipelines=(),
                      statuses={})
    run = remote.RemoteRun(None, None, welcome, None, True, os.open(path, os.O_RDONLY))
    stream = run.subscribe(replay=False)
    per_told = told * size // sum(1 for _ in open(path, "rb"))

    async def reader() -> int:
        n = 0
        async for event in stream:
            if isinstance(event, StepMetrics):
                n += 1
        return n
    taking = asyncio.ensure_future(reader())
    c = time.process_time()
    while run._readable < size:  # as the supervisor's `appended` frames come, every 20 ms at most
        run._readable = min(size, run._readable + per_told)
        await run._read_appended()
        await asyncio.sleep(0)
    run._end()
    n = await taking
    return (time.process_time() - c) / n


def collected_every(young: int, path: Path, size: int, told: int) -> float:
    """`live_read` with the young collected every `young` allocations."""
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    try:
        return asyncio.run(live_read(path, size, told, NEW_READ))
    finally:
        gc.set_threshold(*before)


_AS_LIST = msgspec.json.Decoder(list[StepMetrics])


def decode_before(data: bytes) -> list:
    """What `decode_lines` did with a stretch of step lines before: a copy of them as one JSON array."""
    assert data.startswith(_STEP) and data.count(_NEXT_STEP) == data.count(b"\n") - 1
    return _AS_LIST.decode(b"[" + data[:-1].replace(b"\n", b",") + b"]")


def decode_ratio(path: Path) -> float:
    """CPU to decode READ_AT_ONCE bytes of step lines now over before, 100 times each, alternating."""
    data = b"".join(line + b"\n" for line in path.read_bytes()[:NEW_READ].split(b"\n")[:-1] if line.startswith(_STEP))
    assert decode_lines(data) == decode_before(data)
    now = timeit.timeit(lambda: decode_lines(data), number=100)
    return now / timeit.timeit(lambda: decode_before(data), number=100)


def history_read(path: Path, paused: bool) -> float:
    c = time.process_time()
    n = len(read_history(path.parent) if paused else decode_lines(path.read_bytes()))
    return (time.process_time() - c) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--told", type=int, default=2_500, help="lines a client is told of at once (live)")
    ap.add_argument("--history", type=int, default=800_000, help="events in the history read whole")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    with tempfile.TemporaryDirectory(prefix="client-read-") as tmp:
        path = Path(tmp) / "events.jsonl"
        size = write_events(path, args.events)
        now, before = [], []
        for _ in range(args.rounds):
            now.append(asyncio.run(live_read(path, size, args.told, NEW_READ)))
            before.append(asyncio.run(live_read(path, size, args.told, OLD_READ)))
        ratios = [a / b for a, b in zip(now, before)]
        print(f"live: {args.events:,} events, told of {args.told:,} lines at a time: read in stretches of "
              f"{NEW_READ >> 10} KiB {1e6 * statistics.median(now):.2f} us CPU/event, of "
              f"{OLD_READ >> 20} MiB {1e6 * statistics.median(before):.2f}; ratio {statistics.median(ratios):.2f} "
              f"(median of {args.rounds} rounds' ratios)")
        spared, default = [], []
        for _ in range(args.rounds):
            spared.append(collected_every(remote.YOUNG, path, size, args.told))
            default.append(collected_every(700, path, size, args.told))
        ratios = [a / b for a, b in zip(spared, default)]
        print(f"collector: the same live read, the young collected every {remote.YOUNG:,} allocations "
              f"{1e6 * statistics.median(spared):.2f} us CPU/event, every 700 (Python's default) "
              f"{1e6 * statistics.median(default):.2f}; ratio {statistics.median(ratios):.2f} (median of "
              f"{args.rounds} rounds' ratios)")
        ratios = [decode_ratio(path) for _ in range(8 * args.rounds)]
        print(f"decode: {NEW_READ >> 10} KiB of step lines, msgspec's decode_lines over the lines copied into one JSON "
              f"list first: ratio {statistics.median(ratios):.2f} (median of {8 * args.rounds} rounds' ratios)")
        size = write_events(path, args.history)
        paused, running = [], []
        for _ in range(args.rounds):
            paused.append(history_read(path, True))
            running.append(history_read(path, False))
        ratios = [a / b for a, b in zip(paused, running)]
        print(f"history: {args.history:,} events read whole: collector paused {1e6 * statistics.median(paused):.2f} "
              f"us CPU/event, running {1e6 * statistics.median(running):.2f}; ratio {statistics.median(ratios):.2f} "
              f"(median of {args.rounds} rounds' ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
