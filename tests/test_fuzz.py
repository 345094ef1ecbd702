"""Fuzzing torchherd's edges with hypothesis: arbitrary bytes and structured garbage into the control socket's
frame decoder and request handling, the worker channel's decoder, the script client's frame reader, the config
loader, the run-folder readers and the device ledger's files. The property everywhere: a clear error or a
refusal, and the supervisor and its run unharmed; never another exception.

Bounded for the suite (FUZZ_EXAMPLES examples a property, no deadline: a loaded machine is slow, not wrong);
scripts/fuzz.py runs the same properties far longer.
"""
from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import os
import shutil
import string
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchherd import client_frames as script_wire
from torchherd.engine.config.load import load_config, parse_config
from torchherd.engine.config.problems import ConfigError
from torchherd.engine.launch.channel_handle import StatusFrameReader as ChannelFrames
from torchherd.engine.protocol.channel import ChannelError, decode_batch, decode_command
from torchherd.engine.protocol.control import Action, Request
from torchherd.engine.protocol.messages import Event, Message
from torchherd.engine.protocol.records import message_types
from torchherd.engine.rundir.directory import list_runs, load_resolved_configs, read_events, summarize
from torchherd.engine.rundir.history import decode_lines, read_history
from torchherd.engine.serve.runtime import read_control
from torchherd.engine.serve.wire import FrameError, FrameReader, decode

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))  # per property; scripts/fuzz.py raises it
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

TAGS = sorted(message_types())
# JSON-like values, nested: what a hostile or broken peer can put in any field.
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@st.composite
def records(draw, fields=values):
    """A record of a known (or unknown) message type with fields that may or may not be its own."""
    tag = draw(st.sampled_from(TAGS) | st.text(max_size=10))
    known = list(getattr(message_types().get(tag), "__dataclass_fields__", {}))
    names = st.sampled_from(known) | st.text(max_size=8) if known else st.text(max_size=8)
    return {"type": tag, **draw(st.dictionaries(names, fields, max_size=6))}


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


# ------------------------------------------------------------------ the control socket's frames


@FUZZ
@given(st.binary(max_size=2048), st.lists(st.integers(0, 4096), max_size=6))
def test_control_frames_of_any_bytes_are_messages_or_a_frame_error(data, cuts):
    frames = FrameReader(max_frame=64 << 10)
    try:
        for piece in pieces(data, cuts):
            assert all(isinstance(m, Message) for m in frames.feed(piece))
    except FrameError:
        pass


@FUZZ
@given(st.one_of(records().map(lambda r: (r.pop("type"), r)), st.tuples(st.text(max_size=10), values), values))
def test_control_frame_bodies_of_structured_garbage_decode_or_are_refused(envelope):
    try:
        body = msgspec.msgpack.encode(envelope)
    except (TypeError, OverflowError):
        return
    try:
        assert isinstance(decode(body), Message)
    except FrameError:
        pass


# ------------------------------------------------------------------ the worker channel


@FUZZ
@given(st.binary(max_size=2048), st.lists(st.integers(0, 4096), max_size=6))
def test_worker_channel_bytes_are_batches_or_a_channel_error(data, cuts):
    frames = ChannelFrames()
    try:
        for piece in pieces(data, cuts):
            for payload in frames.feed(piece):
                try:
                    assert all(isinstance(e, Event) for e in decode_batch(payload))
                except ChannelError:
                    pass
    except ChannelError:  # a length no worker sends
        pass


@FUZZ
@given(st.lists(records() | st.binary(max_size=64) | values, max_size=5))
def test_worker_batches_of_structured_garbage_are_events_of_their_types_or_refused(items):
    try:
        payload = msgspec.msgpack.encode(items)
    except (TypeError, OverflowError):
        return
    for decoder, kind in ((decode_batch, Event), (lambda p: [decode_command(p)], Message)):
        try:
            out = decoder(payload)
        except ChannelError:
            continue
        for msg in out:
            assert isinstance(msg, kind)
            msgspec.msgpack.encode(msg)  # fields are of their declared types: it encodes back


# ------------------------------------------------------------------ the script client's frames


