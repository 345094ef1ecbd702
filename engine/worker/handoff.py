"""The weight hand-off every runner shares: the snapshot meta the validator reads, the writer, the events.

`HandOff` makes the `SnapshotWriter` once training starts, keeps the snapshot numbers
rising across attempts, and reports each hand-off as `SnapshotTaken` (with a warning
when it was dropped). A script's hand-offs happen in its own process; its runner
reports them with `announce_snapshot`. No torch is imported until a writer is made.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..protocol.channel import StatusSender
from ..protocol.jsonvalue import JsonObject
from ..protocol.messages import Notice, SnapshotTaken
from ..protocol.names import PipelineKind, ValidationMode

if TYPE_CHECKING:
    from ..config.schema import Pipeline, ValidationConfig
    from .snapshot import Weights

FINAL_WAIT = 120.0  # seconds a completed worker waits for the validator to free a slot for its final weights


def snapshot_meta(pipe: Pipeline, validation: ValidationConfig, pipeline_dir: Path, best: float | None,
                  runner: PipelineKind) -> dict[str, Any]:
    """What the validator reads from a pipeline's snapshot folder (`meta.json`): the pipeline and validation
    settings, its run folder, the best score so far, and which runner's scorer scores it (a factory's
    LightningTask is configured as a "task": only the worker knows)."""
    return {"pipeline": pipe.model_dump(mode="json"), "validation": validation.model_dump(mode="json"),
            "pipeline_dir": str(pipeline_dir), "best": best, "runner": str(runner)}


def announce_snapshot(sender: StatusSender, name: str, epoch: int, step: int, info: dict[str, Any],
                      slots: int, at: str) -> None:
    """The SnapshotTaken event for one hand-off (`info` as SnapshotWriter.hand_off returns it), and a warning
    when it was dropped; `at` says where it was taken ("of epoch 2 step 40", "at step 40")."""
    sender.send(SnapshotTaken(pipeline=name, epoch=epoch, step=step, **info))
    if info["dropped"]:
        # A client older than `reason` only ever dropped for want of a slot.
        reason = info.get("reason") or f"all {slots} slots hold snapshots the validator has not read (policy 'all')"
        sender.send(Notice(pipeline=name, level="warning", text=f"snapshot {at} dropped: {reason}"))


class HandOff:
    """One worker's hand-offs to the background validator (a no-op unless validation runs there)."""

    def __init__(self, name: str, sender: StatusSender, validation: ValidationConfig, directory: Path | None,
                 seq: int):
        self.name, self.sender, self.validation = name, sender, validation
        self.directory = directory if validation.mode == ValidationMode.BACKGROUND else None
        self.seq = seq  # the newest snapshot number handed off, by this attempt or an earlier one
        self.writer: Any = None  # worker.snapshot.SnapshotWriter, made by open()
        self.last: tuple[int, int, bool] | None = None  # this attempt's last hand-off: epoch, step, dropped

    def resumed(self, seq: int) -> None:
        """A checkpoint says `seq` was handed off already: numbers go on from there (never back)."""
        self.seq = max(seq, self.seq)

    def open(self, model: Weights, meta: JsonObject) -> None:
        """Allocate the slots for `model` (once, before training starts: never at a hand-off)."""
        if self.directory is None or self.writer is not None:
            return
        from .snapshot import SnapshotWriter

        v = self.validation
        self.writer = SnapshotWriter(self.directory, model, v.slots, v.policy, v.checksum, meta,
                                     staging=v.handoff_staging)
        self.writer.seq = self.seq
        for level, text in self.writer.opening_notices():
            self.sender.send(Notice(pipeline=self.name, level=level, text=text))

    def hand_off(self, epoch: int, step: int) -> None:
        """Copy the weights into a slot for the validator and carry on training."""
        if self.writer is None:
            return
        info = self.writer.hand_off(epoch, step)
        self.seq = info["seq"]
        self.last = (epoch, step, bool(info["dropped"]))
        announce_snapshot(self.sender, self.name, epoch, step, info, self.validation.slots,
                          f"of epoch {epoch + 1} step {step}")

    def finish(self, alive: Callable[[], object] | None = None) -> None:
        """Training completed: if its last hand-off was dropped (every slot unread, or a copy in flight), hand
        the same weights off again once the validator frees a slot (up to FINAL_WAIT seconds, `alive` beating
        meanwhile), so the weights the pipeline ends with are scored and `best` can be them."""
        if self.writer is None or self.last is None or not self.last[2]:
            return
        epoch, step, _ = self.last
        if self.writer.wait_for_slot(FINAL_WAIT, alive):
            self.hand_off(epoch, step)
            return
        self.sender.send(Notice(pipeline=self.name, level="warning", text=(
            f"the final snapshot (epoch {epoch + 1} step {step}) was never validated: the validator read none of "
            f"the {self.validation.slots} slots within {FINAL_WAIT:g} s")))

    def close(self) -> None:
        """Publish the snapshot whose copy is still running (waiting for it) and release the slots' pinning:
        before the worker exits, or the validator would wait for a snapshot that never comes."""
        if self.writer is not None:
            self.writer.close()
