"""Pure engine logic: restart policy, lifecycle guard, checkpoints, message records and the status pipe."""
from __future__ import annotations

import dataclasses
import enum
import math
import errno
import itertools
import json
import multiprocessing
import types
import typing
from pathlib import Path

import pytest
import torch

from torchherd.engine.worker import checkpoint as ckpt
from torchherd.engine.protocol.channel import StatusSender, decode_batch, encode_batch
from torchherd.engine.config.schema import RestartConfig
from torchherd.engine.protocol.messages import Event, EpochEnd, Heartbeat, Message, Notice, StepMetrics
from torchherd.engine.protocol.records import from_record, message_types, to_record
from torchherd.engine.supervise.policy import RestartPolicy
from torchherd.engine.rundir.directory import snapshot_root
from torchherd.engine.protocol.states import FINAL_STATES, TRANSITIONS, IllegalTransition, WorkerState, check_transition

S = WorkerState

# ------------------------------------------------------------ restart policy


def policy(**overrides) -> RestartPolicy:
    settings = dict(max_restarts=100, backoff=1.0, backoff_max=5.0, min_uptime=10.0, max_failed_starts=10)
    return RestartPolicy(RestartConfig(**{**settings, **overrides}))


def test_restart_budget_runs_out():
    p = policy(max_restarts=2)
    assert p.decide(restarts_used=1, failed_starts=0, uptime=100).restart
    last = p.decide(restarts_used=2, failed_starts=0, uptime=100)
    assert not last.restart and "budget of 2" in last.reason


def test_failed_start_streak_ends_the_pipeline():
    p = policy(max_failed_starts=3)
    second = p.decide(restarts_used=0, failed_starts=1, uptime=1)
    assert second.restart and second.failed_starts == 2
    third = p.decide(restarts_used=0, failed_starts=2, uptime=1)
    assert not third.restart and third.failed_starts == 3 and "3 failed starts" in third.reason


def test_backoff_doubles_up_to_the_cap():
    p = policy(backoff=1.0, backoff_max=5.0)
    delays = [p.decide(restarts_used=0, failed_starts=n, uptime=1).delay for n in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_healthy_uptime_resets_the_streak():
    decision = policy(min_uptime=10.0).decide(restarts_used=0, failed_starts=4, uptime=10.0)
    assert (decision.restart, decision.failed_starts, decision.delay, decision.reason) == (True, 0, 1.0, "crashed")


# ------------------------------------------------------------ lifecycle guard


def walk(*states: WorkerState) -> list[str]:
    """The steps of a path the guard refuses, as 'old -> new'."""
    refused = []
    for old, new in zip(states, states[1:]):
        try:
            check_transition(old, new)
        except IllegalTransition:
            refused.append(f"{old.value} -> {new.value}")
    return refused


@pytest.mark.parametrize("path", [
    (S.QUEUED, S.STARTING, S.RUNNING, S.COMPLETED),                                   # trains to the end
    (S.RUNNING, S.BACKOFF, S.STARTING, S.RUNNING),                                    # crash, restart
    (S.RUNNING, S.HUNG, S.KILLING, S.BACKOFF, S.STARTING),                            # hang, restart
    (S.STARTING, S.HUNG, S.KILLING, S.FAILED),                                        # stuck building
    (S.RUNNING, S.PAUSED, S.RUNNING, S.STOPPING, S.STOPPED),                          # pause, resume, stop
    (S.RUNNING, S.STOPPING, S.KILLING, S.STOPPED),                                    # stop_timeout ran out
    (S.RUNNING, S.KILLING, S.STARTING),                                               # `r`: user restart
    (S.KILLED, S.QUEUED, S.STARTING),                                                 # restarted after the end
], ids=lambda path: "-".join(s.value for s in path))
def test_the_paths_the_supervisor_walks_are_allowed(path):
    assert walk(*path) == []


def reachable(start: WorkerState) -> set[WorkerState]:
    seen, todo = set(), [start]
    while todo:
        for new in TRANSITIONS[todo.pop()] - seen:
            seen.add(new)
            todo.append(new)
    return seen


def test_every_state_is_reachable_and_none_is_a_trap():
    assert set(TRANSITIONS) == set(WorkerState)
    assert reachable(S.QUEUED) | {S.QUEUED} == set(WorkerState)
    for state in set(WorkerState) - FINAL_STATES:  # whatever happens, a pipeline can still end
        assert reachable(state) & FINAL_STATES, state


@pytest.mark.parametrize("state", sorted(set(WorkerState) - FINAL_STATES, key=lambda s: s.value))
def test_kill_and_stop_are_possible_from_every_live_state(state):
    # The k and s keys must work whatever the pipeline is doing.
    assert TRANSITIONS[state] & {S.KILLING, S.KILLED}, f"{state.value} cannot be killed"
    assert S.STOPPED in reachable(state) and TRANSITIONS[state] & {S.STOPPING, S.STOPPED, S.KILLING}


@pytest.mark.parametrize("old, new", [(S.QUEUED, S.RUNNING), (S.RUNNING, S.QUEUED), (S.BACKOFF, S.RUNNING),
                                      (S.STOPPING, S.RUNNING), (S.COMPLETED, S.STARTING)])
def test_illegal_transitions_raise(old, new):
    with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
        check_transition(old, new)


@pytest.mark.parametrize("final", sorted(FINAL_STATES, key=lambda s: s.value))
def test_final_states_only_go_back_to_queued(final):
    allowed = []
    for new in WorkerState:
        try:
            check_transition(final, new)
            allowed.append(new)
        except IllegalTransition:
            pass
    assert allowed == [S.QUEUED]


# ------------------------------------------------------------ checkpoints


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}, "epoch": int(value)}


