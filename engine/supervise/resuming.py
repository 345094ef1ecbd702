"""What resuming a run does with each of its pipelines: which keep how they ended, and where the others
start from, for people.
"""
from __future__ import annotations

from pathlib import Path

from ..config.schema import Pipeline
from ..protocol.messages import PipelineFinished, WorkerStarted
from ..protocol.states import RESTING_STATES, SUCCESS_STATES, ended_label
from ..rundir.directory import read_events
from ..runners.registry import runner_for


def history_before(run_dir: Path) -> tuple[dict[str, PipelineFinished], dict[str, int]]:
    """({pipeline: how it ended} of the pipelines that had ended (or rested) when the run was cut short,
    {pipeline: attempts started}), so a resumed pipeline's attempts (and TORCHHERD_RESTART_COUNT) count on."""
    done: dict[str, PipelineFinished] = {}
    attempts: dict[str, int] = {}
    for e in read_events(run_dir):
        if isinstance(e, PipelineFinished):
            done[e.pipeline] = e
        elif isinstance(e, WorkerStarted):
            attempts[e.pipeline] = max(attempts.get(e.pipeline, 0), e.attempt)
    return done, attempts


def kept_on_resume(done: dict[str, str], names: list[str], only: set[str] | None) -> dict[str, str]:
    """{pipeline: status} of those resuming leaves as they ended (`done`: each one's status): the completed,
    early-stopped and pruned ones and the sweep's resting trials (any of those but a completed one resumes only
    when `only` names it), and those not in `only` when it is given (they keep their status, or read as
    stopped)."""
    if only is None:
        return {n: done[n] for n in names if done.get(n) in SUCCESS_STATES | RESTING_STATES}
    return {n: done.get(n, "stopped") for n in names if n not in only or done.get(n) == "completed"}


def resume_line(run_dir: Path, pipe: Pipeline, kept: dict[str, str]) -> str:
    """What resuming does with one pipeline, for people."""
    name = pipe.name
    if name in kept:
        return f"{name} {'done' if kept[name] == 'completed' else f'left {ended_label(kept[name])}'}"
    return f"{name} {runner_for(pipe.kind).resumes_from(pipe, run_dir / name / 'checkpoints')}"
