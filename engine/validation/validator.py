"""The validation process: scores weight snapshots while workers train.

One long-lived process for the whole run. It finds each pipeline's snapshot
folder (a worker writes `meta.json` there when an attempt first hands off), builds that
pipeline's task from it (again when a later attempt's meta.json replaces it), and validates
the newest snapshot each time one appears, keeping the best checkpoint and asking for early stops.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

from ..protocol.channel import ControlReceiver, StatusSender
from ..protocol.messages import Stop, ValResult
from ..protocol.names import ValidationMode
from ..protocol.spec import ValidatorSpec
from ..runners.base import Scorer
from ..runners.registry import runner_for

POLL = 0.02  # seconds between looks for new snapshots when idle


def make_scorer(name: str, directory: Path, device: str) -> Scorer:
    """The scorer for the pipeline whose snapshots are in `directory`, from the runner of its kind.

    The worker writes its kind into meta.json as "runner": a factory's LightningTask is configured
    as a "task", and only the worker that built it knows Lightning trains it.
    """
    import json

    from ..config.schema import Pipeline

    meta = json.loads((directory / "meta.json").read_text())
    kind = meta.get("runner") or Pipeline.model_validate(meta["pipeline"]).kind
    return runner_for(kind).scorer(name, directory, device)


def _meta_id(meta: Path) -> tuple[int, int] | None:
    try:
        st = meta.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _build(name: str, directory: Path, device: str, sender: StatusSender) -> Scorer | None:
    """The pipeline's scorer, or None when building it failed (an error result says why)."""
    try:
        return make_scorer(name, directory, device)
    except Exception as exc:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        sender.send(ValResult(pipeline=name, epoch=-1, step=-1, metrics={}, mode=ValidationMode.BACKGROUND,
                              error=f"building the validation task failed: {type(exc).__name__}: {exc}",
                              traceback=tb))
        return None


def _score(name: str, scorers: dict[str, Scorer], directory: Path, device: str, sender: StatusSender,
           broken: dict[str, tuple[int, int] | None]) -> bool:
    """Score the pipeline's next snapshot, remaking its scorer first when a later attempt opened its folder anew
    (its model may have another shape: a PBT trial that took over another's checkpoint); True if one was scored.
    Weights that fit no model it can build are an error result, never a score."""
    from ..runners.scoring import PipelineScoring, Reopened, reopen
    from ..worker.snapshot import SnapshotMismatch

    scorer = scorers[name]
    try:
        return scorer.score_newest(sender)
    except Reopened:
        meta_id = _meta_id(directory / "meta.json")
        fresh = _build(name, directory, device, sender)
        if fresh is None:
            del scorers[name]
            broken[name] = meta_id  # tried again once another attempt writes its meta.json
            return True
        if isinstance(scorer, PipelineScoring) and isinstance(fresh, PipelineScoring):
            reopen(scorer, fresh)
        scorers[name] = fresh
        return True
    except SnapshotMismatch as exc:
        sender.send(ValResult(pipeline=name, epoch=exc.epoch, step=exc.step, metrics={}, seq=exc.seq,
                              mode=ValidationMode.BACKGROUND, error=str(exc)))
        return True


def serve(spec: ValidatorSpec, sender: StatusSender, control: ControlReceiver) -> int:
    """Score snapshots until the supervisor says stop; returns the exit code."""
    import torch

    root = Path(spec.snapshot_root)
    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    scorers: dict[str, Scorer] = {}  # by pipeline name
    broken: dict[str, tuple[int, int] | None] = {}  # pipeline -> the meta.json its scorer failed to build from
    while True:
        for cmd in control.poll(0.0):
            if isinstance(cmd, Stop):
                return 0
        if root.is_dir():
            for meta in root.glob("*/meta.json"):
                name = meta.parent.name
                if name in scorers or (name in broken and broken[name] == _meta_id(meta)):
                    continue
                broken.pop(name, None)
                built = _build(name, meta.parent, spec.device, sender)
                if built is None:
                    broken[name] = _meta_id(meta)
                else:
                    scorers[name] = built
        worked = False
        # Oldest result first, so one busy pipeline cannot starve the others.
        for name in sorted(scorers, key=lambda n: scorers[n].last_seq):
            worked |= _score(name, scorers, root / name, spec.device, sender, broken)
        if not worked:
            for cmd in control.poll(POLL):
                if isinstance(cmd, Stop):
                    return 0