def loaded_value(path: Path) -> float:
    return float(torch.load(path, weights_only=False)["model"]["w"][0])


def test_save_keeps_the_previous_as_prev(tmp_path):
    ckpt.save_checkpoint(tmp_path, state(1.0))
    ckpt.save_checkpoint(tmp_path, state(2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "prev.pt"]
    assert (loaded_value(tmp_path / "last.pt"), loaded_value(tmp_path / "prev.pt")) == (2.0, 1.0)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_load_latest_falls_back_to_prev(tmp_path, damage):
    ckpt.save_checkpoint(tmp_path, state(1.0))
    ckpt.save_checkpoint(tmp_path, state(2.0))
    last = tmp_path / "last.pt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00not a checkpoint" * 10)
    loaded, path, note = ckpt.load_latest(tmp_path)
    assert path == tmp_path / "prev.pt" and float(loaded["model"]["w"][0]) == 1.0
    assert note.startswith("last.pt unreadable") and note.endswith("resumed from prev.pt")


def test_load_latest_of_nothing(tmp_path):
    assert ckpt.load_latest(tmp_path) == (None, None, "")


def test_failed_write_keeps_last_and_leaves_no_temp(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, state(1.0))

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(ckpt.CheckpointError, match="No space left on device"):
        ckpt.save_checkpoint(tmp_path, state(2.0))
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert loaded_value(tmp_path / "last.pt") == 1.0


# Bug: write_atomic calls mkdir outside its try, so a checkpoint directory that
# is a file raises FileExistsError instead of CheckpointError (and trainer.save,
# which catches only CheckpointError, crashes the worker).
def test_directory_that_is_a_file_raises_checkpoint_error(tmp_path):
    blocker = tmp_path / "ckpt"
    blocker.write_text("not a folder")
    with pytest.raises(ckpt.CheckpointError):
        ckpt.save_checkpoint(blocker, state(1.0))


