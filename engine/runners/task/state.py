"""The `Task` trainer's checkpoints: what one holds, how it is saved and how an attempt resumes from it.

A single process or a DDP gang: rank 0 writes one file (worker/checkpoint.py). A sharded (`fsdp`) gang:
every rank writes its shards through DCP (sharded_checkpoint.py), and a gang of another world size
resumes from them, its place in the epoch carried over in samples.
"""
from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...protocol.messages import CheckpointSaved, Notice, Resumed
from ...protocol.names import NoticeTopic
from ...worker import checkpoint as ckpt
from ...worker.checkpoint_writer import CheckpointWriter
from ...worker.retune import lr_scale, number, scale_lrs
from .sharded_writer import ShardedWriter

if TYPE_CHECKING:
    from ...config.schema import Pipeline
    from ...protocol.channel import StatusSender
    from ...worker.handoff import HandOff
    from .api import Task
    from .distributed import Gang


def _unfit(exc: RuntimeError, path: Path | None, saved: dict[str, Any], mine: dict[str, Any]) -> str:
    """Why a checkpoint's weights do not fit the model: torch's words, and, where the file was written under
    other sweep values (a PBT trial took over another's), which keys differ and how to keep them."""
    changed = {k: (saved[k], v) for k, v in mine.items() if k in saved and saved[k] != v and k != "params.lr"}
    if not changed:
        return str(exc)
    said = ", ".join(f"{k} {a} (this attempt: {b})" for k, (a, b) in changed.items())
    [key, *others] = changed
    which = "" if not others else " (whichever of these shapes the model)"
    lines = str(exc).splitlines() or [""]
    first = next((line.strip() for line in lines if line.strip().startswith(("size mismatch", "Missing key",
                                                                              "Unexpected key"))), lines[0])
    return (f"checkpoint {path.name if path else ''} was written with {said}, and its weights do not fit this "
            f"model: PBT cannot explore a key that shapes the model; keep it from the donor{which}, as in "
            f'[sweep] explore = {{ {key} = "keep" }} ({first})')


