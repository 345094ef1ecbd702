"""Live runs from any shell: `torchherd ls` lists runs and their state, and `torchherd stop|kill|pause|
unpause|checkpoint|restart|stacks|promote RUN [NAME]` asks a live run's supervisor over its control socket.

Exit status: 0 the run took the request, 1 the run is not live or refused it, 2 bad input.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:
    from ..engine import EventStream, RunSummary
    from ..engine.protocol.control import Action
    from ..engine.protocol.health import Triage

from .formats import fmt_bytes

EXIT_TOOK, EXIT_REFUSED, EXIT_BAD = 0, 1, 2
# verb -> the Action's value: plain strings, so that the command line (and the app's first screen, which builds
# its parsers) knows the verbs without loading the control protocol.
ACTIONS = {"stop": "stop", "kill": "kill", "pause": "pause", "unpause": "unpause", "checkpoint": "checkpoint",
           "restart": "restart", "stacks": "stacks", "promote": "promote",
           "resume-pipeline": "unpause"}  # unpause's older name, kept for the scripts that have it
TRIAGE_WAIT = 10.0  # seconds `torchherd stacks` waits for the verdict on where the pipeline's ranks are
# stop and kill default to every pipeline
NEEDS_NAME = {"pause", "unpause", "resume-pipeline", "checkpoint", "restart", "stacks", "promote"}


class BadRun(ValueError):
    """RUN names no run directory."""


def resolve_run(run: str | None, runs_dir: Path, live_only: bool = False) -> Path:
    """RUN as a run directory: a path, a run id under `runs_dir` or of a live run of the user's anywhere, or
    (None) the newest live run of the user's, wherever it was started."""
    if run is None:
        live = [r for r in all_runs(runs_dir) if r.live]
        if not live:
            raise BadRun(f"no live run of yours (none under {runs_dir} nor started elsewhere; start one with "
                         "`torchherd run CONFIG --detach`; `torchherd ls` lists the finished ones)")
        return live[0].path
    from ..engine import live_runs

    for path in (Path(run), runs_dir / run, *(p for p in live_runs() if p.name == run)):
        if (path / "events.jsonl").exists():
            return path
    raise BadRun(f"{run}: no such run (neither a run directory, a run id under {runs_dir}, nor a live run's id)")


def all_runs(runs_dir: Path) -> list[RunSummary]:
    """The runs under `runs_dir` and the user's live runs started elsewhere (found through the runtime folder),
    newest first."""
    from ..engine import list_runs, live_runs, summarize

    runs = list_runs(runs_dir)
    here = {r.path.resolve() for r in runs}
    runs += [s for s in (summarize(p) for p in live_runs() if p.resolve() not in here) if s is not None]
    return sorted(runs, key=lambda s: s.started, reverse=True)


def state_of(summary: RunSummary) -> str:
    """live, finished (how), or cut short and resumable."""
    if summary.live:
        return "live"
    if summary.resumable:
        return "cut short, resumable" if summary.status == "unfinished" else f"{summary.status}, resumable"
    return summary.status


def list_command(runs_dir: Path, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """`torchherd ls`: every run under `runs_dir` and every live run of the user's wherever it was started,
    newest first, with its state; stale sockets cleaned. What cannot be read of the device ledger goes to `err`."""
    from ..engine import checkpoint_bytes, clean_stale, read_control

    runs = all_runs(runs_dir)
    pids: dict[Path, int | None] = {}
    for r in runs:
        if not r.live:
            clean_stale(r.path)  # a supervisor that died (SIGKILL, reboot) left its socket behind
        else:
            control = read_control(r.path)
            pids[r.path] = control.pid if control is not None else None
    leases, sessions = machine_ledger(err)
    sizes = {r.path: checkpoint_bytes(r.path) for r in runs}
    if as_json:
        json.dump([{"run_id": r.run_id, "path": str(r.path), "state": state_of(r), "live": r.live,
                    "pid": pids.get(r.path), "resumable": r.resumable, "status": r.status, "started": r.started,
                    "statuses": r.statuses, "checkpoint_bytes": sizes[r.path],
                    "code": [{"repo": c.repo, "commit": c.commit, "dirty": c.dirty,
                              "diff": str(r.path / c.diff) if c.diff else "",
                              "diff_cut": c.diff_cut} for c in r.code],
                    "devices": [{"device": x.device, "pipeline": x.pipeline, "rank": x.rank, "memory": x.memory}
                                for x in leases if x.run == r.run_id],
                    "waiting": {w.pipeline: w.why for s in sessions if s.run == r.run_id for w in s.waiting}}
                   for r in runs], out, indent=2)
        out.write("\n")
        return EXIT_TOOK
    if not runs:
        out.write(f"no runs under {runs_dir}, and no live run of yours elsewhere\n")
    width = max((len(r.run_id) for r in runs), default=0)
    # On a terminal a row fits its width; into a pipe (grep, a file) the names go whole, as ls(1) does.
    columns = shutil.get_terminal_size().columns if out.isatty() else 1 << 30
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started))
        state = f"live (pid {pids[r.path]})" if pids.get(r.path) else state_of(r)
        head = f"{r.run_id:<{width}}  {started}  {state:<24} {fmt_bytes(sizes[r.path]):>10}  "
        out.write(head + fit_names(r.pipelines, columns - len(head)) + "\n")
    for line in ledger_lines(leases, sessions):
        out.write(line + "\n")
    return EXIT_TOOK


