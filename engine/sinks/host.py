"""The process of one sink: `python -m torchherd.engine.sinks.host RUN_DIR SINK [--resuming]` reads the run's
events as events.jsonl lines on stdin, feeds them to the sink in batches, and answers on stdout with how many it has
taken and what went wrong (each kind once); whatever the sink prints goes to stderr, its log in the run directory."""
from __future__ import annotations

import json
import os
import queue
import sys
import threading
from pathlib import Path
from typing import IO

from ..protocol.messages import ConfigAdded, Event
from ..rundir.directory import load_resolved_configs
from ..rundir.history import decode_lines
from .api import Sink, SinkRun, sink_name

READ = 1 << 20  # bytes read from the feed at once
BATCH = 2000  # events handed to the sink at once, at most
NICE = 10  # added to the host's niceness
GRACE = 60.0  # seconds a sink may take to finish once its input has ended, before its process group is killed


class Answers:
    """What the host tells the feed, one JSON object a line: {"done": N} and {"notice": TEXT, "level": L}."""

    def __init__(self, out: IO[str], sink: str):
        self._out, self._sink = out, sink
        self._said: set[str] = set()
        self.lock = threading.Lock()

    def done(self, count: int) -> None:
        self._write({"done": count})

    def say(self, text: str, level: str = "warning", key: str = "") -> None:
        """Say `text` once (once per `key`, when given)."""
        if (key or text) in self._said:
            return
        self._said.add(key or text)
        print(f"torchherd: {text}", file=sys.stderr, flush=True)
        self._write({"notice": f"tracking ({self._sink}): {text}", "level": level})

    def _write(self, record: dict[str, object]) -> None:
        with self.lock:
            try:
                self._out.write(json.dumps(record) + "\n")
                self._out.flush()
            except (OSError, ValueError):  # the supervisor is gone: nothing to tell
                pass


def build(spec: str, run: SinkRun) -> Sink:
    """The sink `spec` names: "mlflow", "wandb", or 'file.py:Class' / 'package.module:Class' of the user's."""
    if spec == "mlflow":
        from .mlflow_sink import MlflowSink

        return MlflowSink(run)
    if spec == "wandb":
        from .wandb_sink import WandbSink

        return WandbSink(run)
    from ..runners.task.api import load_callable

    target, _, attr = spec.rpartition(":")
    if target.endswith(".py") and not Path(target).is_absolute():  # beside the config, as a task's file is
        target = str(Path(run.configs[0].source).resolve().parent / target)
    cls = load_callable(f"{target}:{attr}")
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise TypeError(f"{spec} is not a subclass of torchherd.engine.sinks.api.Sink")
    return cls(run)


def _read(stdin: int, chunks: queue.SimpleQueue[tuple[list[Event], int] | None]) -> None:
    """Decode what comes in, whole lines at a time (rundir/history.py's decoding: a run of step reports in one
    msgspec call), into the queue as (events, lines read): a line that holds no event of this version counts as
    taken. At the end of the input, None, and the watchdog starts."""
    rest = b""
    while chunk := os.read(stdin, READ):
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            chunks.put((decode_lines(data[:cut]), data.count(b"\n", 0, cut)))
    chunks.put(None)
    timer = threading.Timer(GRACE, _give_up)
    timer.daemon = True
    timer.start()


def _give_up() -> None:
    from ..launch.child import kill_own_group

    print(f"torchherd: the sink had not finished {GRACE:.0f} s after the run's events ended; ended it",
          file=sys.stderr, flush=True)
    kill_own_group()


def feed(sink: Sink, run: SinkRun, chunks: queue.SimpleQueue[tuple[list[Event], int] | None],
         answers: Answers) -> None:
    """Hand the sink its events in order, a batch at a time, until the input ends; then close it."""
    done, ended = 0, False
    while not ended:
        batch: list[Event] = []
        lines = 0
        item = chunks.get()
        while item is not None:
            batch += item[0]
            lines += item[1]
            if len(batch) >= BATCH:
                break
            try:
                item = chunks.get_nowait()
            except queue.Empty:
                break
        ended = item is None
        for event in batch:
            run.observe(event)
            if isinstance(event, ConfigAdded):  # its pipelines are in config.json now
                run.configs = load_resolved_configs(run.run_dir)
        if batch:
            try:
                sink.write(batch)
            except Exception as exc:  # noqa: BLE001 (a tracker's failure is said, never the run's)
                answers.say(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "),
                            key=f"write:{type(exc).__name__}")
        if lines:
            done += lines
            answers.done(done)
    try:
        sink.close()
    except Exception as exc:  # noqa: BLE001
        answers.say(f"closing: {type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:  # a tracker is background work: the cores go to training and supervision first
        os.nice(NICE)
    except OSError:
        pass
    run_dir, spec = Path(args[0]).resolve(), args[1]
    answers = Answers(os.fdopen(os.dup(1), "w", buffering=1), sink_name(spec))
    os.dup2(2, 1)  # what the sink or its library prints goes to its log, never into the answers
    chunks: queue.SimpleQueue[tuple[list[Event], int] | None] = queue.SimpleQueue()
    stdin = os.dup(0)
    with open(os.devnull, "rb") as null:
        os.dup2(null.fileno(), 0)
    configs = load_resolved_configs(run_dir)
    run = SinkRun(run_dir, run_dir.name, configs, "--resuming" in args, configs[0].tracking)
    threading.Thread(target=_read, args=(stdin, chunks), name="torchherd-sink-input", daemon=True).start()
    try:
        sink = build(spec, run)
    except Exception as exc:  # noqa: BLE001
        answers.say(f"could not start: {type(exc).__name__}: {exc}", level="error")
        return 1
    answers.done(0)  # ready: its imports and first connection are behind it
    feed(sink, run, chunks, answers)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not a wait for threads a tracker's library left running
