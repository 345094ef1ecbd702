"""The `finished` alert `[alerts] on_finish` sends as a run ends: how it ended, how long it took and its restarts,
then each pipeline's state and why, its best validation value and best checkpoint; for a failure the last error
and the log to read."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...protocol.health import FINISHED, Alert
from ...protocol.states import WorkerState
from ..pipeline import PipelineView

RULE = FINISHED  # the alert's rule
WORST = (WorkerState.FAILED, WorkerState.KILLED, WorkerState.STOPPED)  # the first of these any pipeline ended in


def run_status(statuses: dict[str, str]) -> str:
    """How the run ended: the worst state a pipeline ended in (failed, killed, stopped), else completed."""
    values = set(statuses.values())
    return next((s.value for s in WORST if s.value in values), WorkerState.COMPLETED.value)


def finished_alert(views: Sequence[PipelineView], statuses: dict[str, str], run_dir: Path, metric: str,
                   seconds: float, bell: bool) -> Alert:
    """The summary of a run whose pipelines ended as `statuses` say, after `seconds` of this session; `bell` for a
    run that did not complete (a completed run's summary never rings)."""
    status = run_status(statuses)
    restarts = sum(v.restarts for v in views)
    head = f"run {run_dir.name} {status} in {_duration(seconds)}"
    head += f", {restarts} restart{'s' * (restarts != 1)}" if restarts else ""
    parts = [head, *(_pipeline(v, statuses.get(v.name, v.state.value), run_dir, metric) for v in views)]
    return Alert(rule=RULE, title=f"torchherd: {run_dir.name} {status}", message="; ".join(parts),
                 bell=bell and status != WorkerState.COMPLETED.value)


def _pipeline(view: PipelineView, status: str, run_dir: Path, metric: str) -> str:
    """One pipeline's part: "a completed (trained to its limits), best val_loss 0.12 (runs/r/a/checkpoints/best.pt)";
    a failure's adds its error and log."""
    out = f"{view.name} {status}" + (f" ({view.finish_reason})" if view.finish_reason else "")
    if view.best_val is not None:
        best = next(iter(sorted((run_dir / view.name / "checkpoints").glob("best.*"))), None)
        out += f", best {metric} {view.best_val:.6g}" + (f" ({best})" if best is not None else "")
    if view.restarts:
        out += f", {view.restarts} restart{'s' * (view.restarts != 1)}"
    if status == WorkerState.FAILED.value:
        if view.error and view.error not in view.finish_reason:
            out += f", last error: {view.error}"
        out += f", log {view.log_path}"
    return out


def _duration(seconds: float) -> str:
    """'42s', '3m 05s', '2h 07m'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
