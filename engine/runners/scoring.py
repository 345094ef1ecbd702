"""What every runner's scorer shares in the validator: opening a pipeline's snapshot folder, taking the
next snapshot, and keeping the best result (with the early stop that `patience` asks for)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..protocol.channel import EventSink
from ..protocol.messages import EarlyStop, Notice
from ..protocol.progress import judge

if TYPE_CHECKING:
    import torch

    from ..config.schema import Pipeline, ValidationConfig
    from ..worker.snapshot import Loaded, SnapshotReader


class PipelineScoring:
    """What every scorer holds of its pipeline (a runners.base.Scorer subclasses it): set by `open_pipeline`
    from the pipeline's snapshot folder, then kept up by `load_newest` and `keep_best`."""

    name: str
    reader: SnapshotReader
    pipe: Pipeline
    validation: ValidationConfig
    pipeline_dir: Path
    last_seq: int
    best: float | None
    since_best: int


def open_pipeline(scorer: PipelineScoring, name: str, directory: Path) -> None:
    """What every scorer reads from a pipeline's snapshot folder: its reader, the pipeline and validation
    settings the worker wrote there, its run folder, and the best score so far."""
    from ..config.schema import Pipeline, ValidationConfig
    from ..worker.snapshot import SnapshotReader

    scorer.name = name
    scorer.reader = SnapshotReader(directory)
    meta = scorer.reader.meta
    scorer.pipe = Pipeline.model_validate(meta["pipeline"])
    scorer.validation = ValidationConfig.model_validate(meta["validation"])
    scorer.pipeline_dir = Path(meta["pipeline_dir"])
    scorer.last_seq = 0
    scorer.best = meta.get("best")
    scorer.since_best = 0


class Reopened(Exception):
    """A later attempt of the pipeline opened its snapshot folder anew (meta.json replaced): the scorer must be
    made again from it (`reopen`) before it scores another snapshot, which may have another layout or values."""


def load_newest(scorer: PipelineScoring, model: torch.nn.Module) -> Loaded | None:
    """The snapshot a scorer takes next (the newest unseen, or the oldest under policy 'all') loaded into
    `model`, or None; it becomes the scorer's `last_seq`. Shared by every kind of scorer. Raises Reopened (the
    folder is a later attempt's) and SnapshotMismatch (weights of another shape: skipped, not scored)."""
    from ..worker.snapshot import SnapshotMismatch

    for _ in range(5):  # a torn read means a newer snapshot just landed: take that one
        if not scorer.reader.current():
            raise Reopened(scorer.name)
        found = scorer.reader.newest(after=scorer.last_seq, oldest=scorer.validation.policy == "all")
        if found is None:
            return None
        try:
            loaded = scorer.reader.load_into(model, found[0])
        except SnapshotMismatch as exc:
            scorer.last_seq = max(scorer.last_seq, exc.seq)
            raise
        if not scorer.reader.current():  # the slot may hold a later attempt's weights, read with this layout
            raise Reopened(scorer.name)
        if loaded is not None:
            scorer.last_seq = loaded.seq
            return loaded
    return None


def reopen(old: PipelineScoring, new: PipelineScoring) -> None:
    """`new`, made from a later attempt's snapshot folder, goes on from where `old` scored: snapshot numbers only
    rise; its best score is `old`'s when the pipeline trains with the same values, and starts afresh when they
    changed (a PBT trial that took over another's checkpoint: its best is of its own weights since)."""
    new.last_seq = max(new.last_seq, old.last_seq)
    if new.pipe == old.pipe:
        new.best, new.since_best = old.best, old.since_best
    else:
        new.best, new.since_best = None, 0


def keep_best(scorer: PipelineScoring, sender: EventSink, value: float, save: Callable[[], object]) -> None:
    """One result against the scorer's best: a better one is saved with `save()` (a checkpoint write),
    `patience` results in a row that are not ask for an early stop."""
    from ..worker import checkpoint as ckpt
    improved, scorer.best, scorer.since_best, stop = judge(value, scorer.best, scorer.since_best, scorer.validation)
    if improved:
        try:
            save()
        except ckpt.CheckpointError as exc:
            sender.send(Notice(pipeline=scorer.name, level="error", text=f"best checkpoint failed: {exc}"))
    if stop:
        sender.send(EarlyStop(pipeline=scorer.name, reason=stop))
