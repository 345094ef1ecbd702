"""What torchherd's headless commands print with `--json`: one JSON object for a result (`check`, `export`, a
request to a live run) and, for a run followed to its end, each event's events.jsonl line then one `end` object
(`EventLines`). Only the JSON goes to stdout; what a person reads besides goes to stderr.
"""
from __future__ import annotations

import io
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..engine import encode_line
from ..engine.protocol.messages import Event, RunFinished
from .headless import LinePrinter

if TYPE_CHECKING:
    from ..engine import CheckReport, Problem


def emit(obj: dict[str, Any], out: TextIO | None = None) -> None:
    """`obj` as one line of JSON on `out` (default stdout; a value JSON has no form for, a date in a config, as
    its text)."""
    out = out if out is not None else sys.stdout
    out.write(json.dumps(obj, default=str) + "\n")
    out.flush()


def refusal(error: str, code: int, stream: bool = False) -> dict[str, Any]:
    """The object of a command that could not do what it was asked (a bad run directory, a run not live):
    `ok` false and why; `stream`: a followed run's `end` object, which says its exit status too."""
    if stream:
        return {"type": "end", "ok": False, "exit": code, "message": error, "how": "not started", "error": error}
    return {"ok": False, "error": error}


_KEY_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def config_values(path: str | Path) -> dict[str, Any] | None:
    """The config file's tables as written, for the values problems are about; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def value_at(data: dict[str, Any] | None, key: str) -> Any:
    """The value a problem's key (`pipelines[2].lr`, `devices.placement[0]`) has in the file as written; None
    where the file does not hold it (a default, an inherited value, a file that does not parse). A sweep's
    pipelines are its trials, numbered after the file's tables are expanded: their values are not looked up."""
    if data is None or not key or (key.startswith("pipelines[") and "sweep" in data):
        return None
    found: Any = data
    for name, index in _KEY_PART.findall(key):
        if name and isinstance(found, dict) and name in found:
            found = found[name]
        elif index and isinstance(found, list) and int(index) < len(found):
            found = found[int(index)]
        else:
            return None
    return found


def problem_json(problem: Problem, values: dict[str, Any] | None) -> dict[str, Any]:
    """One problem: its file, its key ("" for the file as a whole), the value there where known, the message."""
    return {"file": problem.file, "key": problem.key, "value": value_at(values, problem.key),
            "message": problem.message}


def check_json(path: str, report: CheckReport) -> dict[str, Any]:
    """`torchherd check --json`: the verdict, every problem, and (ok) the plan's lines as check prints them."""
    values = config_values(path)
    config = report.config
    pipelines = [{"name": p.name, "kind": str(p.kind), "ranks": p.ranks} for p in config.pipelines] \
        if config is not None else []
    return {"config": path, "ok": report.ok, "problems": [problem_json(p, values) for p in report.problems],
            "pipelines": pipelines, "plan": list(report.lines)}


class Noted(io.StringIO):
    """stderr that also keeps what was written to it: why a run never started, for its `end` object."""

    def __init__(self, err: TextIO):
        super().__init__()
        self.err = err

    def write(self, text: str) -> int:
        super().write(text)
        return self.err.write(text)

    def flush(self) -> None:
        self.err.flush()

    @property
    def said(self) -> str:
        return self.getvalue().strip()


class EventLines(LinePrinter):
    """A followed run as JSON lines on `out`: each event as its line of events.jsonl (the same bytes), then one
    `end` object; what a person would read (lines, notices) goes to `err`."""

    def __init__(self, out: TextIO, err: TextIO, metric: str = "val_loss", start: float | None = None):
        super().__init__(err, metric, start)
        self.json_out = out
        self.quiet = False  # the human lines of an event already written as JSON: not said again on `err`
        self.said_end = False
        self.ranking: list[str] = []

    def handle(self, ev: Event) -> None:
        self._put(encode_line(ev))
        self.quiet = True  # still read, for what the end says (a sweep's ranking, tasks that did not build)
        try:
            super().handle(ev)
        finally:
            self.quiet = False
        if isinstance(ev, RunFinished):
            self.ranking = self.sweep_ranking(ev.statuses)

    def write(self, text: str) -> None:
        if not self.quiet:
            super().write(text)

    def end(self, text: str, code: int, **facts: Any) -> int:
        if not self.said_end:
            self.said_end = True
            obj = {"type": "end", "ok": code == 0, "exit": code, "message": text.strip(), **facts}
            if self.ranking:
                obj["ranking"] = self.ranking
            self._put(json.dumps(obj, default=str).encode() + b"\n")
        return code

    def close(self, code: int, why: str = "") -> int:
        if not self.said_end:
            self.end("", code, how="not started", error=why)
        return code

    def _put(self, line: bytes) -> None:
        if self.gone:
            return
        try:
            buffer = getattr(self.json_out, "buffer", None)
            if buffer is None:
                self.json_out.write(line.decode())
                self.json_out.flush()
            else:  # the bytes as they are, past the text layer's encoding
                self.json_out.flush()
                buffer.write(line)
                buffer.flush()
        except (OSError, ValueError):  # EIO, EPIPE, or a closed stream
            self.gone = True