# Bug: a real write failure inside torch.save (ENOSPC; EFBIG under RLIMIT_FSIZE
# reproduces it) surfaces as this RuntimeError from torch's zip writer, not as
# OSError, so it escapes write_atomic unwrapped and trainer.save crashes the worker.
def test_torch_writer_failure_raises_checkpoint_error(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, state(1.0))

    def writer_fails(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662")

    monkeypatch.setattr(torch, "save", writer_fails)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.save_checkpoint(tmp_path, state(2.0))


# ------------------------------------------------------------ run directories


# Regression: the shared-memory snapshot root was /dev/shm/torchherd-<run id>, and a run id is only unique
# inside its runs directory (time to the second + config name). Two runs of same-named configs started in
# the same second from different directories (two projects, two test sessions) shared their snapshot
# slots: a validator scored the other run's weights (a val_result with a seq its own worker never reached).
def test_runs_in_different_directories_never_share_snapshots(tmp_path):
    run_id = "20250101-120000-train"
    assert snapshot_root(run_id, tmp_path / "a" / run_id) != snapshot_root(run_id, tmp_path / "b" / run_id)


# ------------------------------------------------------------ message records

_values = itertools.count(1)


def sample(hint):
    """A distinct value of type `hint`, so swapped or lost fields show."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if hint is bool:
        return True
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[-1]
    if hint is int:
        return next(_values)
    if hint is float:
        return next(_values) + 0.5
    if hint is str or hint is typing.Any:  # Any: a table of plain values (trial_decision's exploit)
        return f"s{next(_values)}"
    if origin is tuple:
        return (sample(args[0]), sample(args[0]))
    if origin is dict:
        return {sample(args[0]): sample(args[1]), sample(args[0]): sample(args[1])}
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: sample(hints[f.name]) for f in dataclasses.fields(hint)})
    raise TypeError(f"no sample for {hint!r}")


EVENT_TYPES = sorted((c for c in message_types().values() if issubclass(c, Event) and c is not Event),
                     key=lambda c: c.type)


def test_every_event_type_is_covered():
    assert {"step", "epoch_end", "val_result", "worker_exited", "telemetry", "run_finished"} <= \
        {c.type for c in EVENT_TYPES}


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.type)
def test_record_round_trip(cls: type[Message]):
    msg = sample(cls)
    record = json.loads(json.dumps(to_record(msg)))
    assert record["type"] == cls.type
    assert from_record(record) == msg


# ------------------------------------------------------------ status pipe


def step(i: int) -> StepMetrics:
    return StepMetrics(pipeline="p", epoch=0, step=i, loss=1.0 / (i + 1), lr=0.1, samples_per_s=100.0)


def receive(conn, count: int) -> list[Event]:
    """The next `count` events off the pipe, whatever batches they came in."""
    out: list[Event] = []
    while len(out) < count:
        assert conn.poll(30), f"only {len(out)} of {count} events arrived"
        out += decode_batch(conn.recv_bytes())
    return out


@pytest.fixture
def pipe():
    reader, writer = multiprocessing.Pipe(duplex=False)
    senders: list[StatusSender] = []

    def make(max_pending: int) -> StatusSender:
        # An hour's flush interval: the sender thread ships only when send() wakes it.
        senders.append(StatusSender(writer, flush_interval=3600, max_pending=max_pending))
        return senders[-1]

    yield reader, make
    for s in senders:
        s.close()
    reader.close()
    writer.close()


def test_a_batch_keeps_its_order_and_every_field_whatever_travels_packed():
    note = Notice(level="info", text="between")
    odd = dataclasses.replace(step(9), loss=None, metrics={"acc": 0.5})  # a loss of another type than declared
    unknown = dataclasses.replace(step(10), metrics={"t": Path("x")})  # a value msgpack cannot encode
    batch = [step(1), step(2), note, step(3), odd, Heartbeat(pipeline="p", step=3), unknown, step(11)]
    got = decode_batch(encode_batch(batch))
    # Nothing is pickled on a channel (it may cross a network): a None loss arrives as NaN, as events.jsonl
    # reads it back, and a metric that is no number is left out; every other field arrives as sent.
    assert math.isnan(got[4].loss) and got[6].metrics == {}
    expected = [*batch[:4], dataclasses.replace(odd, loss=got[4].loss), batch[5],
                dataclasses.replace(unknown, metrics={}), batch[7]]
    assert got == expected and [type(e) for e in got] == [type(e) for e in batch]
    assert decode_batch(encode_batch([])) == []


def test_dropped_steps_are_counted_on_the_next_delivered(pipe):
    reader, make = pipe
    sender = make(max_pending=3)
    for i in range(6):  # 3 fit, 3 dropped
        sender.step(step(i))
    sender.send(EpochEnd(pipeline="p", epoch=0, step=5, train_loss=0.5, duration=1.0, samples_per_s=10.0,
                         epochs_total=1, steps_per_epoch=6))
    first = receive(reader, 4)
    assert [(type(e).__name__, getattr(e, "dropped", None)) for e in first] == \
        [("StepMetrics", 0)] * 3 + [("EpochEnd", None)]
    assert [e.step for e in first] == [0, 1, 2, 5]
    # The queue is empty now (the batch was taken off it before it was sent).
    sender.step(step(6))
    sender.step(step(7))
    sender.send(Notice(pipeline="p", text="flush"))
    second = receive(reader, 3)
    assert [(e.step, e.dropped) for e in second[:2]] == [(6, 3), (7, 0)]


def test_critical_events_are_never_dropped(pipe):
    reader, make = pipe
    sender = make(max_pending=2)
    for i in range(4):
        sender.step(step(i))
    for i in range(5):
        sender.send(Notice(pipeline="p", text=f"n{i}"))
    got = receive(reader, 7)
    assert [e.step if isinstance(e, StepMetrics) else e.text for e in got] == [0, 1, "n0", "n1", "n2", "n3", "n4"]
    sender.close()
    assert not reader.poll(0)


def test_order_is_preserved(pipe):
    reader, make = pipe
    sender = make(max_pending=100)
    expected = []
    for i in range(10):
        ev = Notice(pipeline="p", text=f"n{i}") if i % 3 == 0 else \
            Heartbeat(pipeline="p", step=i) if i % 3 == 1 else step(i)
        (sender.send if isinstance(ev, Notice) else sender.step)(ev)
        expected.append(ev)
    end = Notice(pipeline="p", text="end")
    sender.send(end)
    assert receive(reader, 11) == expected + [end]


def test_a_cuda_out_of_memory_leads_its_error_wherever_it_was_raised():
    from torchherd.engine.runners.base import error_text

    at_build = "task factory task.py:build raised OutOfMemoryError: CUDA out of memory. Tried to allocate 14 GiB"
    assert error_text(at_build) == f"CUDA out of memory: {at_build}"
    assert error_text("CUDA out of memory. Tried to allocate 1 GiB") == "CUDA out of memory. Tried to allocate 1 GiB"
    assert error_text("RuntimeError: CUDA error: out of memory").startswith("CUDA out of memory: RuntimeError")
    assert error_text("ValueError: bad lr") == "ValueError: bad lr"


async def test_waiting_takes_what_is_queued_and_leaves_the_streams_end_for_the_iteration():
    from torchherd.engine.supervise.bus import EventBus

    bus = EventBus()
    stream = bus.subscribe()
    for i in range(3):
        bus.publish(Notice(text=f"n{i}"))
    bus.close()
    assert [e.text for e in stream.waiting(2)] == ["n0", "n1"]
    assert [e.text for e in stream.waiting(10)] == ["n2"]
    assert stream.waiting(10) == []
    assert [e async for e in stream] == []  # the end is still there: the iteration stops, it does not hang


async def test_a_stream_gives_a_queued_burst_event_by_event_in_order_with_single_events_around_it():
    import asyncio

    from torchherd.engine.supervise.bus import EventStream

    queue: asyncio.Queue = asyncio.Queue()
    stream = EventStream(queue)
    burst = [Notice(text="b1"), Notice(text="b2"), Notice(text="b3")]
    for item in (Notice(text="a"), burst, Notice(text="c"), burst, None):
        queue.put_nowait(item)
    assert [e.text for e in stream.waiting(2)] == ["a", "b1"]  # a burst may be cut by the limit
    assert stream.get_nowait().text == "b2"
    assert [e.text async for e in stream] == ["b3", "c", "b1", "b2", "b3"]
    assert [e.text for e in burst] == ["b1", "b2", "b3"]  # shared by every stream: never changed


def test_a_tap_with_steps_of_its_own_takes_a_run_of_step_reports_at_once_and_every_other_event_one_by_one():
    from torchherd.engine.rundir.lines import encode_line
    from torchherd.engine.supervise.bus import EventBus

    bus = EventBus()
    each, runs, plain = [], [], []
    bus.add_tap(lambda e, line, kept: each.append(e), steps=lambda steps, lines: runs.append((steps, lines)))
    bus.add_tap(lambda e, line, kept: plain.append(e))
    steps = [StepMetrics(pipeline="a", epoch=0, step=i, loss=0.1, lr=0.1, samples_per_s=1.0) for i in (1, 2, 3)]
    bus.publish_steps(steps)
    bus.publish(Notice(text="n"))
    assert runs == [(steps, [encode_line(s) for s in steps])]
    assert [type(e) for e in each] == [Notice]  # the runs' reports reached it through `steps` only
    assert plain == [*steps, each[0]]  # a tap without `steps` still sees each report
