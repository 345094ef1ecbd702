"""The run directory: where a run writes its config, events and metrics, and how to read one back.

Layout: `<runs_dir>/<run-id>/` with `config.toml` (as written), `config.json`
(as resolved), `events.jsonl` (every event) and, per pipeline, `metrics.jsonl`
(step, epoch_end, val_result: the same lines as in events.jsonl), `log.txt` and `checkpoints/`.
Lines are buffered and written out on the supervisor's tick and at once for any event but a step report; a
final state is fsync'd. A write the disk refuses never raises: the lines wait in memory (rundir/appending.py),
`failing` says why, and every flush tries again.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import msgspec

from ..protocol.messages import (
    EpochEnd,
    Event,
    Message,
    PipelineEvent,
    PipelineFinished,
    PipelineQueued,
    RunFinished,
    RunStarted,
    SourceCommit,
    StepMetrics,
    ValResult,
)
from ..protocol.nolinks import LinkRefused, find_link, make_dirs, open_fd, open_file, write_text
from ..protocol.old_records import upgraded
from ..protocol.records import RecordError, from_record, message_types
from ..protocol.states import SUCCESS_STATES, WorkerState, ended_label
from .appending import AppendFile
from .lines import Unreadable, encode_line
from .snapshots import (  # noqa: F401
    PID_FILE,
    SNAPSHOT_MARKER,
    _ours,
    claim_root,
    owner_alive,
    remove_root,
    remove_stale_roots,  # here too: where callers have always found them
    snapshot_root,
)

if TYPE_CHECKING:  # pydantic's config: only a run's writer and a resume need it, not every reader of a run
    from ..config.schema import RunConfig

METRIC_TYPES = (StepMetrics, EpochEnd, ValResult)
FINAL_TYPES = (PipelineFinished, RunFinished)  # fsync'd as they are written: what a crash must not take


def _json_default(value: object) -> object:
    if hasattr(value, "__fspath__"):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)


def dumps(record: dict[str, Any]) -> str:
    """One JSON line; NaN and infinities become null so every reader can parse it."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    return json.dumps(clean, default=_json_default, separators=(",", ":"))


