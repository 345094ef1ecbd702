"""Which runner trains each pipeline kind: one line per kind, its package imported only when asked.

A worker imports the runner it runs and no other (a script worker never loads torch,
a Task worker never loads Lightning). Adding a kind: a sub-package of engine/runners/
whose `__init__.py` defines a `Runner` (engine/runners/base.py), and one line here.
"""
from __future__ import annotations

from importlib import import_module

from ..protocol.names import PipelineKind
from .base import Runner

RUNNERS: dict[PipelineKind, str] = {  # kind -> "sub-package:Runner class"
    PipelineKind.TASK: "task:TaskRunner",
    PipelineKind.LIGHTNING: "lightning:LightningRunner",
    PipelineKind.SCRIPT: "script:ScriptRunner",
}


def runner_for(kind: PipelineKind | str) -> Runner:
    """The runner of `kind` (a PipelineKind, or its string from a config or a run's JSON)."""
    package, _, name = RUNNERS[PipelineKind(kind)].partition(":")
    cls = vars(import_module(f"{__package__}.{package}"))[name]
    return cls()
