"""Events encoded once as events.jsonl lines (what the run directory writes and the control socket sends),
the run directory's buffered writes, and the history in short an attaching app starts from."""
from __future__ import annotations

import errno
import gc
import json
import math
import os
from pathlib import Path

import pytest
from torchherd.engine.protocol import messages as m
from torchherd.engine.protocol.progress import PipelineProgress, apply
from torchherd.engine.protocol.records import to_record
from torchherd.engine.rundir import history
from torchherd.engine.rundir.appending import AppendFile
from torchherd.engine.rundir.directory import RunDirectory, dumps, read_events, read_records
from torchherd.engine.rundir.history import decode_history, decode_lines, decode_stretch
from torchherd.engine.rundir.lines import encode_line, encode_lines, trim_torn_line
from torchherd.engine.serve.summary import HistorySummary


def _sample_events() -> list[m.Event]:
    return [
        m.RunStarted(run_id="r", run_dir="/tmp/r", config_path="c.toml", pipelines=("a", "b")),
        m.StepMetrics(pipeline="a", epoch=0, step=1, loss=0.5, lr=0.1, samples_per_s=10.0, metrics={"acc": 0.25}),
        m.StepMetrics(pipeline="a", epoch=0, step=2, loss=math.nan, lr=0.1, samples_per_s=10.0),
        m.EpochEnd(pipeline="a", epoch=0, step=2, train_loss=0.4, duration=1.0, samples_per_s=10.0,
                   epochs_total=1, steps_per_epoch=2),
        m.ValResult(pipeline="a", epoch=0, step=2, metrics={"val_loss": 0.3}),
        m.PipelineFinished(pipeline="a", status="completed", reason="épochs done"),
        m.RunFinished(ok=True, statuses={"a": "completed"}),
    ]


def test_a_line_is_the_record_the_old_encoder_wrote_and_reads_back_as_the_event():
    events = _sample_events()
    for event in events:
        line = encode_line(event)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert json.loads(line) == json.loads(dumps(to_record(event)))
        assert next(iter(json.loads(line))) == "type"  # the tag first, as readers expect
    back = decode_lines(b"".join(encode_line(e) for e in events))
    assert [type(e) for e in back] == [type(e) for e in events]
    assert back[1] == events[1] and math.isnan(back[2].loss) and back[5].reason == "épochs done"


def test_runs_of_step_lines_decode_as_their_events_whatever_lies_between_them():
    steps = [m.StepMetrics(pipeline="ab"[i % 2], epoch=0, step=i, loss=1.0 / (i + 1), lr=0.1, samples_per_s=1.0,
                           metrics={"acc": 0.5} if i == 4 else {}) for i in range(8)]
    nan = m.StepMetrics(pipeline="a", epoch=0, step=9, loss=math.nan, lr=0.1, samples_per_s=1.0)  # written null
    # A string that holds a step line's start (its quotes and newline escaped in JSON, so never at a line's start)
    notice = m.Notice(pipeline="a", text='see\n{"type":"step", here')
    end = m.EpochEnd(pipeline="a", epoch=0, step=8, train_loss=0.2, duration=1.0, samples_per_s=1.0,
                     epochs_total=2, steps_per_epoch=8)
    frames = [steps, steps[:1], [*steps[:3], nan, *steps[3:]], [notice, *steps], [*steps[:2], end, notice, *steps[2:]],
              [end, *steps, notice], [notice]]
    for events in frames:
        back, steps_only = decode_stretch(b"".join(encode_line(e) for e in events))
        assert steps_only == (events in (steps, steps[:1]))  # a stretch a client need not look into
        assert [encode_line(e) for e in back] == [encode_line(e) for e in events]  # NaN as NaN: its line is null
        assert [type(e) for e in back] == [type(e) for e in events]
    assert math.isnan(decode_lines(encode_line(nan))[0].loss)
    data = b"".join(encode_line(e) for e in steps)
    assert decode_lines(data[:-9]) == steps[:-1]  # a torn last line is left out, the run before it kept
    # A line of a type this version does not know, with every field a step report has: skipped, not a step.
    other = b'{"type":"from_a_newer_torchherd","pipeline":"a","epoch":0,"step":3,"loss":0.5,"lr":0.1,' \
            b'"samples_per_s":1.0}\n'
    assert decode_stretch(encode_line(steps[0]) + other + encode_line(steps[1])) == (steps[:2], False)


