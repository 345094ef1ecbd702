"""A session's watch on what goes wrong, as a bus tap: stragglers from the ranks' pace, a triage of every
stall (and of each stack request), and alerts, with the command `[alerts] command` names run for each.

A policy: it reads the session through a `SessionView`, and what it says or asks (an alert, a stack dump) goes to
its `Outbox` as decisions.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from ...protocol.health import Alert, RankPace, Triage
from ...protocol.messages import Event, Notice, Stalled, StepMetrics, WorkerStarted
from ...protocol.names import NoticeTopic
from ...protocol.nolinks import LinkRefused, make_dirs, open_file, write_text
from ...protocol.records import to_record
from ...protocol.states import WorkerState
from ...protocol.telemetry import TelemetrySnapshot
from ..decisions import DumpStacks, Outbox, Record, SessionView
from . import summary
from .alert_rules import AlertRules
from .stragglers import StragglerWatch, crowded
from .triage import read_places, verdict

DISK_EVERY = 30.0  # seconds between looks at the runs folder's free space
SETTLE = 0.5  # seconds a rank's log must stay the same size for its stack dump to be whole
TRIAGE_WAIT = 4.0  # seconds at most to wait for the dumps
LOOKBACK = 64 << 10  # bytes before the request read too: a dump may land before its request is seen
COMMAND_TIMEOUT = 10.0  # seconds an alert's command may run
WEBHOOK_TRIES = (0.0, 1.0, 3.0)  # seconds to wait before each try of an alert's POST (5 s each at most)
SUMMARY_WAIT = 20.0  # seconds the session's end waits for the summary's command and POST


class HealthWatch:
    """Taps a supervisor's bus for its stragglers, triages and alerts, and sums a run up as it ends."""

    def __init__(self, session: SessionView, out: Outbox):
        self._session, self._out = session, out
        self.run_dir = Path(session.run_dir)
        self.config = session.config.alerts
        self.rules = AlertRules(self.config)
        self.stragglers = StragglerWatch(self.config.straggler)
        self.gangs: dict[str, tuple[int, int]] = {}  # pipeline -> (attempt, ranks) of its newest start
        self.cpu_gangs: set[str] = set()  # pipelines whose newest start trains on CPU cores, no GPU
        self.crowded = False  # every core of the host was busy at the newest telemetry
        self.asked: dict[str, list[int]] = {}  # pipeline -> its logs' sizes when this watch asked for stacks
        self._disk_at = 0.0  # monotonic time of the last disk look
        self._webhook_failed = False  # said once that the webhook does not take alerts
        self._loop = asyncio.get_running_loop()
        self._began = time.monotonic()  # the session's start: a summary's duration
        self._status = "running"  # the run's status, as {status} fills in: how it ended, once it has
        self._delivering: list[threading.Thread] = []  # the summary's command and POST, waited for at shutdown

    def on_event(self, event: Event, line: bytes = b"", kept: bool = True) -> None:
        if isinstance(event, StepMetrics):
            self._raise(self.rules.take(event))
            return
        if isinstance(event, TelemetrySnapshot):  # a paused pipeline's GPU is idle on purpose
            self.crowded = crowded(event, os.cpu_count() or 1)
            paused = frozenset(v.name for v in self._session.views() if v.state == WorkerState.PAUSED)
            self._raise(self.rules.idle(event, paused))
            return
        if isinstance(event, WorkerStarted):
            self.gangs[event.pipeline] = (event.attempt, max(len(event.pids), 1))
            (self.cpu_gangs.add if "gpu" not in event.device else self.cpu_gangs.discard)(event.pipeline)
        elif isinstance(event, RankPace):
            attempt, world = self.gangs.get(event.pipeline, (0, 2))
            # A CPU gang's rank slowed while every core was busy shares its core with a neighbour (the
            # validator, another run): that load, which telemetry shows, is not the rank's fault.
            excused = self.crowded and event.pipeline in self.cpu_gangs
            found = self.stragglers.take(event, attempt, world, crowded=excused)
            if found is not None:
                self._out.send(Record(found))
        elif isinstance(event, Stalled) and event.quiet > 0:
            self.asked[event.pipeline] = self._sizes(event.pipeline)
            self._out.send(DumpStacks(event.pipeline))  # its notice starts the triage
        elif isinstance(event, Notice) and event.topic == NoticeTopic.STACKS_ASKED and event.pipeline:
            sizes = self.asked.pop(event.pipeline, None) or self._sizes(event.pipeline)
            self._loop.create_task(self._triage(event.pipeline, sizes))
        elif isinstance(event, Alert):
            for target, wanted in ((self._command, self.config.command), (self._post, self.config.webhook)):
                if wanted:
                    thread = threading.Thread(target=target, args=(event,), daemon=True)
                    thread.start()
                    if event.rule == summary.RULE:
                        self._delivering.append(thread)
            return
        self._raise(self.rules.take(event))
        self._look_at_disk()

    def on_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        self._raise(self.rules.take_steps(steps))

    def finished(self, statuses: dict[str, str]) -> Alert | None:
        """The run's summary for `[alerts] on_finish` (None when it is off), for the supervisor to publish just
        before its run_finished: the watch runs the command and POSTs it as it does any alert."""
        self._status = summary.run_status(statuses)
        if not self.config.on_finish:
            return None
        return summary.finished_alert(self._session.views(), statuses, self.run_dir,
                                      self._session.config.validation.metric, time.monotonic() - self._began,
                                      self.config.bell)

    def settle(self, timeout: float = SUMMARY_WAIT) -> None:
        """Wait (blocking, at most `timeout` seconds) until the summary's command and POST are done: the session
        is ending, and its process with it."""
        deadline = time.monotonic() + timeout
        for thread in self._delivering:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _raise(self, alerts: list[Alert]) -> None:
        if alerts:
            self._out.send(*(Record(alert) for alert in alerts))

    def _look_at_disk(self) -> None:
        now = time.monotonic()
        if now - self._disk_at < DISK_EVERY:
            return
        self._disk_at = now
        try:
            usage = shutil.disk_usage(self.run_dir)
        except OSError:
            return
        self._raise(self.rules.disk(usage.free, usage.total, str(self.run_dir.parent), time.time()))

    # ------------------------------------------------------------ triage

    def _logs(self, pipeline: str) -> list[Path]:
        world = self.gangs.get(pipeline, (0, 1))[1]
        folder = self.run_dir / pipeline
        return [folder / ("log.txt" if rank == 0 else f"log-rank{rank}.txt") for rank in range(world)]

    def _sizes(self, pipeline: str) -> list[int]:
        return [p.stat().st_size if p.exists() else 0 for p in self._logs(pipeline)]

    async def _triage(self, pipeline: str, sizes: list[int]) -> None:
        """Wait (bounded) until every rank's dump has landed, then gather them and say the verdict."""
        logs, seen, steady = self._logs(pipeline), None, 0.0
        deadline = time.monotonic() + TRIAGE_WAIT
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            now = self._sizes(pipeline)
            grown = all(n > s for n, s in zip(now, sizes))
            steady = steady + 0.1 if now == seen and grown else 0.0
            seen = now
            if steady >= SETTLE:
                break
        dumps = await asyncio.to_thread(_read_from, logs, [max(0, s - LOOKBACK) for s in sizes])
        places = read_places(dumps)
        folder = self.run_dir / pipeline / "stacks" / time.strftime("%Y%m%d-%H%M%S")
        folder = next(f for n in range(1000) if not (f := folder.with_name(f"{folder.name}-{n}" if n else
                                                                           folder.name)).exists())
        refused = await asyncio.to_thread(_gather, self.run_dir, folder, dumps, verdict(places))
        if refused is not None:
            self._out.send(Record(Notice(level="warning", pipeline=pipeline, text=f"stacks not written: {refused}")))
        self._out.send(Record(Triage(pipeline=pipeline, verdict=verdict(places), folder=str(folder),
                                     ranks=tuple(p.text if p is not None else "" for p in places))))

    # ------------------------------------------------------------ the alert's command

    def _command(self, alert: Alert) -> None:
        """Run `[alerts] command` for `alert` (a thread): argv, no shell, its output into alerts.log."""
        fields = {"title": alert.title, "message": alert.message, "rule": alert.rule, "pipeline": alert.pipeline,
                  "run": self.run_dir.name, "run_dir": str(self.run_dir), "status": self._status}
        argv = [part.format(**fields) for part in self.config.command]
        try:
            with open_file(self.run_dir / "alerts.log", "ab") as out:
                out.write(f"--- {time.strftime('%H:%M:%S')} {alert.rule} {alert.pipeline}: {argv}\n".encode())
                out.flush()
                subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                               timeout=COMMAND_TIMEOUT, start_new_session=True, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            said = f"the alert command {argv[0]!r} failed: {type(exc).__name__}: {exc}"
            if alert.rule == summary.RULE:  # nothing is said after run_finished: alerts.log keeps it
                with contextlib.suppress(OSError), open_file(self.run_dir / "alerts.log", "ab") as out:
                    out.write(f"{said}\n".encode())
                return
            self._out.send_threadsafe(Record(Notice(level="warning", pipeline=alert.pipeline,
                                                    text=f"{said} (see alerts.log)")))


    def _post(self, alert: Alert) -> None:
        """POST `alert` as JSON to `[alerts] webhook` (a thread): a few tries, then one notice for the run."""
        import urllib.request

        body = json.dumps({**to_record(alert), "run": self.run_dir.name}).encode()
        error: Exception | None = None
        for wait in WEBHOOK_TRIES:
            time.sleep(wait)
            request = urllib.request.Request(self.config.webhook, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=5.0):
                    return
            except Exception as exc:  # refused, timed out, an HTTP error: the run goes on either way
                error = exc
        if not self._webhook_failed and alert.rule != summary.RULE:  # nothing is said after run_finished
            self._webhook_failed = True
            self._out.send_threadsafe(Record(Notice(level="warning", text=(
                f"the alert webhook did not take an alert ({type(error).__name__}: {error}); alerts go on in the "
                "event log (said once)"))))


def _read_from(logs: list[Path], starts: list[int]) -> list[str]:
    out = []
    for path, start in zip(logs, starts):
        try:
            with open(path, "rb") as f:
                f.seek(start)
                out.append(f.read().decode("utf-8", "replace"))
        except OSError:
            out.append("")
    return out


def _gather(run_dir: Path, folder: Path, dumps: list[str], line: str) -> LinkRefused | None:
    """Each rank's stacks and the verdict into the pipeline's stacks/ folder (inside `run_dir`), through no
    link: the refusal, if a part of it is one."""
    try:
        make_dirs(folder, run_dir)
        for rank, text in enumerate(dumps):  # from its first stack on: what it printed before is in its log
            first = text.find("(most recent call first)")
            write_text(folder / f"rank{rank}.txt", text[text.rfind("\n", 0, first) + 1:] if first >= 0 else text)
        write_text(folder / "verdict.txt", line + "\n")
    except LinkRefused as exc:
        return exc
    except OSError:
        pass
    return None
