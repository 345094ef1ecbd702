"""Headless clients of a live run: `torchherd run --headless` (start the run as a service, then follow it)
and `torchherd attach --headless` (follow a run that is already going), printing one line per event.

`check_and_run` starts the run at once, and each worker's first build is the run's task check: no pipeline
steps until every task built, and one that does not build stops them all (exit 2, as a bad config does).

Ctrl-C asks the run to stop gracefully (twice: kill); SIGTERM too when this client started the run;
SIGHUP (the terminal went away) only ends this client, and the run goes on.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

from ..engine.protocol.control import Action
from ..engine.protocol.messages import Notice, RunFinished, RunStarted
from ..engine.protocol.names import NoticeTopic, PipelineKind
from .formats import shown_path
from .headless import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_STOPPED, LinePrinter, exit_status

if TYPE_CHECKING:
    from ..engine import EventStream, RemoteRun, RunConfig
    from ..engine.protocol.messages import Event

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def attach_command(run_dir: Path) -> str:
    return f"torchherd attach {run_dir}"


class Spawned(Protocol):
    """A service `spawn` started (the engine's serve.service.Started, past the seam)."""

    @property
    def run_dir(self) -> Path: ...
    @property
    def pid(self) -> int: ...


def start_service(config: Path, runs_dir: Path | None, err: TextIO = sys.stderr,
                  check_builds: bool = False) -> Spawned | int | None:
    """Spawn the run's service (blocking); None, with the reasons on `err`, when it did not start; EXIT_STOPPED
    when Ctrl-C cancelled the start (the service stopped what it had started and kept no run)."""
    from ..engine import ServiceFailed, StartCancelled, spawn

    try:
        return spawn(config=config, runs_dir=runs_dir, check_builds=check_builds)
    except ServiceFailed as exc:
        err.write(f"{exc}\n")
        err.flush()
        return None
    except StartCancelled as exc:
        err.write(f"\ntorchherd: {exc}\n")
        err.flush()
        return EXIT_STOPPED


def run_detached(config: Path, runs_dir: Path | None, printer: LinePrinter, err: TextIO = sys.stderr) -> int:
    """`torchherd run CONFIG --detach`: start the service and return at once, saying where to find it."""
    started = start_service(config, runs_dir, err)
    if started is None or isinstance(started, int):  # EXIT_STOPPED, the only int it returns
        return EXIT_CONFIG if started is None else EXIT_STOPPED
    return say_detached(started, "run started", printer)


def say_detached(started: Spawned, what: str, printer: LinePrinter) -> int:
    """A detached start's last words: the service's pid, where its run is, how to watch and stop it."""
    run_dir, watch, stop = started.run_dir, attach_command(started.run_dir), f"torchherd stop {started.run_dir}"
    return printer.end(f"torchherd: {what} in the background (supervisor pid {started.pid})\n"
                       f"  run directory: {run_dir}\n  watch it: {watch}\n  stop it: {stop}\n", EXIT_OK,
                       how="detached", run_dir=str(run_dir), pid=started.pid, attach=watch, stop=stop)


def run_service_headless(config: Path, runs_dir: Path | None, printer: LinePrinter, check_builds: bool = False,
                         err: TextIO | None = None) -> int:
    """`torchherd run CONFIG --headless`: start the service, follow it from the start. `check_builds`: its
    workers' first builds are the task check; a task that did not build is EXIT_CONFIG, its problems on `err`."""
    err = err if err is not None else sys.stderr
    started = start_service(config, runs_dir, err, check_builds)
    if started is None or isinstance(started, int):  # EXIT_STOPPED, the only int it returns
        return EXIT_CONFIG if started is None else EXIT_STOPPED
    try:
        status = asyncio.run(follow_run(started.run_dir, printer, from_start=True, owner=True))
    except KeyboardInterrupt:  # before the client's own Ctrl-C handling: the service stops the run as `stop` would
        os.kill(started.pid, signal.SIGTERM)
        err.write(f"\ntorchherd: interrupted as the run started: stopping it (torchherd ls shows how it ended)\n"
                  f"  run directory: {started.run_dir}\n")
        err.flush()
        return EXIT_STOPPED
    if printer.refused:
        count = len(printer.refused)
        err.write(f"{count} problem{'s' if count != 1 else ''}:\n" + "".join(f"{p}\n" for p in printer.refused))
        err.flush()
        return EXIT_CONFIG
    return status


class ClientSignals:
    """What a signal does to the run a client follows: SIGHUP (and SIGTERM to a client that did not start it,
    and any signal to a read-only one) ends only the client; Ctrl-C stops the run gracefully, twice kills it."""

    def __init__(self, run: RemoteRun, printer: LinePrinter, owner: bool, read_only: bool):
        self.run, self.printer, self.owner, self.read_only = run, printer, owner, read_only
        self.hung_up = asyncio.Event()  # the client ends; the run goes on
        self.interrupts = 0

    def __call__(self, sig: signal.Signals) -> None:
        printer = self.printer
        if sig == signal.SIGHUP or (sig == signal.SIGTERM and not self.owner) or self.read_only:
            printer.gone = sig == signal.SIGHUP  # the terminal may be gone: print nothing more
            self.hung_up.set()
            return
        self.interrupts += 1
        if self.interrupts == 1:
            self.run.stop(reason="interrupted" if sig == signal.SIGINT else sig.name)
            printer.write("\nstopping every pipeline gracefully" +
                          (" (Ctrl-C again to kill)\n" if sig == signal.SIGINT else f" ({sig.name})\n"))
        elif sig == signal.SIGINT:
            self.run.send(Action.KILL)  # every pipeline
            printer.write("\nkilling every pipeline\n")


async def follow_run(run_dir: Path, printer: LinePrinter, *, from_start: bool, owner: bool = False,
                     read_only: bool = False) -> int:
    """Print a live run's events until it finishes (its exit status), the terminal goes away or the run
    is cut short (EXIT_FAILED)."""
    from ..engine import NotLive, RemoteRun, run_held

    try:
        run = await RemoteRun.connect(run_dir, read_only=read_only, history=from_start)
    except NotLive as exc:
        if not run_held(run_dir) and (run_dir / "events.jsonl").is_file():
            return print_ended(run_dir, printer, from_start=from_start)
        return printer.end(f"torchherd: {exc}\n", EXIT_FAILED, how="not live", run_dir=str(run_dir), error=str(exc))
    if not owner:  # which run this is, and what the keys do to it, before its lines
        keys = ("read-only: Ctrl-C leaves it going" if read_only else
                "Ctrl-C stops every pipeline (twice: kills them); closing this terminal leaves it going")
        printer.write(f"torchherd: following run {run_dir.name} ({shown_path(run.run_dir)}): {keys}\n")
    loop = asyncio.get_running_loop()
    printer.run_dir = run.run_dir
    on_signal = ClientSignals(run, printer, owner, read_only)
    hung_up = on_signal.hung_up
    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    if from_start and not owner:  # its history arrives at once: timed by the run's own clock
        printer.by_event_time()
    finished = False
    try:
        stream = run.subscribe(replay=from_start)
        # A resumed run's history holds its earlier sessions, run_finished and all: the one that ends this
        # client comes live, and its owner prints from the current session's start.
        old = len(run.history) if from_start else 0
        skip = session_start(run.history) if owner else 0
        reading = asyncio.ensure_future(_print(stream, printer, old, skip))
        hangup = asyncio.ensure_future(hung_up.wait())
        await asyncio.wait({reading, hangup}, return_when=asyncio.FIRST_COMPLETED)
        hangup.cancel()
        finished = reading.done() and reading.result()
        reading.cancel()
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        await (run.close() if finished else run.detach())
    facts = {"run_dir": str(run.run_dir), "statuses": dict(run.statuses)}
    if finished:
        # A task that did not build: nothing trained, and no run directory is kept.
        if printer.refused:
            return printer.end("", EXIT_CONFIG if owner else exit_status(run.statuses), how="refused", **facts,
                               problems=printer.refused)
        return printer.end(f"run directory: {shown_path(run.run_dir)}\n", exit_status(run.statuses),
                           how="finished", **facts)
    if hung_up.is_set():  # the run goes on
        return printer.end("", EXIT_OK, how="left", **facts)
    why = await run.why_ended()
    return printer.end(f"torchherd: {why}\n", EXIT_FAILED, how="cut short", **facts, error=why)


def print_ended(run_dir: Path, printer: LinePrinter, *, from_start: bool) -> int:
    """A run nobody supervises any more: its history (with `from_start`), how it ended, and the status that
    following it to its end would have given; EXIT_FAILED when it was cut short."""
    from ..engine import Unreadable, read_history, summarize
    from .verbs import state_of

    if from_start:
        printer.by_event_time()
        unreadable = Unreadable()
        for event in read_history(run_dir, unreadable=unreadable):
            printer.handle(event)
        for line in unreadable.lines():
            printer.write(f"torchherd: {line}\n")
    summary = summarize(run_dir)
    state = state_of(summary) if summary is not None else "never started"
    text = f"torchherd: {run_dir} is not live: {state}" + ("" if from_start else " (--from-start prints its history)")
    code = EXIT_FAILED if summary is None or summary.status == "unfinished" else exit_status(summary.statuses)
    return printer.end(text + "\n", code, how="ended", run_dir=str(run_dir), state=state,
                       statuses=dict(summary.statuses) if summary is not None else {})


def session_start(history: list[Event]) -> int:
    """Where the current session begins in a run's history: its last run_started, and the resume plan the
    supervisor says just before it (a resumed run's earlier sessions, finished or cut short, come before)."""
    starts = [i for i, e in enumerate(history) if isinstance(e, RunStarted)]
    if not starts:
        return 0
    start = starts[-1]
    before = history[start - 1] if start else None
    if isinstance(before, Notice) and before.topic == NoticeTopic.RESUMING:
        return start - 1
    return start


async def _print(stream: EventStream, printer: LinePrinter, old: int = 0, skip: int = 0) -> bool:
    """Print (all but the first `skip` events) until a RunFinished after the first `old` (True), or until the
    stream ends without one (False)."""
    seen = 0
    async for event in stream:
        seen += 1
        if seen > skip:
            printer.handle(event)
        if isinstance(event, RunFinished) and seen > old:
            return True
    return False


def check_and_run(config: RunConfig, runs_dir: str | None = None, out: TextIO = sys.stdout,
                  err: TextIO = sys.stderr, start: float | None = None, detach: bool = False,
                  as_json: bool = False) -> int:
    """Run `config` and follow it (unless `detach`); returns the exit status.

    A task that does not build trains nothing: the problems go to `err` and the status is EXIT_CONFIG.
    Followed, the workers' first builds are the check (engine/supervise/build_check.py); detached,
    nobody stays to hear their verdict, so every task is first built once in a fresh process.
    Lines show seconds since `start` (time.monotonic(); default now), when the command began.
    `as_json`: JSON lines on `out` (tui/json_output.py), the lines a person reads on `err`.
    """
    if not as_json:
        return _check_and_run(config, runs_dir, LinePrinter(out, config.validation.metric, start), err, detach)
    from .json_output import EventLines, Noted

    noted = Noted(err)
    printer = EventLines(out, err, config.validation.metric, start)
    return printer.close(_check_and_run(config, runs_dir, printer, noted, detach), noted.said)


def _check_and_run(config: RunConfig, runs_dir: str | None, printer: LinePrinter, err: TextIO,
                   detach: bool) -> int:
    from ..engine import plan_jobs, probe_tasks

    tasks = len(plan_jobs(config))
    noun = f"{tasks} task{'s' if tasks != 1 else ''}"
    # Scripts only: nothing to build (their files were checked with the config). A script or a Lightning
    # module cannot be held before its first step: with one of them the probe builds every task first.
    held = tasks > 0 and not detach and all(p.kind == PipelineKind.TASK for p in config.pipelines)
    if held:
        printer.line(f"checking {noun}: each worker builds its own and holds before its first step until all built")
    elif tasks:
        printer.line(f"checking {noun}: building each once in a fresh process ...")
        try:
            problems = probe_tasks(config)
        except KeyboardInterrupt:  # the probe's process is gone already
            return printer.end("\ninterrupted while checking the tasks; nothing launched\n", EXIT_STOPPED,
                               how="not started")
        took = time.monotonic() - printer.start
        if problems:
            printer.line(f"checking failed after {took:.1f}s: nothing launched")
            count = len(problems)
            err.write(f"{count} problem{'s' if count != 1 else ''}:\n" + "".join(f"{p}\n" for p in problems))
            err.flush()
            return printer.end("", EXIT_CONFIG, how="refused", problems=[str(p) for p in problems])
        printer.line(f"{noun} built in {took:.1f}s")
    if detach:
        return run_detached(Path(config.source), Path(runs_dir) if runs_dir else None, printer, err)
    return run_service_headless(Path(config.source), Path(runs_dir) if runs_dir else None, printer,
                                check_builds=held, err=err)