def test_a_history_decodes_as_its_lines_do_and_leaves_the_collector_as_it_found_it(monkeypatch):
    events = _sample_events()
    data = b"".join(encode_line(e) for e in events)
    seen = []
    real = history._decode

    def decode(lines: bytes):
        seen.append(gc.isenabled())  # held off while the history decodes
        return real(lines)
    monkeypatch.setattr("torchherd.engine.rundir.history._decode", decode)
    assert gc.isenabled()
    assert [encode_line(e) for e in decode_history(data)] == [encode_line(e) for e in events]
    assert gc.isenabled() and seen == [False]
    gc.disable()
    try:  # a process that keeps its collector off keeps it off
        decode_history(data)
        assert not gc.isenabled()
    finally:
        gc.enable()
    monkeypatch.setattr("torchherd.engine.rundir.history._decode", lambda lines: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        decode_history(data)
    assert gc.isenabled()  # on again after a decode that raised


def test_a_non_finite_value_anywhere_is_written_as_null():
    step = m.StepMetrics(pipeline="a", epoch=0, step=1, loss=math.inf, lr=0.1, samples_per_s=1.0,
                         metrics={"grad": -math.inf})
    # The old encoder left a nested one as Infinity, which strict JSON readers (jq, JavaScript) refuse.
    record = json.loads(encode_line(step))
    assert record["loss"] is None and record["metrics"] == {"grad": None}


def test_a_run_of_step_reports_encoded_at_once_is_each_ones_line():
    steps = [m.StepMetrics(pipeline="a", epoch=0, step=i, loss=math.nan if i == 2 else 1.0 / i, lr=0.1,
                           samples_per_s=1.0, metrics={"odd\nname": i} if i == 3 else {}) for i in range(1, 6)]
    assert encode_lines(steps) == [encode_line(s) for s in steps]  # a newline in a string is escaped, not split on


def test_a_run_of_step_reports_written_at_once_lands_as_written_one_by_one(tmp_path):
    steps = [m.StepMetrics(pipeline=name, epoch=0, step=i, loss=0.5, lr=0.1, samples_per_s=1.0)
             for i, name in enumerate(["a", "a", "b", "a"])]
    for name, runs in (("at-once", [steps[:2], steps[2:]]), ("mixed", [steps])):  # one pipeline's; several
        out = RunDirectory(tmp_path / name)
        for run in runs:
            out.write_steps(run, encode_lines(run))
        out.close()
        assert (tmp_path / name / "events.jsonl").read_bytes() == b"".join(map(encode_line, steps))
        for pipeline in ("a", "b"):
            assert [r["step"] for r in read_records(tmp_path / name / pipeline / "metrics.jsonl")] == \
                [s.step for s in steps if s.pipeline == pipeline]


def test_step_reports_wait_in_the_buffer_and_anything_else_is_on_disk_when_write_returns(tmp_path):
    out = RunDirectory(tmp_path / "run")
    try:
        out.write(m.StepMetrics(pipeline="a", epoch=0, step=1, loss=0.5, lr=0.1, samples_per_s=1.0))
        assert read_records(tmp_path / "run" / "events.jsonl") == []  # buffered: no write per step
        out.write(m.PipelineFinished(pipeline="a", status="completed"))
        # The final state is on disk before anyone is told of it, and the step before it too, in both files.
        assert [r["type"] for r in read_records(tmp_path / "run" / "events.jsonl")] == ["step", "pipeline_finished"]
        assert [r["type"] for r in read_records(tmp_path / "run" / "a" / "metrics.jsonl")] == ["step"]
        assert (tmp_path / "run" / "events.jsonl").read_bytes().endswith(b"\n")
    finally:
        out.close()


def _run(steps: int, pipelines: tuple[str, ...] = ("a", "b")) -> list[m.Event]:
    events: list[m.Event] = [m.RunStarted(run_id="r", run_dir="/r", config_path="", pipelines=pipelines, time=1.0)]
    for name in pipelines:
        events.append(m.WorkerStateChanged(pipeline=name, state="running", previous="starting", time=1.0))
    for i in range(1, steps + 1):
        for k, name in enumerate(pipelines):
            events.append(m.StepMetrics(pipeline=name, epoch=i // 100, step=i, loss=1.0 / (i + k), lr=0.1,
                                        samples_per_s=100.0 + i, time=1.0 + i))
            if i % 100 == 0:
                events.append(m.EpochEnd(pipeline=name, epoch=i // 100 - 1, step=i, train_loss=1.0 / i, duration=1.0,
                                         samples_per_s=1.0, epochs_total=10, steps_per_epoch=100, time=1.0 + i))
    return events


def _fold(events: list[m.Event], name: str) -> PipelineProgress:
    progress = PipelineProgress(name=name)
    for event in events:
        progress = apply(progress, event)
    return progress


def test_the_history_in_short_keeps_every_other_event_and_a_bounded_even_spread_of_steps():
    events = _run(1000)
    summary = HistorySummary(points=64)
    for event in events:
        summary.add(encode_line(event))
    short = decode_lines(summary.data())
    # Everything but step reports, in order, and the same figures folded.
    assert [e for e in short if not isinstance(e, m.StepMetrics)] == [
        e for e in events if not isinstance(e, m.StepMetrics)]
    assert all(events.index(a) < events.index(b) for a, b in zip(short, short[1:]))
    for name in ("a", "b"):
        assert _fold(short, name) == _fold(events, name)
        steps = [e.step for e in short if isinstance(e, m.StepMetrics) and e.pipeline == name]
        # The whole history's shape: from the first step to the newest, evenly spaced, at most 64 + the newest.
        assert steps[0] == 1 and steps[-1] == 1000 and 32 <= len(steps) <= 65
        gaps = {b - a for a, b in zip(steps[:-2], steps[1:-1])}
        assert len(gaps) == 1, gaps
    assert summary.steps_seen == 2000


def test_the_history_in_short_read_from_a_file_equals_the_one_kept_as_it_happened():
    lines = [encode_line(e) for e in _run(300)]
    as_it_happened, from_file = HistorySummary(points=16), HistorySummary(points=16)
    for line in lines:
        as_it_happened.add(line)
    from_file.add_file(b"".join(lines))
    assert from_file.data() == as_it_happened.data()


def test_a_torn_last_line_is_trimmed_so_the_resumes_first_event_is_not_lost(tmp_path):
    # Regression: a run folder reopened for append after a crash mid-line glued the resume's run_started to the
    # fragment, and every reader skipped the glued line: the event was lost.
    run = tmp_path / "run"
    first = RunDirectory(run)
    first.write(m.PipelineFinished(pipeline="a", status="stopped"))
    first.close()
    (run / "a").mkdir()
    for name in ("events.jsonl", "a/metrics.jsonl"):
        with open(run / name, "ab") as fh:
            fh.write(b'{"type":"step","time":1.0,"pipel')  # the writer died here
    again = RunDirectory(run)
    again.write(m.RunStarted(run_id="run", run_dir=str(run), config_path="", pipelines=("a",)))
    again.write(m.StepMetrics(pipeline="a", epoch=0, step=7, loss=0.5, lr=0.1, samples_per_s=1.0))
    again.close()
    assert [type(e).__name__ for e in read_events(run)] == ["PipelineFinished", "RunStarted", "StepMetrics"]
    assert [r["step"] for r in read_records(run / "a" / "metrics.jsonl")] == [7]


@pytest.mark.parametrize("content, kept", [
    (b"", b""), (b"whole\n", b"whole\n"), (b"no newline at all", b""),
    (b"one\n" + b"x" * (200 << 10), b"one\n"),  # a fragment longer than one read back from the end
    (b"one\ntwo\n" + b"x" * 5, b"one\ntwo\n")])
def test_trim_torn_line_keeps_whole_lines_only(tmp_path, content, kept):
    path = tmp_path / "f.jsonl"
    path.write_bytes(content)
    assert trim_torn_line(path) == len(content) - len(kept)
    assert path.read_bytes() == kept
    assert trim_torn_line(tmp_path / "missing.jsonl") == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_write_the_disk_refuses_is_kept_not_raised():
    # Regression: events.jsonl on a full disk raised OSError 28 out of every write, which killed the supervisor's
    # tick task and lost a worker's batch.
    out = AppendFile(Path("/dev/full"), hold=16)
    out.write(b'{"type":"notice"}\n' * 4)  # past `hold`: tries at once, and keeps it
    assert not out.flush() and out.error.errno == errno.ENOSPC and out.pending == 72 and out.whole == 0
    out.close()


def test_a_run_directory_holds_what_its_disk_refuses_and_writes_it_once_there_is_room(tmp_path, monkeypatch):
    out = RunDirectory(tmp_path / "run")
    real_write = os.write
    full = [True]

    def write(fd, data):  # the disk is full until the test makes room
        if full[0] and fd == out._events.fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    out.write(m.PipelineFinished(pipeline="a", status="stopped"))  # a final state: flushed and fsync'd at once
    assert out.failing is not None and out.failing.errno == errno.ENOSPC and out.written() == 0
    full[0] = False
    assert out.flush() and out.failing is None
    out.close()
    assert [type(e).__name__ for e in read_events(tmp_path / "run")] == ["PipelineFinished"]