def fit_names(names: list[str] | tuple[str, ...], room: int) -> str:
    """`names` joined by ", " within `room` cells: as many as fit (the first always), then "… (+N more)"."""
    text = ", ".join(names)
    if len(text) <= room:
        return text
    shown = [names[0]]
    for i, name in enumerate(names[1:], 1):
        if len(", ".join([*shown, name])) + len(f", … (+{len(names) - i - 1} more)") > room:
            break
        shown.append(name)
    return ", ".join(shown) + f", … (+{len(names) - len(shown)} more)"


class HeldDevice(Protocol):
    """What `ls` reads of a lease in the device ledger (the engine's hardware.ledger.Lease, past the seam)."""

    @property
    def device(self) -> str: ...
    @property
    def run(self) -> str: ...
    @property
    def pipeline(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def memory(self) -> int | None: ...


class WaitingPipeline(Protocol):
    """What `ls` reads of a pipeline a live session says waits (hardware.ledger.Waiter)."""

    @property
    def pipeline(self) -> str: ...
    @property
    def why(self) -> str: ...


class LedgerSession(Protocol):
    """What `ls` reads of a live session in the device ledger (hardware.ledger.Presence): its run, and its
    pipelines that wait."""

    @property
    def run(self) -> str: ...
    @property
    def waiting(self) -> Sequence[WaitingPipeline]: ...


def machine_ledger(err: TextIO = sys.stderr) -> tuple[Sequence[HeldDevice], Sequence[LedgerSession]]:
    """Every lease and live session of this user's device ledger on this machine; a line on `err` for each
    file of it skipped, and (nothing listed) for a ledger that cannot be read or is refused."""
    from ..engine import Ledger

    try:
        ledger = Ledger()
        found = ledger.leases(), ledger.presences()
    except (OSError, RuntimeError) as exc:
        err.write(f"torchherd: the device ledger is not read: {exc}\n")
        return [], []
    for text in ledger.notices():
        err.write(f"torchherd: {text}\n")
    return found


def ledger_lines(leases: Sequence[HeldDevice], sessions: Sequence[LedgerSession]) -> list[str]:
    """"devices held on this machine" and "waiting" sections for `ls`: which run holds which device, and
    what of each live run waits for what; nothing when nothing is held or waits."""
    lines = []
    if leases:
        lines.append("devices held on this machine:")
        for lease in leases:
            share = f" ({lease.memory / 2**30:.1f} GiB)" if lease.memory is not None else ""
            rank = f" rank {lease.rank}" if lease.rank else ""
            lines.append(f"  {lease.device}{share}  run {lease.run}  {lease.pipeline}{rank}")
    waits = [(s.run, w.pipeline, w.why) for s in sessions for w in s.waiting if w.why]
    # The rest of each run's queue: behind its head when something outside the run holds that up, else waiting
    # for slots its own pipelines hold.
    queued = [(s.run, [w.pipeline for w in s.waiting if not w.why], any(w.why for w in s.waiting))
              for s in sessions]
    queued = [(run, names, behind) for run, names, behind in queued if names]
    if waits or queued:
        lines.append("waiting:")
        lines += [f"  run {run}  {name}: {why}" for run, name, why in waits]
        for run, names, behind in queued:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            why = "queued behind it" if behind else "queued for a slot the run's own pipelines hold"
            lines.append(f"  run {run}  {shown}: {why}")
    return lines


def act_command(verb: str, run: str, name: str | None, runs_dir: Path, out: TextIO = sys.stdout,
                err: TextIO = sys.stderr, as_json: bool = False) -> int:
    """`torchherd VERB RUN [NAME]`: ask the live run; say what it answered (`as_json`: one JSON object)."""
    if verb in NEEDS_NAME and not name:
        return _say(Answer(EXIT_BAD, error=f"torchherd {verb}: name the pipeline (torchherd {verb} RUN NAME)",
                           prefix=False), verb, out, err, as_json)
    try:
        run_dir = resolve_run(run, runs_dir)
    except BadRun as exc:
        return _say(Answer(EXIT_BAD, error=str(exc)), verb, out, err, as_json)
    from ..engine.protocol.control import Action

    return asyncio.run(_ask(run_dir, Action(ACTIONS[verb]), name or "", out, err, as_json))


@dataclass(frozen=True)
class Answer:
    """What a live run answered a request (`reply`, and for stacks the triage), or why it was not asked."""

    code: int
    run_dir: Path | None = None
    pipeline: str = ""
    reply: str = ""
    error: str = ""
    prefix: bool = True  # the error is said after 'torchherd: '
    hint: str = ""  # a line on what to do instead
    triage: Triage | None = None


def _say(answer: Answer, verb: str, out: TextIO, err: TextIO, as_json: bool) -> int:
    """`answer` for a person (the reply on `out`, a refusal on `err`) or as one JSON object on `out`."""
    if as_json:
        run_dir = answer.run_dir
        said: dict[str, object] = {"ok": not answer.error, "action": verb, "pipeline": answer.pipeline or None,
                                   "run": run_dir.name if run_dir else None,
                                   "run_dir": str(run_dir) if run_dir else None}
        if answer.error:
            said["error"] = answer.error
        else:
            said["reply"] = answer.reply
            triage = answer.triage
            said["triage"] = None if triage is None else {"verdict": triage.verdict, "ranks": list(triage.ranks),
                                                          "folder": triage.folder}
        out.write(json.dumps(said) + "\n")
        if answer.error:  # for a person too, as without --json (stdout holds the JSON only)
            err.write(f"torchherd: {answer.error}\n" if answer.prefix else f"{answer.error}\n")
        if answer.hint:
            err.write(f"torchherd: {answer.hint}\n")
    elif answer.error:
        err.write(f"torchherd: {answer.error}\n" if answer.prefix else f"{answer.error}\n")
        if answer.hint:
            err.write(f"  {answer.hint}\n")
    else:
        out.write(f"{answer.run_dir.name if answer.run_dir else ''}: {answer.reply}\n")
        if answer.triage is not None:
            out.write(f"triage: {answer.triage.verdict}\nstacks in {answer.triage.folder}\n")
    return answer.code


async def _ask(run_dir: Path, action: Action, name: str, out: TextIO, err: TextIO, as_json: bool = False) -> int:
    return _say(await _answer(run_dir, action, name), str(action), out, err, as_json)


async def _answer(run_dir: Path, action: Action, name: str) -> Answer:
    from ..engine import NotLive, RemoteRun

    live = action == "stacks"  # where its ranks are comes back as a triage event, once their stacks are in
    try:
        run = await RemoteRun.connect(run_dir, live=live, history=False)
    except NotLive as exc:
        # the run ended (a kill of its last pipeline): resume starts it
        hint = f"to start {name} again: torchherd resume {run_dir} --only {name}" \
            if action == "restart" and name else ""
        return Answer(EXIT_REFUSED, run_dir, name, error=str(exc), hint=hint)
    try:
        if name and name not in run.welcome.pipelines:
            return Answer(EXIT_BAD, run_dir, name, error=f"{run_dir}: no pipeline named {name!r} (it has "
                          f"{', '.join(run.welcome.pipelines)})")
        stream = run.subscribe(replay=False) if live else None
        reply = await run.request(action, name)
        triage = await _triage_of(stream, name) if stream is not None and reply.ok else None
    finally:
        await run.close()
    if not reply.ok:
        return Answer(EXIT_REFUSED, run_dir, name, error=f"{run_dir}: refused: {reply.text}")
    return Answer(EXIT_TOOK, run_dir, name, reply=reply.text, triage=triage)


async def _triage_of(stream: EventStream, name: str, timeout: float = TRIAGE_WAIT) -> Triage | None:
    """The triage of `name`'s stacks from the run's live events; None if none came within `timeout` seconds."""
    from ..engine.protocol.health import Triage

    async def scan() -> Triage | None:
        async for event in stream:
            if isinstance(event, Triage) and event.pipeline == name:
                return event
        return None

    try:
        return await asyncio.wait_for(scan(), timeout)
    except TimeoutError:
        return None
