"""The validation process: scores weight snapshots while workers train.

One long-lived process for the whole run. It finds each pipeline's snapshot
folder (a worker writes `meta.json` there when it first hands off), builds that
pipeline's task once, and then validates the newest snapshot each time one
appears, keeping the best checkpoint and asking for early stops.
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


def serve(spec: ValidatorSpec, sender: StatusSender, control: ControlReceiver) -> int:
    """Score snapshots until the supervisor says stop; returns the exit code."""
    import torch

    root = Path(spec.snapshot_root)
    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    scorers: dict[str, Scorer] = {}  # by pipeline name
    broken: set[str] = set()
    while True:
        for cmd in control.poll(0.0):
            if isinstance(cmd, Stop):
                return 0
        if root.is_dir():
            for meta in root.glob("*/meta.json"):
                name = meta.parent.name
                if name in scorers or name in broken:
                    continue
                try:
                    scorers[name] = make_scorer(name, meta.parent, spec.device)
                except Exception as exc:
                    broken.add(name)
                    tb = traceback.format_exc()
                    print(tb, file=sys.stderr, flush=True)
                    sender.send(ValResult(pipeline=name, epoch=-1, step=-1, metrics={}, mode=ValidationMode.BACKGROUND,
                                          error=f"building the validation task failed: {type(exc).__name__}: {exc}",
                                          traceback=tb))
        worked = False
        # Oldest result first, so one busy pipeline cannot starve the others.
        for scorer in sorted(scorers.values(), key=lambda s: s.last_seq):
            worked |= scorer.score_newest(sender)
        if not worked:
            for cmd in control.poll(POLL):
                if isinstance(cmd, Stop):
                    return 0