class TrainerCheckpoints:
    """Saving and resuming, for `Trainer` (engine/runners/task/trainer.py), whose attributes it reads."""

    # The attributes of `Trainer` read here (its __init__ sets them).
    task: Task
    pipe: Pipeline
    name: str
    gang: Gang | None
    lead: bool
    sharded: bool
    device: torch.device
    ckpt_dir: Path
    sender: StatusSender
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    epoch_loss: torch.Tensor
    handoff: HandOff
    writer: CheckpointWriter | ShardedWriter | None = None  # open_writer makes it
    _elapsed: Callable[[], float]

    @property
    def _world(self) -> int:
        return self.gang.world if self.gang is not None else 1

    def _progress(self) -> dict[str, Any]:
        """Everything of a checkpoint but the model's and optimizer's state: where training is, its RNG."""
        return {
            "scheduler": self.task.scheduler.state_dict() if self.task.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": self.epoch, "step": self.step, "batch_in_epoch": self.batch_in_epoch,
            "world": self._world, "batch_size": self.pipe.batch_size,  # what batch_in_epoch counts in
            "epoch_loss": float(self.epoch_loss), "epoch_batches": self.epoch_batches,
            "trained_time": self.trained_time + self._elapsed(), "best": self.best,
            "snapshot_seq": self.handoff.seq,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    # its own GPU's only: a gang's rank sees its peers' GPUs too, and must not touch them
                    "cuda": [torch.cuda.get_rng_state(self.device)] if self.device.type == "cuda" else None},
            "pipeline": self.name,
            "params_lr": number(self.pipe.params.get("lr")),  # what a PBT trial taking this file over rescales from
            "trial": dict(self.pipe.trial),  # a sweep trial's values, named when another trial's cannot load it
        }

    def _state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **self._progress()}

    def _load(self) -> tuple[dict[str, Any] | None, Path | None, str]:
        """(state, path, note) of the newest checkpoint; for a sharded gang its weights are loaded already."""
        if not self.sharded:
            state, path, note = ckpt.load_latest(self.ckpt_dir, map_location=self.device,
                                                 trusted=self.pipe.trust_checkpoints)
            if state is not None and (state.get("world", self._world), state.get("batch_size", self.pipe.batch_size)) \
                    != (self._world, self.pipe.batch_size):  # an elastic gang resumed at another size
                self._carry_epoch_over(state, state.get("world", self._world), state.get("batch_size"))
            return state, path, note
        from .sharded_checkpoint import find_latest, load_sharded, written_by

        path = find_latest(self.ckpt_dir)
        if path is None:
            return None, None, ""
        state = load_sharded(path, self.model, self.optimizer, self.pipe.trust_checkpoints)
        wrote = written_by(path)
        if wrote == self._world:
            return state, path, ""
        self._carry_epoch_over(state, wrote)
        return state, path, f"resharded: written by {wrote} ranks, loaded by {self._world}"

    def _carry_epoch_over(self, state: dict[str, Any], wrote: int, batch_size: int | None = None) -> None:
        """A checkpoint of `wrote` ranks (of `batch_size` samples a batch; None: this pipeline's) resumed by this
        gang's: the samples of the epoch trained so far, counted in this gang's batches per rank, and the epoch's
        mean loss kept."""
        samples = state.get("batch_in_epoch", 0) * wrote * (batch_size or self.pipe.batch_size)
        batches = samples // (self._world * self.pipe.batch_size)
        mean = state.get("epoch_loss", 0.0) / max(state.get("epoch_batches", 0), 1)
        state.update(batch_in_epoch=batches, epoch_batches=batches, epoch_loss=mean * batches)

    def resume(self) -> None:
        state, path, note = self._load()
        if note and not self.sharded:
            self.sender.send(Notice(pipeline=self.name, level="warning", text=f"checkpoint: {note}"))
        if state is None:
            return
        # "resharded: ..." (a plain checkpoint's note was warned above)
        if note and path is not None and self.lead and self.sharded:
            self.sender.send(Notice(pipeline=self.name, level="info", text=f"checkpoint {path.name}: {note}"))
        if not self.sharded:
            try:
                self.model.load_state_dict(state["model"])
            except RuntimeError as exc:
                raise RuntimeError(_unfit(exc, path, state.get("trial") or {}, dict(self.pipe.trial))) from None
            self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scheduler") is not None and self.task.scheduler is not None:
            self.task.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler") is not None and self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self._retune_lr(state.get("params_lr"))
        self.epoch, self.step = state["epoch"], state["step"]
        self.batch_in_epoch = state.get("batch_in_epoch", 0)
        self.epoch_loss.fill_(state.get("epoch_loss", 0.0))
        self.epoch_batches = state.get("epoch_batches", 0)
        self.trained_time = state.get("trained_time", 0.0)
        self.best = state.get("best")
        self.handoff.resumed(state.get("snapshot_seq", 0))
        # Loaded onto the training device with everything else; the generators take their states on the CPU.
        rng = state.get("rng") or {}
        if rng.get("torch") is not None:
            torch.set_rng_state(rng["torch"].cpu())
        if rng.get("python") is not None:
            random.setstate(rng["python"])
        if rng.get("cuda") and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"][0].cpu(), self.device)  # the saving GPU's (it saw one, or its own)
        self.sender.send(Resumed(pipeline=self.name, path=str(path), epoch=self.epoch, step=self.step, note=note))
        if self.gang is not None:  # the test of a resumed gang: the weights it stopped with (a collective, sharded)
            total = self.gang.checksum(self.model)
            if self.lead:
                print(f"torchherd: resumed at step {self.step} with weights checksum {total:.10g}", file=sys.stderr,
                      flush=True)

    def _retune_lr(self, saved: float | None) -> None:
        """A checkpoint written under another `params.lr` (a PBT trial took over a better one's): the loaded
        param groups' lr (and a scheduler's base lrs) scaled by the new over the old, so the optimizer trains on
        at the new rate with its state otherwise as saved."""
        new = number(self.pipe.params.get("lr"))
        scale = lr_scale(saved, new)
        if scale is None:
            return
        scale_lrs([self.optimizer], [self.task.scheduler] if self.task.scheduler is not None else [], scale)
        if self.lead:
            self.sender.send(Notice(pipeline=self.name, level="info", text=(
                f"checkpoint written with params.lr {saved:g}: learning rate scaled to params.lr {new:g}")))

    def save(self, reason: str, name: str = ckpt.LAST) -> None:
        """Write checkpoint `name`: rank 0 alone (every rank holds the same weights); or, sharded, every rank its
        shards (a collective: every rank calls it at the same step). Staged and written by a background thread
        unless `async_checkpoints = false`."""
        if not self.lead and not self.sharded:
            return
        landed = partial(self._saved, reason, self.epoch, self.step)
        if isinstance(self.writer, ShardedWriter):
            self.writer.save(name, self.model, self.optimizer, self._progress(), landed, self._save_failed)
            return
        if self.writer is not None:
            self.writer.save(self._state(), name, landed, self._save_failed, self.step)
            return
        start = time.monotonic()
        try:
            if self.sharded:
                from .sharded_checkpoint import save_sharded

                path = save_sharded(self.ckpt_dir, name, self.model, self.optimizer, self._progress(), self.lead,
                                    self._world)
            else:
                path = ckpt.save_checkpoint(self.ckpt_dir, self._state(), name, self.pipe.keep_last)
        except ckpt.CheckpointError as exc:
            self._save_failed(exc)
            return
        took = time.monotonic() - start
        if self.lead:
            landed(path, took, took)

    def _saved(self, reason: str, epoch: int, step: int, path: Path, blocked_s: float, write_s: float) -> None:
        """Tell the supervisor a checkpoint is in place (from the writer thread, for a background write)."""
        self.sender.send(CheckpointSaved(pipeline=self.name, path=str(path), epoch=epoch, step=step, reason=reason,
                                         blocked_s=blocked_s, write_s=write_s))

    def _save_failed(self, exc: ckpt.CheckpointError) -> None:
        # Training goes on; the previous checkpoint is still there.
        if self.lead:
            self.sender.send(Notice(pipeline=self.name, level="error", text=f"checkpoint failed: {exc}",
                                    topic=NoticeTopic.CHECKPOINT_FAILED))

    def open_writer(self) -> None:
        """The background writer of rank 0's checkpoints, or of every rank's shards (a collective: it makes the
        gang's checkpoint group), unless `async_checkpoints = false`."""
        if not self.pipe.async_checkpoints:
            return
        if self.sharded and self.gang is not None:
            self.writer = ShardedWriter(self.ckpt_dir, self.lead, self._world, self.gang.checkpoint_group(),
                                        self.device.type == "cuda", self._say)
        elif self.lead:
            self.writer = CheckpointWriter(self.ckpt_dir, self.pipe.keep_last, self._say)

    def _say(self, text: str) -> None:
        print(f"torchherd: {text}", file=sys.stderr, flush=True)
        self.sender.send(Notice(pipeline=self.name, level="info", text=f"checkpoint: {text}"))

    def wait_for_checkpoint(self) -> None:
        """Hold until the checkpoint being written is in place (a stop, a pause, the end of training)."""
        if self.writer is not None:
            self.writer.wait()

    def close_writer(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()
