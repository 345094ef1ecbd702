"""Runs recorded by the version before trial states (tests/old_runs, written by 15aa107) read, display and resume
as they did: a trial paused at a rung, a PBT trial taking over a checkpoint and one yielding its slot were
`pruned` with a reason that began with words, and read now as waiting at its rung, exploiting and yielding."""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from torchherd.engine.protocol.messages import PipelineFinished, TrainingStarted
from torchherd.engine.protocol.states import WorkerState, ended_label
from torchherd.engine.rundir.directory import read_events, summarize
from torchherd.engine.supervise.supervisor import Supervisor
from tests.test_headless_lines import printed

OLD = Path(__file__).resolve().parent / "old_runs"
S = WorkerState


def test_an_old_paused_trial_reads_as_waiting_at_its_rung():
    ends = [e for e in read_events(OLD / "sweep_cut_while_paused") if isinstance(e, PipelineFinished)]
    assert [(e.status, e.rung) for e in ends] == [("waiting_at_rung", 1.0)]
    assert ends[0].reason.startswith("val_loss 1.548 at epoch 1")  # the old prefix is not said twice
    assert "reg-lr0.03-batch_size128: waiting at rung 1 (val_loss 1.548" in printed(*ends)
    summary = summarize(OLD / "sweep_cut_while_paused")  # it was promoted and queued as the run was cut
    assert summary is not None and summary.resumable and summary.labels == {}


def test_old_exploits_and_yields_read_as_their_states():
    ends = {e.pipeline: e for e in read_events(OLD / "pbt_cut_while_exploiting") if isinstance(e, PipelineFinished)}
    assert {n: e.status for n, e in ends.items()} == {"reg-lr0.03": "exploiting", "reg-lr0.01": "yielding"}
    assert {n: ended_label(e.status) for n, e in ends.items()} == {"reg-lr0.03": "exploiting",
                                                                     "reg-lr0.01": "yielding"}
    summary = summarize(OLD / "pbt_cut_while_exploiting")
    assert summary is not None and summary.resumable and set(summary.to_resume) >= {"reg-lr0.03", "reg-lr0.01"}


def test_old_finished_sweeps_end_pruned_and_completed_as_before():
    for name in ("sweep_finished", "pbt_finished"):
        summary = summarize(OLD / name)
        assert summary is not None and summary.status == "completed" and not summary.resumable, name
        assert set(summary.labels.values()) <= {"completed", "pruned"}, summary.labels


async def _resume(tmp_path: Path, name: str) -> tuple[Supervisor, dict[str, str]]:
    run_dir = tmp_path / "runs" / name
    shutil.copytree(OLD / name, run_dir)
    sup = Supervisor.resume_run(run_dir)
    await sup.start()
    try:
        statuses = await asyncio.wait_for(sup.wait(), 240)
    finally:
        await sup.shutdown(graceful=False)
    return sup, statuses


@pytest.mark.slow
async def test_an_old_sweep_cut_as_a_waiting_trial_was_promoted_resumes_and_trains_it_on(tmp_path):
    sup, statuses = await _resume(tmp_path, "sweep_cut_while_paused")
    promoted = "reg-lr0.03-batch_size128"
    events = read_events(sup.run_dir)
    resumed_at = max(i for i, e in enumerate(events) if type(e).__name__ == "RunStarted")
    later = events[resumed_at:]
    # Promoted as the run was cut: it waits at its rung again, then trains on from its checkpoint.
    ends = [e for e in later if isinstance(e, PipelineFinished) and e.pipeline == promoted]
    assert ends[0].status == S.WAITING_AT_RUNG.value and ends[0].rung == 1.0, ends
    assert any(isinstance(e, TrainingStarted) and e.pipeline == promoted and e.epoch >= 1 for e in later)
    assert all(S(s).final for s in statuses.values()), statuses
    assert "completed" in statuses.values(), statuses


@pytest.mark.slow
async def test_an_old_pbt_run_cut_while_trials_exploited_and_yielded_trains_them_on(tmp_path):
    sup, statuses = await _resume(tmp_path, "pbt_cut_while_exploiting")
    assert statuses == {n: "completed" for n in statuses}, statuses
    later = [e for e in read_events(sup.run_dir) if isinstance(e, TrainingStarted)]
    assert {"reg-lr0.03", "reg-lr0.01"} <= {e.pipeline for e in later}
