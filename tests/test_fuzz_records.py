"""Fuzzing the fields of every record a run folder holds: each message type's record with any of its fields
given a value of another type, alone and among a real run's lines, read back by every reader of events.jsonl,
by `torchherd export` and by `torchherd attach --headless --from-start`. The property: each message read back
has fields of their declared types, a line that does not fit is skipped and counted, and nothing raises.

Bounded like tests/test_fuzz.py (FUZZ_EXAMPLES examples a property); scripts/fuzz.py runs them far longer.
"""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.test_fuzz import FUZZ, json_values
from torchherd.engine.protocol.messages import Event, Message
from torchherd.engine.protocol.records import RecordError, _hints, from_record, message_types, to_record
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.rundir.history import read_history
from torchherd.engine.rundir.lines import Unreadable
from torchherd.engine.rundir.tensorboard import export_run
from torchherd.tui.attach import print_ended
from torchherd.tui.headless import LinePrinter

OLD_RUN = Path(__file__).parent / "old_runs" / "sweep_cut_while_paused"  # a real run folder, 49 events
TYPES = message_types()
FIELDS = sorted((tag, name) for tag, cls in TYPES.items() for name in _hints(cls) if name != "type")


def _valid(cls: type[Message]) -> st.SearchStrategy[Message]:
    """Messages of `cls` with every field of its type (a field typed Any holds any JSON value)."""
    hints = _hints(cls)
    return st.builds(cls, **{name: json_values for name, hint in hints.items()
                             if "Any" in str(hint) and name != "type"})


@st.composite
def mistyped(draw) -> tuple[str, str, dict]:
    """A record of some message type whose field `name` holds any JSON value (most often of another type)."""
    tag, name = draw(st.sampled_from(FIELDS))
    record = to_record(draw(_valid(TYPES[tag])))
    record[name] = draw(json_values)
    return tag, name, record


def well_typed(msg: Message) -> None:
    """Every field of `msg` is of its declared type: msgspec, strict, takes its plain form back as `type(msg)`."""
    msgspec.convert(msgspec.to_builtins(msg), type(msg), strict=True)


def line_of(record: dict) -> bytes | None:
    try:
        return json.dumps(record).encode()
    except (TypeError, ValueError):  # bytes, say: no line of a file
        return None


@FUZZ
@given(mistyped())
def test_every_field_of_every_record_is_checked_when_read(case):
    # Regression: `"time": {"a": 1}` came back as the time of an event and crashed every reader that used it.
    tag, _, record = case
    try:
        msg = from_record(record)
    except RecordError as exc:
        assert tag in str(exc)
        return
    assert type(msg) is TYPES[tag]
    well_typed(msg)


@pytest.fixture(scope="module")
def scratch():
    path = Path(tempfile.mkdtemp(prefix="th-fuzzrec-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _planted(scratch: Path, cases: list[tuple[str, str, dict]], at: list[int]) -> tuple[Path, int, int]:
    """A copy of a real run folder with the records of `cases` among its lines; returns it, the events its file
    holds, and how many of those the readers must skip (their fields do not fit)."""
    run = scratch / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(OLD_RUN, run)
    lines = (run / "events.jsonl").read_bytes().splitlines()
    events, bad = len(lines), 0  # every line of the real run is an event
    for (tag, _, record), where in zip(cases, at):
        line = line_of(record)
        if line is None or not issubclass(TYPES[tag], Event):
            continue
        try:
            from_record(json.loads(line))
        except RecordError:
            bad += 1
        lines.insert(where % (len(lines) + 1), line)
        events += 1
    (run / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return run, events, bad


@FUZZ
@given(st.lists(mistyped(), min_size=1, max_size=4), st.lists(st.integers(0, 200), min_size=4, max_size=4))
def test_a_run_whose_lines_have_mistyped_fields_reads_its_other_lines_and_counts_the_rest(scratch, cases, at):
    run, events, bad = _planted(scratch, cases, at)
    for read in (lambda u: read_events(run, u), lambda u: read_history(run, unreadable=u)):
        unreadable = Unreadable()
        got = read(unreadable)
        for event in got:
            well_typed(event)
        skipped = sum(unreadable.counts.values())
        assert skipped == bad and len(got) == events - bad
        assert unreadable.lines() == ([f"skipped {bad} unreadable line{'s' if bad != 1 else ''} in "
                                       f"{run / 'events.jsonl'}"] if bad else [])


@FUZZ
@given(st.lists(mistyped(), min_size=1, max_size=4), st.lists(st.integers(0, 200), min_size=4, max_size=4))
def test_export_and_a_headless_history_of_mistyped_fields_carry_on(scratch, cases, at):
    # Regression: `"time": {"a": 1}` crashed `export` (sorting by time) and `attach --headless --from-start`
    # (the clock of its lines); a str where a record belonged crashed export ('str' has no attribute 'pipeline').
    run, _, bad = _planted(scratch, cases, at)
    logdir = scratch / "tb"
    shutil.rmtree(logdir, ignore_errors=True)
    unreadable = Unreadable()
    assert export_run(run, logdir, unreadable) >= 0
    assert sum(unreadable.counts.values()) == bad
    out = io.StringIO()
    print_ended(run, LinePrinter(out), from_start=True)
    assert ("unreadable line" in out.getvalue()) == bool(bad)


@pytest.mark.slow  # two real commands
def test_the_commands_say_once_how_many_lines_they_skipped(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    lines = (run / "events.jsonl").read_text().splitlines()
    step = json.loads(next(line for line in lines if '"type":"epoch_end"' in line))
    for at in (3, 9):
        lines.insert(at, json.dumps({**step, "time": {"a": 1}}))
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    said = f"torchherd: skipped 2 unreadable lines in {run / 'events.jsonl'}"
    for argv in (["attach", str(run), "--headless", "--from-start"],
                 ["export", str(run), "--tensorboard", str(tmp_path / "tb")]):
        proc = subprocess.run([sys.executable, "-m", "torchherd", *argv], capture_output=True, text=True,
                              timeout=120)
        both = proc.stdout + proc.stderr
        assert "Traceback" not in both and both.count(said) == 1, both
    assert proc.returncode == 0


def test_every_message_type_has_fields_to_fuzz():
    assert {tag for tag, _ in FIELDS} == set(TYPES)
    assert all(typing.get_type_hints(cls) for cls in TYPES.values())