@FUZZ
@given(st.binary(max_size=4096), st.lists(st.integers(0, 8192), max_size=8), st.integers(16, 512))
def test_script_client_lines_are_bounded_and_frames_well_typed(data, cuts, bound):
    reader = script_wire.LineReader(max_line=bound)
    for piece in pieces(data, cuts):
        for line in reader.feed(piece):
            assert len(line) <= bound and b"\n" not in line
            for kinds in (script_wire.TO_RUNNER, script_wire.TO_SCRIPT):
                frame = script_wire.decode(line, kinds)
                assert frame is None or isinstance(frame, script_wire.Frame)
        assert len(reader._buf) <= bound


@FUZZ
@given(st.dictionaries(st.sampled_from(["t", "step", "epoch", "loss", "n", "metrics", "path", "seq", "slot",
                                        "stall_ms", "nbytes", "wait", "pid", "samples", "seconds", "reason"]),
                       json_values, max_size=8), st.sampled_from(sorted(script_wire.TO_RUNNER)))
def test_script_frames_of_any_fields_decode_well_typed_or_not_at_all(fields, tag):
    line = json.dumps({"t": tag, **{k: v for k, v in fields.items() if k != "t"}}).encode()
    frame = script_wire.decode(line, script_wire.TO_RUNNER)
    if frame is not None:
        for f in dataclasses.fields(frame):
            assert script_wire._fits(getattr(frame, f.name), str(f.type)), (f.name, getattr(frame, f.name))


# ------------------------------------------------------------------ configs


@pytest.fixture(scope="module")
def scratch():
    path = Path(tempfile.mkdtemp(prefix="th-fuzz-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@FUZZ
@given(st.binary(max_size=512) | st.text(string.printable, max_size=512).map(str.encode))
def test_a_config_file_of_any_bytes_loads_or_names_what_is_wrong(scratch, data):
    path = scratch / "fuzz.toml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(exc)


KEYS = ["name", "runs_dir", "task", "script", "max_epochs", "ranks", "params", "args", "metrics", "precision",
        "placement", "cpu_slots", "mode", "backend", "trust_checkpoints", "pipelines", "defaults", "devices",
        "validation", "sweep", "cluster", "restart", "telemetry"]


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS), json_values | st.lists(st.dictionaries(st.sampled_from(KEYS),
                                                                                       json_values, max_size=4),
                                                                      max_size=3), max_size=8))
def test_a_config_of_any_shape_is_a_run_config_or_a_config_error(scratch, data):
    try:
        parse_config(data, str(scratch / "fuzz.toml"), scratch)
    except ConfigError as exc:
        assert str(exc)


# ------------------------------------------------------------------ run folders