def new_run_id(runs_dir: Path, name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{name}"
    run_id, n = base, 1
    while (runs_dir / run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id


class RunTaken(RuntimeError):
    """The run directory is held by another live torchherd process."""


def _hold(pid_file: Path) -> int:
    """Lock `pid_file` (flock, exclusive) for as long as this process writes the run, and write our pid in
    it. The kernel drops the lock when the process dies however it dies, so a held lock means a live owner."""
    fd = open_fd(pid_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunTaken(f"{pid_file.parent}: another torchherd process is running this run") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def run_held(run_dir: Path) -> bool:
    """Whether a live torchherd process holds `run_dir` (its supervisor.pid is locked)."""
    try:
        fd = os.open(Path(run_dir) / PID_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class RunDirectory:
    """Writes one run's files. Not thread-safe: used from the supervisor's event loop."""

    def __init__(self, path: Path, fresh: bool = False):
        """`fresh`: a new run, whose folder this makes and never adopts (RunTaken if it exists: in a shared
        runs folder such as /tmp someone else may have made it first, to read or plant what the run writes)."""
        self.path = path
        self.resuming = False  # a resumed run: config.json already holds its configs
        if fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path)  # mode 0777 less the umask, as for any folder of the user's
            except FileExistsError:
                raise RunTaken(f"{path}: already exists, and a new run only writes into a folder it has just "
                               "made itself; start the run again for a fresh run id") from None
        else:
            path.mkdir(parents=True, exist_ok=True)
            link = find_link(path)  # a copied or downloaded run: torchherd makes no link in a run folder
            if link is not None:
                raise LinkRefused(link)
        self._owner = _hold(path / PID_FILE)
        self._events = AppendFile(path / "events.jsonl")
        self._metrics: dict[str, AppendFile] = {}

    def pipeline_dir(self, pipeline: str) -> Path:
        return self.path / pipeline

    def log_path(self, pipeline: str, rank: int = 0) -> Path:
        """The pipeline's log; every other rank of a gang has one of its own beside it."""
        return self.path / pipeline / ("log.txt" if rank == 0 else f"log-rank{rank}.txt")

    def save_config(self, config: RunConfig) -> None:
        if self.resuming:
            return
        source = Path(config.source) if config.source else None
        target = self.path / "config.toml"
        if source is not None and source.is_file():
            if target.exists():  # a config added to a running session
                target = self.path / f"config-{config.name}.toml"
            with open(source, "rb") as src, open_file(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        resolved = self.path / "config.json"
        existing = json.loads(resolved.read_text()) if resolved.exists() else []
        existing.append(config.model_dump(mode="json"))
        write_text(resolved, json.dumps(existing, indent=2))

    def write(self, event: Message, line: bytes | None = None) -> None:
        """Append `event` (`line`: its encode_line bytes, when the caller has them) to events.jsonl, and a
        metric to its pipeline's metrics.jsonl. Step reports wait in the buffer for the next flush; anything
        else (a state change, a final state) is written out before this returns, so before it is published."""
        if line is None:
            line = encode_line(event)
        self._events.write(line)
        step = type(event) is StepMetrics  # the bulk of a run's events: no isinstance for it
        if step or isinstance(event, METRIC_TYPES):
            pipeline = cast(PipelineEvent, event).pipeline  # every metric type is one
            (self._metrics.get(pipeline) or self._metrics_file(pipeline)).write(line)
        if not step:
            self.flush()
            if isinstance(event, FINAL_TYPES):
                self._events.sync()

    def write_steps(self, steps: list[StepMetrics], lines: list[bytes]) -> None:
        """`write` of each of a run of step reports (`lines`: their encode_line bytes), a write per file."""
        pipeline = steps[0].pipeline
        if any(s.pipeline != pipeline for s in steps):  # a worker's are its own pipeline's: not seen in practice
            for step, line in zip(steps, lines):
                self.write(step, line)
            return
        data = b"".join(lines)
        self._events.write(data)
        (self._metrics.get(pipeline) or self._metrics_file(pipeline)).write(data)

    def _metrics_file(self, pipeline: str) -> AppendFile | _Unwritable:
        """The pipeline's metrics.jsonl, opened for appending on its first metric."""
        try:
            make_dirs(self.path / pipeline, self.path)
            fh = self._metrics[pipeline] = AppendFile(self.path / pipeline / "metrics.jsonl")
        except OSError as exc:  # a full disk: no room for the folder; events.jsonl has the same lines
            return _Unwritable(exc)
        return fh

    def flush(self) -> bool:
        """Write out what every file holds; False when the disk took only part of it (see `failing`)."""
        ok = self._events.flush()
        for fh in self._metrics.values():
            ok = fh.flush() and ok
        return ok

    @property
    def failing(self) -> OSError | None:
        """Why the run's files could not all be written at the last flush (None: all of it is on disk)."""
        return next((f.error for f in (self._events, *self._metrics.values()) if f.error is not None), None)

    @property
    def pending(self) -> int:
        """Bytes of lines the disk has not taken yet."""
        return self._events.pending + sum(f.pending for f in self._metrics.values())

    def written(self) -> int:
        """Bytes of events.jsonl on disk in whole lines, after writing out what it holds (what live clients may
        read of it; the metrics files wait for the next flush)."""
        self._events.flush()
        return self._events.whole

    def close(self) -> None:
        """Write out what the disk takes, close every file and let go of the run. Never raises."""
        try:
            (self.path / PID_FILE).unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self._owner)  # the lock goes with it
        self._events.close()
        for fh in self._metrics.values():
            fh.close()
        self._metrics.clear()


class _Unwritable:
    """A metrics file that could not even be opened: its lines are dropped (events.jsonl holds them too)."""

    def __init__(self, error: OSError):
        self.error = error

    def write(self, data: bytes) -> None:
        pass


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class RunSummary:
    """What a past run was, read from its directory."""

    run_id: str
    path: Path
    started: float  # seconds since the epoch
    status: str  # "completed", "failed", "stopped", "unfinished", ...
    pipelines: tuple[str, ...]
    statuses: dict[str, str]
    live: bool = False  # a torchherd process is still running it
    reasons: dict[str, str] = field(default_factory=dict)  # why each pipeline ended
    rungs: dict[str, float] = field(default_factory=dict)  # where each trial waiting at a rung waits
    never_ran: frozenset[str] = frozenset()  # the pipelines that ended before any attempt of them ran
    code: tuple[SourceCommit, ...] = ()  # the commits of its code at its newest session's start (rundir/provenance.py)

    @property
    def labels(self) -> dict[str, str]:
        """Each ended pipeline's state as people read it ('early stop', 'never ran', 'completed', ...)."""
        order = [*self.pipelines, *(n for n in self.statuses if n not in self.pipelines)]  # the config's order
        return {n: ended_label(self.statuses[n], self.rungs.get(n), n in self.never_ran)
                for n in order if n in self.statuses}

    @property
    def to_resume(self) -> tuple[str, ...]:
        """The pipelines that did not end well (stopped, killed, failed, never started or cut short): completed,
        early-stopped and pruned ones are done."""
        return tuple(p for p in self.pipelines if self.statuses.get(p) not in SUCCESS_STATES)

    @property
    def resumable(self) -> bool:
        """Some pipeline did not complete, and nobody runs it: `torchherd resume` carries it on."""
        return bool(self.to_resume) and not self.live


def checkpoint_bytes(run_dir: Path) -> int:
    """Bytes the checkpoints of the run at `run_dir` take: every file under each pipeline's checkpoints/ folder
    (a sharded checkpoint's folders included; links not followed)."""
    total = 0
    for folder in run_dir.glob("*/checkpoints"):
        for root, _, files in os.walk(folder):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:  # gone since it was listed (a rename by a live run)
                    pass
    return total


def read_records(path: Path, unreadable: Unreadable | None = None) -> list[dict[str, Any]]:
    """Every JSON object of a .jsonl file; a line that is not one (torn by a crash mid-write, not UTF-8, not
    an object) is skipped, and counted in `unreadable`: a run folder's files are data anyone may have written."""
    out: list[dict[str, Any]] = []
    try:
        data = path.read_bytes()
    except OSError:
        return out
    bad = 0
    for line in data.split(b"\n"):
        record = _record(line)
        if record is not None:
            out.append(record)
        elif line.strip():
            bad += 1
    if unreadable is not None:
        unreadable.add(path, bad)
    return out


def _record(line: bytes) -> dict[str, Any] | None:
    """The JSON object one line holds, or None."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        return None
    return record if isinstance(record, dict) else None


def read_events(run_dir: Path, unreadable: Unreadable | None = None) -> list[Event]:
    """The events of a run, in order, each field of its declared type; types this version does not know are
    skipped, and a line that is no record or whose fields do not fit is skipped and counted in `unreadable`."""
    path = Path(run_dir) / "events.jsonl"
    events, bad = [], 0
    for record in read_records(path, unreadable):
        try:
            event = from_record(record)
        except RecordError:
            kind = record.get("type")
            bad += isinstance(kind, str) and kind in _KNOWN
            continue
        if isinstance(event, Event):  # a command's record in the file is no event of the run
            events.append(event)
    if unreadable is not None:
        unreadable.add(path, bad)
    return events


_KNOWN = frozenset(message_types())


def _records_but_steps(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of events.jsonl but its step reports, the bulk of it, which are never parsed; a
    line that is not one is skipped."""
    out: list[dict[str, Any]] = []
    try:
        fh = open(path, "rb")
    except OSError:
        return out
    with fh:
        for line in fh:
            if line.startswith(b'{"type":"step",'):
                continue
            record = _record(line)
            if record is not None:
                out.append(record)
    return out


def _texts(value: object) -> dict[str, str]:
    """A record's {name: status} as written, keeping only text: the file may hold anything."""
    return {k: v for k, v in value.items() if isinstance(v, str)} if isinstance(value, dict) else {}


def summarize(run_dir: Path) -> RunSummary | None:
    """What a run was, from its events.jsonl (None: not a run). Fields of the wrong type are left out."""
    records = _records_but_steps(run_dir / "events.jsonl")  # `ls` and the picker read every run
    started = next((r for r in records if r.get("type") == RunStarted.type), None)
    if started is None:
        return None
    statuses: dict[str, str] = {}
    reasons: dict[str, str] = {}
    rungs: dict[str, float] = {}
    never_ran: set[str] = set()
    pipelines = tuple(p for p in started.get("pipelines") or () if isinstance(p, str)) \
        if isinstance(started.get("pipelines"), list) else ()
    for r in records:
        name = r.get("pipeline")
        if not isinstance(name, str):
            continue
        if r.get("type") == PipelineFinished.type and isinstance(r.get("status"), str):
            r = upgraded(r)
            statuses[name], reasons[name] = r["status"], str(r.get("reason", ""))
            rungs.pop(name, None)
            if _number(rung := r.get("rung")):
                rungs[name] = float(rung)
            (never_ran.add if r.get("never_ran") is True else never_ran.discard)(name)
        elif r.get("type") == PipelineQueued.type:  # restarted, promoted or resumed: not ended any more
            statuses.pop(name, None)
            reasons.pop(name, None)
            rungs.pop(name, None)
            pipelines += (name,) if name not in pipelines else ()
    finished = [r for r in records if r.get("type") == RunFinished.type]
    if finished:
        values = set(_texts(finished[-1].get("statuses")).values())
        # the worst any pipeline ended in names the run
        worst = (WorkerState.FAILED, WorkerState.KILLED, WorkerState.STOPPED)
        status = next((s for s in worst if s in values), WorkerState.COMPLETED).value
        if status == WorkerState.COMPLETED and any(WorkerState(v).resting for v in values if v in _STATES):
            status = WorkerState.STOPPED.value  # the session ended while a trial waited: the sweep did not finish
    else:
        status = "unfinished"
    when = started.get("time")
    newest = next(r for r in reversed(records) if r.get("type") == RunStarted.type)  # a resume records its own
    return RunSummary(run_id=run_dir.name, path=run_dir, started=float(when) if _number(when) else 0.0,
                      status=status, pipelines=pipelines, statuses=statuses, live=run_held(run_dir), reasons=reasons,
                      rungs=rungs, never_ran=frozenset(never_ran), code=_commits(newest.get("code")))


def _commits(listed: object) -> tuple[SourceCommit, ...]:
    """The commits a run_started record lists; one not of their form is left out."""
    out = []
    for item in listed if isinstance(listed, list) else ():
        try:
            out.append(msgspec.convert(item, SourceCommit, strict=False))
        except msgspec.ValidationError:
            continue
    return tuple(out)


_STATES = {s.value for s in WorkerState}


def _number(value: object) -> TypeGuard[float]:
    """A finite number (an int too big for a float is none)."""
    try:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def load_resolved_configs(run_dir: Path) -> list[RunConfig]:
    """The configs a run was started with (and added later), as resolved then."""
    from ..config.schema import RunConfig

    path = Path(run_dir) / "config.json"
    data = json.loads(path.read_bytes())
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data) or not data:
        raise ValueError(f"{path}: not the list of configs torchherd writes")
    return [RunConfig.model_validate(c, strict=False) for c in data]


def list_runs(runs_dir: Path) -> list[RunSummary]:
    """Past runs under `runs_dir`, newest first."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    out = []
    for child in runs_dir.iterdir():
        if child.is_dir() and (child / "events.jsonl").exists():
            summary = summarize(child)
            if summary is not None:
                out.append(summary)
    out.sort(key=lambda s: s.started, reverse=True)
    return out
