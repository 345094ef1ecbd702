"""Background validation with real worker and validator processes on a tiny CPU task."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from torchherd.engine.worker.evaluate import evaluate
from torchherd.engine.protocol.messages import (EarlyStop, PipelineFinished, RunFinished, SnapshotSkipped, SnapshotTaken, ValidatorStarted,
                             ValResult)
from torchherd.engine.rundir.directory import read_events
from torchherd.engine.supervise.supervisor import Supervisor
from tests.conftest import TASKS, make_config, still_alive, wait_for

pytestmark = pytest.mark.slow
SLOW_VAL = f"{TASKS / 'tiny.py'}:build_slow_val"


def background(**extra):
    return {"mode": "background", "device": "cpu", **extra}


async def run_to_end(sup: Supervisor, timeout: float = 120.0):
    await sup.start()
    try:
        await asyncio.wait_for(sup.wait(), timeout)
    finally:
        await sup.shutdown(graceful=False)
    return read_events(sup.run_dir)


def of(events, cls, pipeline="a"):
    return [e for e in events if isinstance(e, cls) and getattr(e, "pipeline", pipeline) == pipeline]


async def test_policy_all_validates_every_epoch_with_the_exact_weights(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "params": {"delay": 0.002}}], defaults={"max_epochs": 4},
                         validation=background(policy="all", slots=8, checksum=True))
    events = await run_to_end(Supervisor(config))
    taken, results = of(events, SnapshotTaken), of(events, ValResult)
    assert [t.epoch for t in taken] == [0, 1, 2, 3] and not any(t.dropped for t in taken)
    assert sorted(r.epoch for r in results) == [0, 1, 2, 3]
    assert all(r.mode == "background" and "val_loss" in r.metrics for r in results)
    by_seq = {t.seq: t.checksum for t in taken}
    for r in results:  # the validator scored exactly the weights the worker handed off
        assert r.checksum is not None and r.checksum == by_seq[r.seq]
    assert not of(events, SnapshotSkipped)


async def test_policy_latest_skips_stale_snapshots_and_always_scores_the_newest(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "task": SLOW_VAL, "params": {"val_delay": 0.01}}],
                         defaults={"max_epochs": 8},
                         validation=background(policy="latest", every_n_steps=2))
    events = await run_to_end(Supervisor(config))
    taken, results, skipped = of(events, SnapshotTaken), of(events, ValResult), of(events, SnapshotSkipped)
    assert skipped, "a validator slower than the hand-offs must skip some snapshots"
    assert max(r.seq for r in results) == max(t.seq for t in taken)  # the newest is always validated
    assert {r.seq for r in results} | {s.seq for s in skipped} == {t.seq for t in taken}
    assert not {r.seq for r in results} & {s.seq for s in skipped}
    assert of(events, PipelineFinished)[0].status == "completed"


async def test_killed_validator_is_restarted_and_training_completes(tmp_path):
    # Training waits at its 12th step (in epoch 2) until the validator is back: on a loaded machine the
    # first result could otherwise come after training had ended, when no validator is needed again.
    gate = tmp_path / "validator-back"
    config = make_config(tmp_path, [{"name": "a", "params": {"gate_file": str(gate), "gate_at_call": 12}}],
                         defaults={"max_epochs": 6, "task": f"{TASKS / 'faulty.py'}:build"}, validation=background())
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        first = await wait_for(stream, lambda e: isinstance(e, ValidatorStarted))
        await wait_for(stream, lambda e: isinstance(e, ValResult))
        os.kill(first.pid, signal.SIGKILL)
        second = await wait_for(stream, lambda e: isinstance(e, ValidatorStarted))
        gate.touch()
        assert second.attempt == 2 and second.pid != first.pid
        after = await wait_for(stream, lambda e: isinstance(e, ValResult))
        assert after.seq > 0
        done = await wait_for(stream, lambda e: isinstance(e, RunFinished))
        assert done.statuses == {"a": "completed"}
    finally:
        await sup.shutdown(graceful=False)
    events = read_events(sup.run_dir)
    taken = {t.seq for t in of(events, SnapshotTaken)}
    accounted = {r.seq for r in of(events, ValResult)} | {s.seq for s in of(events, SnapshotSkipped)}
    assert taken == accounted  # every snapshot was either scored or recorded as skipped


async def test_best_checkpoint_holds_the_weights_of_the_best_result(tmp_path):
    config = make_config(tmp_path, [{"name": "a"}], defaults={"max_epochs": 5},
                         validation=background(policy="all", slots=8))
    sup = Supervisor(config)
    events = await run_to_end(sup)
    best_reported = min(r.metrics["val_loss"] for r in of(events, ValResult))
    state = torch.load(sup.run_dir / "a" / "checkpoints" / "best.pt", weights_only=False)
    from tests.tasks.tiny import build
    task = build({})
    task.model.load_state_dict(state["model"])
    loader = torch.utils.data.DataLoader(task.val_data, batch_size=32)
    scored = evaluate(task.model, loader, task.loss_fn, None, "cpu", __import__("contextlib").nullcontext)
    assert state["value"] == pytest.approx(best_reported)
    assert scored["val_loss"] == pytest.approx(best_reported, rel=1e-5)


async def test_the_final_weights_are_scored_even_when_policy_all_dropped_their_snapshot(tmp_path):
    # Regression: with every slot unread at the last epochs (a validator slower than training, policy 'all'),
    # the final snapshot was dropped, the run finished, and best.pt held weights from epochs before.
    config = make_config(tmp_path, [{"name": "a", "task": SLOW_VAL, "params": {"val_delay": 0.01}}],
                         defaults={"max_epochs": 6}, validation=background(policy="all", slots=2))
    sup = Supervisor(config)
    events = await run_to_end(sup)
    taken, results = of(events, SnapshotTaken), of(events, ValResult)
    final_step = [e for e in events if type(e).__name__ == "EpochEnd"][-1].step
    assert taken[-1].step == final_step and not taken[-1].dropped
    assert any(t.dropped for t in taken), "the validator must be slow enough to fill both slots"
    assert max(results, key=lambda r: r.seq).step == final_step  # scored, before the run said it finished
    assert events.index(max(results, key=lambda r: r.seq)) < events.index(of(events, RunFinished)[0])
    best = min(results, key=lambda r: r.metrics["val_loss"])
    state = torch.load(sup.run_dir / "a" / "checkpoints" / "best.pt", weights_only=False)
    assert state["value"] == pytest.approx(best.metrics["val_loss"])


async def test_early_stopping_stops_the_worker(tmp_path):
    # lr 0: the validation loss never improves after the first result.
    config = make_config(tmp_path, [{"name": "a", "params": {"lr": 0.0, "delay": 0.004}}],
                         defaults={"max_epochs": 200}, validation=background(patience=2, policy="all", slots=4))
    events = await run_to_end(Supervisor(config))
    assert of(events, EarlyStop)
    finished = of(events, PipelineFinished)[0]
    # Early stopping is a completion: its own final state, not "stopped" (which resume would undo).
    assert finished.status == "early_stopped" and "early stopping" in finished.reason
    assert finished.epoch < 200
    assert of(events, RunFinished)[-1].ok


async def test_validation_that_raises_is_reported_and_training_goes_on(tmp_path):
    config = make_config(tmp_path, [{"name": "a", "task": SLOW_VAL, "params": {"val_raises": True}}],
                         defaults={"max_epochs": 3}, validation=background())
    events = await run_to_end(Supervisor(config))
    failed = [r for r in of(events, ValResult) if r.error]
    assert failed and "exploded on purpose" in failed[0].error and "Traceback" in failed[0].traceback
    assert of(events, PipelineFinished)[0].status == "completed"


# Regression (found by scripts/soak.py): a restarted worker re-created its snapshot slots and wiped the
# snapshot its previous attempt had handed off, so it was never validated and the run never finished.
async def test_a_restarted_worker_keeps_the_unread_snapshots_of_its_previous_attempt(tmp_path):
    from torchherd.engine.worker.snapshot import SnapshotReader, SnapshotWriter
    from tests.tasks.tiny import build

    model = build({}).model
    writer = SnapshotWriter(tmp_path / "p", model, 2, "latest", False, {})
    writer.hand_off(epoch=3, step=30)
    SnapshotWriter(tmp_path / "p", model, 2, "latest", False, {})  # the next attempt starts
    reader = SnapshotReader(tmp_path / "p")
    found = reader.newest()
    assert found is not None and found[1] == 1
    loaded = reader.load_into(build({}).model, found[0])
    assert loaded is not None and (loaded.epoch, loaded.step) == (3, 30)


# Regression: after a run finished, with the app still open, the validator was alive minutes later (on a
# GPU it would hold a CUDA context on a shared card). It ends with the run, and a restart starts it again.
async def test_the_validator_ends_with_the_run_and_comes_back_for_a_restart(tmp_path):
    config = make_config(tmp_path, [{"name": "a"}], defaults={"max_epochs": 2}, validation=background())
    sup = Supervisor(config)
    stream = sup.subscribe()
    await sup.start()
    try:
        first = await wait_for(stream, lambda e: isinstance(e, ValidatorStarted))
        await wait_for(stream, lambda e: isinstance(e, RunFinished))
        assert not await asyncio.to_thread(still_alive, [first.pid], 30)  # gone, the session still open
        sup.restart("a")
        second = await wait_for(stream, lambda e: isinstance(e, ValidatorStarted))
        assert second.pid != first.pid
        await wait_for(stream, lambda e: isinstance(e, RunFinished))
        assert not await asyncio.to_thread(still_alive, [second.pid], 30)
    finally:
        await sup.shutdown(graceful=False)


# Regression (issue 52 item 8): a PBT trial that took over a wider donor's checkpoint handed off weights of another
# layout into the folder the validator had opened for its first attempt; the validator copied them, byte for
# byte, into the narrow model it had built then and scored that: chance, with no error.
def test_a_later_attempts_snapshots_of_another_shape_are_reopened_or_refused_never_scored(tmp_path):
    from types import SimpleNamespace

    from torch import nn

    from torchherd.engine.runners.scoring import Reopened, load_newest
    from torchherd.engine.worker.snapshot import SnapshotMismatch, SnapshotReader, SnapshotWriter

    narrow, wide = nn.Linear(4, 4), nn.Linear(4, 64)
    SnapshotWriter(tmp_path / "p", narrow, 2, "latest", False, {}).hand_off(epoch=0, step=8)
    scorer = SimpleNamespace(name="p", reader=SnapshotReader(tmp_path / "p"), last_seq=0,
                             validation=SimpleNamespace(policy="latest"))
    assert load_newest(scorer, narrow).step == 8
    later = SnapshotWriter(tmp_path / "p", wide, 2, "latest", False, {})  # the trial's next attempt, wider
    later.seq = 1
    later.hand_off(epoch=2, step=24)
    with pytest.raises(Reopened):  # the validator builds its model again from the new meta.json
        load_newest(scorer, narrow)
    reader = SnapshotReader(tmp_path / "p")
    assert reader.current() and reader.load_into(wide, reader.newest()[0]).step == 24
    with pytest.raises(SnapshotMismatch, match=r"weight \(1024 bytes\) in the snapshot, weight \(4, 4\)"):
        reader.load_into(narrow, reader.newest()[0])  # a model of the wrong shape is an error, not a score