@FUZZ
@given(st.lists(st.binary(max_size=200) | records(json_values).map(lambda r: json.dumps(r).encode()),
                max_size=8),
       st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_a_run_folder_of_any_contents_reads_as_a_run_or_as_none(scratch, lines, other):
    runs = scratch / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    run = runs / "20260101-000000-fuzz"
    run.mkdir(parents=True)
    data = b"\n".join(lines)
    (run / "events.jsonl").write_bytes(data)
    for name in ("control.json", "config.json"):
        (run / name).write_bytes(other)
    assert all(isinstance(e, Event) for e in read_events(run))
    assert all(isinstance(e, Event) for e in read_history(run))
    assert all(isinstance(e, Event) for e in decode_lines(data + b"\n"))
    summary = summarize(run)
    if summary is not None:
        assert summary.labels is not None and isinstance(summary.to_resume, tuple)
    list_runs(runs)
    read_control(run)
    try:
        load_resolved_configs(run)
    except (ValueError, ConfigError) as exc:  # json's and pydantic's errors are ValueErrors that say what
        assert str(exc)


# ------------------------------------------------------------------ the device ledger

devices = st.sampled_from(["cpu0", "cpu1"])
names = st.text(max_size=8)
waiters = st.lists(st.tuples(names, st.integers(-3, 3), st.floats(allow_nan=False), names,
                             st.lists(devices | json_values, max_size=2)).map(list) | st.lists(json_values, max_size=6),
                   max_size=3)
# A lease's or a session's fields, each of its own type or of any other (an entry of the right shape, often)
leases = st.fixed_dictionaries(
    {"device": devices | json_values, "run": names | json_values, "pipeline": names | json_values},
    optional={"rank": st.integers(0, 3) | json_values, "memory": st.none() | st.integers(0, 1 << 40) | json_values,
              "pid": st.integers(0, 1 << 22) | json_values, "run_dir": names | json_values})
sessions = st.fixed_dictionaries({"run": names | json_values, "pid": st.integers(0, 1 << 22) | json_values},
                                 optional={"run_dir": names | json_values, "waiting": waiters | json_values})
ledger_files = (st.tuples(st.just(".lease"), leases.map(lambda d: json.dumps(d).encode()))
                | st.tuples(st.just(".session"), sessions.map(lambda d: json.dumps(d).encode()))
                | st.tuples(st.sampled_from([".lease", ".session"]), st.binary(max_size=64)))


@FUZZ
@given(st.lists(ledger_files, min_size=1, max_size=4))
def test_ledger_files_of_any_contents_are_entries_of_their_types_or_skipped_once(scratch, files):
    from torchherd.engine.hardware.grants import Request, grant
    from torchherd.engine.hardware.ledger import Lease, Ledger, Presence
    from torchherd.engine.hardware.slots import Slot
    from torchherd.engine.supervise.scheduler import Scheduler
    from torchherd.tui.verbs import ledger_lines

    folder = scratch / "ledger"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    fds = []
    try:
        for i, (suffix, data) in enumerate(files):
            fds.append(os.open(folder / f"f{i}{suffix}", os.O_RDWR | os.O_CREAT, 0o600))
            os.write(fds[-1], data)
            fcntl.flock(fds[-1], fcntl.LOCK_EX)  # held, as a live session holds its files
        ledger = Ledger(folder)
        leases, presences = ledger.leases(), ledger.presences()
        assert all(type(x) is Lease for x in leases) and all(type(x) is Presence for x in presences)
        for entry in [*leases, *presences]:  # every field of its declared type: it encodes and decodes back
            assert msgspec.json.decode(msgspec.json.encode(entry), type=type(entry)) == entry
        assert len(ledger.notices()) == len(files) - len(leases) - len(presences)  # each other file said
        pool = [Slot(f"cpu{i}", "cpu", None, 1) for i in range(2)]
        ledger_lines(leases, presences)
        grant(Request(), pool, leases, "mine")
        scheduler = Scheduler(pool, ledger, "mine")
        try:
            scheduler.enqueue("a", 0, 0)
            scheduler.allocate()
        finally:
            scheduler.close()
        assert ledger.notices() == []  # and said once, however often it is read
    finally:
        for fd in fds:
            os.close(fd)


# ------------------------------------------------------------------ requests to a live supervisor


@pytest.mark.slow  # a real supervisor (over a scripted launcher), one example after another
def test_requests_of_any_fields_are_answered_and_leave_the_run_unharmed(tmp_path):
    from tests.conftest import make_config
    from tests.scripted import ScriptedLauncher
    from torchherd.engine.serve.server import ControlServer
    from torchherd.engine.supervise.supervisor import Supervisor

    class Conn:  # what the server asks of a connection: a writable client, not following the run
        pid, read_only, said_hello, sent = 1, False, True, []

        class transport:
            abort = staticmethod(lambda: None)
            is_closing = staticmethod(lambda: False)
            get_write_buffer_size = staticmethod(lambda: 0)

        def write(self, data: bytes) -> None:
            self.sent.append(data)

        def backlog(self) -> int:
            return 0

    async def main() -> None:
        config = make_config(tmp_path, [{"name": "a"}, {"name": "b"}], telemetry={"enabled": False})
        sup = Supervisor(config, launcher=ScriptedLauncher(obey_stop=True))
        await sup.start()
        server = ControlServer(sup, Path(tempfile.mkdtemp(prefix="th-fz-")) / "s.sock")
        conn = Conn()

        @FUZZ
        @given(st.sampled_from([a.value for a in Action if a != Action.ADD_CONFIG]) | st.text(max_size=12),
               st.sampled_from(["", "a", "b", "c"]) | st.text(max_size=300), st.text(max_size=40))
        def ask(action, pipeline, reason):
            ok, text = server._carry_out(conn, Request(id=1, action=action, pipeline=pipeline, reason=reason))
            assert isinstance(ok, bool) and isinstance(text, str)
            server._answer(conn, Request(id=1, action=action, pipeline=pipeline), ok, text)

        try:
            ask()
            assert not sup._tick_task.done()  # supervision goes on
        finally:
            await sup.shutdown(graceful=False)

    asyncio.run(main())
