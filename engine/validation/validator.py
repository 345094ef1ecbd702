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
from typing import Any

from ..protocol.channel import ControlReceiver, StatusSender
from ..protocol.messages import Stop, ValResult
from ..protocol.spec import ValidatorSpec

POLL = 0.02  # seconds between looks for new snapshots when idle


def make_scorer(name: str, directory: Path, device: str):
    """The scorer for the pipeline whose snapshots are in `directory`: a Task's (or a script's `validate`
    factory's), or a Lightning module's."""
    import json

    meta = json.loads((directory / "meta.json").read_text())
    task = meta["pipeline"].get("task") or ""  # None for a script
    # A factory's LightningTask has no "lightning:" prefix: its worker says which runner wrote the snapshots.
    if task.startswith("lightning:") or meta.get("runner") == "lightning":
        from ..runners.lightning.scorer import LightningScorer

        return LightningScorer(name, directory, device)
    from ..runners.task.scorer import PipelineScorer

    return PipelineScorer(name, directory, device)


def serve(spec: ValidatorSpec, sender: StatusSender, control: ControlReceiver) -> int:
    """Score snapshots until the supervisor says stop; returns the exit code."""
    import torch

    root = Path(spec.snapshot_root)
    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    scorers: dict[str, Any] = {}  # PipelineScorer or LightningScorer
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
                    sender.send(ValResult(pipeline=name, epoch=-1, step=-1, metrics={}, mode="background",
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
