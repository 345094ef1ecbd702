"""Events about what goes wrong in a run: each rank's pace, a straggler, a hung gang's triage, an alert.

Frozen dataclasses of primitives like those of `messages.py` (kept in a module of their own
for its size); `records.py` registers them, so they are in `events.jsonl` like the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .messages import PipelineEvent, PipelineOrRunEvent


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPace(PipelineEvent):
    """One rank of a gang's own time per batch over its last report window (sent with its step reports, by
    every rank; not in events.jsonl)."""

    type: ClassVar[str] = "rank_pace"
    rank: int
    step: int
    step_time: float  # seconds of its own work per batch (Task: data and forward; a script: between reports)


@dataclass(frozen=True, kw_only=True, slots=True)
class Straggler(PipelineEvent):
    """A gang's rank has been slower than the median of its peers by `ratio` (at least `[alerts] straggler`)
    several reports running; `ratio` 0 says it keeps pace again."""

    type: ClassVar[str] = "straggler"
    rank: int
    ratio: float  # its step time over the median of the others'
    median: float  # seconds per batch, the other ranks'
    slowest: float  # seconds per batch, this rank's


@dataclass(frozen=True, kw_only=True, slots=True)
class Triage(PipelineEvent):
    """Where each rank of a stalled (or asked-about) pipeline is, read from its Python stacks; `verdict`
    names the odd rank first ("ranks 0 wait in all_reduce; rank 1 is in `time.sleep(...)`")."""

    type: ClassVar[str] = "triage"
    verdict: str
    ranks: tuple[str, ...] = ()  # per rank, where its training thread is ("" when its stack was not found)
    folder: str = ""  # where the stacks were gathered (the pipeline's stacks/ folder)


FINISHED = "finished"  # the rule of the alert that sums a run up as it ends (`[alerts] on_finish`)


@dataclass(frozen=True, kw_only=True, slots=True)
class Alert(PipelineOrRunEvent):
    """A rule on what the supervisor sees fired (supervise/health/alert_rules.py has every rule): one per rule and
    pipeline per interval, `count` the times it fired since the last one."""

    type: ClassVar[str] = "alert"  # pipeline "" for the whole run (the disk)
    rule: str  # the rule's name, as supervise/health/alert_rules.py raises it (docs/reference/config.md lists them)
    title: str  # "torchherd: g stalled"
    message: str
    count: int = 1
    bell: bool = True  # the app rings the terminal bell (`[alerts] bell`; NO_BELL in its environment silences it)
