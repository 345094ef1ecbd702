"""The training loop a worker runs: epochs of optimizer steps, reports, checkpoints, commands.

`Trainer` builds nothing itself: it takes a built `Task`, the pipeline's settings
and the two pipe ends, and trains until its limits, a Stop, or an error.
"""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...config.schema import Pipeline, ValidationConfig
from ...protocol.channel import StatusSender, WorkerExit
from ...protocol.messages import EarlyStop, EpochEnd, Notice, TrainingStarted, ValResult, WorkerError
from ...protocol.names import PipelineKind, ValidationMode
from ...protocol.progress import judge
from ...worker import checkpoint as ckpt
from ...worker.control import WorkerControl
from ...worker.data import make_loader
from ...worker.evaluate import evaluate
from ...worker.handoff import HandOff, snapshot_meta
from ...worker.precision import autocast, grad_scaler
from ...worker.reporting import ReportWindow
from .api import Task
from .sharded import FullWeights, local_numel, optimizer_over

if TYPE_CHECKING:
    from .distributed import Gang
from .state import TrainerCheckpoints


class LossError(Exception):
    """The task's loss_fn raised; the message names what it was given."""


def _shape(value: object) -> str:
    if torch.is_tensor(value):
        return f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    return type(value).__name__


def describe_loss_failure(exc: Exception, outputs: object, targets: object) -> str:
    """'loss_fn(outputs, targets) raised ...; outputs float32 [32, 3], targets float32 [32, 1]'."""
    return (f"loss_fn(outputs, targets) raised {type(exc).__name__}: {exc}; "
            f"outputs {_shape(outputs)}, targets {_shape(targets)}")


class Trainer(TrainerCheckpoints):
    """Trains one pipeline in this process; `run()` returns the worker's exit code."""

    def __init__(self, task: Task, pipe: Pipeline, validation: ValidationConfig, device: str,
                 pipeline_dir: Path, sender: StatusSender, control: WorkerControl,
                 snapshot_dir: Path | None = None, snapshot_seq: int = 0, gang: Gang | None = None) -> None:
        if task.val_data is None and validation.mode != ValidationMode.OFF:
            # Nothing to score: no snapshot is handed to the validator, so the run never waits for its results.
            validation = validation.model_copy(update={"mode": ValidationMode.OFF})
        self.task, self.pipe, self.validation = task, pipe, validation
        self.gang = gang  # engine.distributed.Gang for a rank of a gang, else None
        self.lead = gang is None or gang.lead  # it alone checkpoints, validates and reports for the gang
        self.sharded = gang is not None and gang.sharded  # fsdp: each rank holds a shard of the weights
        self._time_up = False  # a gang's verdict on max_time, from rank 0 at the last agreement
        self.device = torch.device(device)
        self.dir = pipeline_dir
        self.ckpt_dir = pipeline_dir / "checkpoints"
        self.sender, self.control = sender, control
        self.name = pipe.name
        self.epoch = 0  # the epoch being trained (0-based)
        self.step = 0  # optimizer steps so far, all epochs
        self.batch_in_epoch = 0  # micro-batches of `epoch` already trained
        self.trained_time = 0.0  # seconds of training in earlier attempts
        self.best: float | None = None
        self.since_best = 0  # inline validations since the best, for `patience`
        self.epoch_loss = torch.zeros((), device=self.device)
        self.epoch_batches = 0
        self._start: float | None = None  # monotonic time training began in this attempt

        # A sharded model's mixed precision is FSDP2's own policy (engine/runners/task/sharded.py)
        self.autocast = autocast(self.device, "32" if self.sharded else pipe.precision)
        self.scaler = grad_scaler(self.device, pipe.precision, sharded=self.sharded)
        self.non_blocking = self.device.type == "cuda" and pipe.pin_memory
        self.model = task.model.to(self.device)
        names = {id(p): n for n, p in self.model.named_parameters()}  # before sharding replaces the parameters
        self.ddp = gang.wrap(self.model, task.shard, pipe) if gang is not None else None
        forward = self.ddp if self.ddp is not None else self.model
        self.train_model = torch.compile(forward) if pipe.compile else forward
        self.optimizer = optimizer_over(task.optimizer, self.model, names)
        if task.scheduler is not None and not hasattr(task.scheduler, "state_dict"):
            task.scheduler = task.scheduler(self.optimizer)  # a function of the optimizer, made now
        self.train_loader, self.sampler = make_loader(task.train_data, pipe, self.device, shuffle=True,
                                                      rank=gang.rank if gang else 0, world=gang.world if gang else 1)
        if gang is not None and self.sampler is None and gang.lead:
            self.sender.send(Notice(pipeline=self.name, level="warning", text=(
                "the task's train_data is not a Dataset, so torchherd cannot shard it: every rank trains on "
                "all of it; return a Dataset to split it between ranks")))
        self.val_loader = make_loader(task.val_data, pipe, self.device, shuffle=False)[0] \
            if task.val_data is not None and (self.lead or self.sharded) else None
        # Snapshot seqs keep rising across restarts: a resumed worker may hand off after
        # its checkpoint what an earlier attempt already handed off under the same numbers.
        self.handoff = HandOff(self.name, sender, validation, snapshot_dir, snapshot_seq)
        v = validation
        self._step_handoff = v.every_n_steps if v.mode == ValidationMode.BACKGROUND and v.every_n_steps else 0
        self.window = ReportWindow(self.epoch_loss.new_zeros(()))  # the steps since the last report (_start_training)
        self.full: FullWeights | None = None  # a sharded gang's whole weights, gathered for the validator

    # ------------------------------------------------------------ data

    def _batches_per_epoch(self) -> int:
        try:
            return len(self.train_loader)
        except TypeError:
            return 0

    def _epoch_batches(self) -> Iterator[Sequence[torch.Tensor]]:
        if self.sampler is not None:
            self.sampler.set_epoch(self.epoch, self.batch_in_epoch * self.pipe.batch_size)
            return iter(self.train_loader)
        return islice(iter(self.train_loader), self.batch_in_epoch, None)

    # ---------------------------------------------------------- control

    def _between_steps(self) -> None:
        """Obey commands (holding here while paused); cheap when nothing is waiting.

        A gang's ranks obey together at report steps, where rank 0's reading is broadcast.
        """
        if self.gang is None:
            self.control.between_steps(self.step, self.save)
        else:
            self.control.beat(self.step)
            if self.step % self.pipe.log_every_n_steps == 0:
                self._time_up = self.gang.agree(self.control, self.save, self._past_max_time)
        if self.control.take_checkpoint_request():
            self.save("request")

    def _elapsed(self) -> float:
        return time.monotonic() - self._start - self.control.paused_time if self._start is not None else 0.0

    # ------------------------------------------------------------- train

    def _report_mean(self, window_loss: torch.Tensor, window_batches: int) -> float:
        """The mean loss since the last report (over every rank of a gang: one all-reduce per report).

        A gang also makes its epoch sums the same on every rank here, so a checkpoint taken at a
        report step (rank 0's) holds the whole gang's and a resumed epoch's mean is exact.
        """
        if self.gang is None:
            return float(window_loss) / window_batches
        both = self.gang.mean(torch.stack([window_loss, self.epoch_loss]))
        self.epoch_loss.copy_(both[1])
        return float(both[0]) / window_batches

    def _across_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """`value`, averaged over a gang's ranks (a collective: at report steps only)."""
        return self.gang.mean(value) if self.gang is not None else value

    def _out_of_budget(self) -> bool:
        if self.pipe.max_steps is not None and self.step >= self.pipe.max_steps:
            return True
        if self.gang is not None:
            return self._time_up  # clocks differ between ranks: rank 0's verdict, agreed
        return self._past_max_time()

    def _past_max_time(self) -> bool:
        return self.pipe.max_time is not None and self.trained_time + self._elapsed() >= self.pipe.max_time

    def _where(self, what: str) -> str:
        return f"epoch {self.epoch + 1} step {self.step} ({what})"

    def run(self) -> int:
        try:
            code = self._run()
            self.close_writer()  # the worker ends once its last checkpoint is in place, not before
            return code
        finally:
            if self.writer is not None:  # an error ends training: what was being written still lands
                with contextlib.suppress(Exception):
                    self.close_writer()
            self.handoff.close()  # the last snapshot's copy may still be running

    def _run(self) -> int:
        try:
            self.resume()
        except ckpt.CheckpointRefused as exc:  # no restart makes it safe: the pipeline fails, saying why
            self.sender.send(WorkerError(pipeline=self.name, error=f"CheckpointRefused: {exc}", where="checkpoint"))
            return WorkerExit.FATAL
        per_epoch = self._batches_per_epoch()
        steps_per_epoch = per_epoch // self.pipe.accumulate_grad_batches if per_epoch else 0
        self._start_training(steps_per_epoch)
        while self.epoch < self.pipe.max_epochs and not self.control.should_stop and not self._out_of_budget():
            code, finished = self._train_epoch(steps_per_epoch)
            if code is not None:
                return code
            if not finished:
                break  # stopped or out of budget mid-epoch
        return self._finish()

    def _start_training(self, steps_per_epoch: int) -> None:
        self.open_writer()
        # The slots are set up before training starts: allocated once, not at a hand-off.
        if self.sharded and self.validation.mode == ValidationMode.BACKGROUND:  # every rank: a collective
            self.full = FullWeights(self.model)
        self.handoff.open(self.full or self.model, snapshot_meta(self.pipe, self.validation, self.dir, self.best,
                                                    PipelineKind.TASK))
        self.sender.send(TrainingStarted(pipeline=self.name, epoch=self.epoch, step=self.step,
                                         epochs_total=self.pipe.max_epochs, steps_per_epoch=steps_per_epoch,
                                         device=str(self.device),
                                         parameters=sum(p.numel() for p in self.model.parameters())))
        self._start = time.monotonic()
        self.model.train()
        self.window = ReportWindow(torch.zeros((), device=self.device))
        self._between_steps()

    def _train_epoch(self, steps_per_epoch: int) -> tuple[int | None, bool]:
        """Train the epoch (or the rest of it, resumed); (an exit code, whether the epoch ran to its end)."""
        epoch_start = time.monotonic()
        epoch_samples = 0
        for batch in self._epoch_batches():
            epoch_samples += self._train_batch(batch)
            if self.batch_in_epoch % self.pipe.accumulate_grad_batches:
                continue
            code = self._optimizer_step()
            if code is not None:
                return code, False
            self._between_steps()
            if self.control.should_stop or self._out_of_budget():
                return None, False
        return self._end_epoch(epoch_start, epoch_samples, steps_per_epoch), True

    def _train_batch(self, batch: Sequence[torch.Tensor]) -> int:
        """Forward and backward one micro-batch; returns its number of samples."""
        inputs, targets = batch
        inputs = inputs.to(self.device, non_blocking=self.non_blocking)
        targets = targets.to(self.device, non_blocking=self.non_blocking)
        accum = self.pipe.accumulate_grad_batches
        # Micro-batches before the optimizer step keep their gradients local: one all-reduce a step.
        last = (self.batch_in_epoch + 1) % accum == 0
        if self.sharded:
            self.model.set_requires_gradient_sync(last)  # type: ignore[operator]  # fully_shard made it an FSDPModule
        sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
        with sync:
            with self.autocast():
                outputs = self.train_model(inputs)
                try:
                    loss = self.task.loss_fn(outputs, targets)
                except Exception as exc:
                    raise LossError(describe_loss_failure(exc, outputs, targets)) from exc
            scaled = loss / accum if accum > 1 else loss
            self.window.before_backward()
            if self.scaler is not None:
                self.scaler.scale(scaled).backward()
            else:
                scaled.backward()
        detached = loss.detach()
        # Loss sums stay on the device: no sync per step, one .item() per report.
        self.window.add(detached, len(targets))
        self.epoch_loss += detached
        self.epoch_batches += 1
        self.batch_in_epoch += 1
        return len(targets)

    def _optimizer_step(self) -> int | None:
        """Step the optimizer, hand off and report when due; the exit code the NaN policy asks for, or None."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self._step_handoff and self.step % self._step_handoff == 0:
            self._hand_off(self.epoch)
        if self.step % self.pipe.log_every_n_steps:
            return None
        mean = self._report_mean(self.window.loss, self.window.batches)
        return self.window.report(self.control, self.sender, mean, self._where("step report"), epoch=self.epoch,
                                  step=self.step, lr=float(self.optimizer.param_groups[0]["lr"]), world=self._world,
                                  rank=self.gang.rank if self.gang is not None else None)

    def _finish(self) -> int:
        """The attempt's last checkpoint ("stop" or "final"); returns the exit code."""
        self.trained_time += self._elapsed()
        self._start = None
        if self.gang is not None:  # the test of a gang: every rank ends with the same weights
            print(f"torchherd: rank {self.gang.rank} step {self.step} weights checksum "
                  f"{self.gang.checksum(self.model):.10g} ({local_numel(self.model)} parameters held)",
                  file=sys.stderr, flush=True)
        stopped = self.control.should_stop
        self.save("stop" if stopped else "final")
        if not stopped:
            self.handoff.finish(alive=lambda: self.control.beat(self.step))
        self.wait_for_checkpoint()  # before a gang's barrier: its ranks ending would start the linger clock
        if self.gang is not None:
            # No rank ends while rank 0 still validates or saves: an early exit would start the gang's
            # linger clock, and rank 0 could be ended before its last checkpoint.
            self.gang.barrier()
        return WorkerExit.STOPPED if stopped else WorkerExit.COMPLETED

    def _end_epoch(self, epoch_start: float, samples: int, steps_per_epoch: int) -> int | None:
        duration = time.monotonic() - epoch_start
        train_loss = float(self._across_ranks(self.epoch_loss)) / max(self.epoch_batches, 1)
        code = self.control.non_finite(train_loss, self._where("epoch mean"))
        if code is not None:
            return code
        if self.task.scheduler is not None:
            self.task.scheduler.step()
        finished = self.epoch
        self.epoch += 1
        self.batch_in_epoch = 0
        self.epoch_loss.zero_()
        self.epoch_batches = 0
        self._validate(finished)  # inline: its result goes out before the epoch's end
        rate = samples * self._world / max(duration, 1e-9)
        self.sender.send(EpochEnd(pipeline=self.name, epoch=finished, step=self.step, train_loss=train_loss,
                                  duration=duration, samples_per_s=rate,
                                  epochs_total=self.pipe.max_epochs, steps_per_epoch=steps_per_epoch))
        # The log (`l` in the app) tells the story too, not only events.jsonl.
        print(f"torchherd: epoch {finished + 1}/{self.pipe.max_epochs} done at step {self.step}: train loss "
              f"{train_loss:.6g}, {duration:.1f} s, {rate:,.0f} samples/s", flush=True)
        if self.epoch % self.pipe.checkpoint_every_n_epochs == 0 or self.epoch >= self.pipe.max_epochs:
            self.save("epoch")
        return None

    # --------------------------------------------------------- validate

    def _validate(self, epoch: int) -> None:
        """Validate at an epoch's end: inline here, or by handing a snapshot to the validator."""
        v = self.validation
        if v.mode == ValidationMode.OFF or (epoch + 1) % v.every_n_epochs or not (self.lead or self.sharded):
            return  # a sharded gang's ranks all take part: gathering its weights, or its forward, is a collective
        if v.mode == ValidationMode.BACKGROUND:
            self._hand_off(epoch)
            return
        if self.val_loader is None:
            return
        start = time.monotonic()
        metrics = evaluate(self.model, self.val_loader, self.task.loss_fn, self.task.metrics_fn, self.device,
                           self.autocast, self.non_blocking, alive=lambda: self.control.beat(self.step))
        if not self.lead:  # a sharded gang's other ranks scored the same weights, to the same metrics
            self._judge(metrics)
            return
        self.sender.send(ValResult(pipeline=self.name, epoch=epoch, step=self.step, metrics=metrics,
                                   latency=time.monotonic() - start, mode=ValidationMode.INLINE))
        shown = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        print(f"torchherd: validated epoch {epoch + 1}: {shown}", flush=True)
        self._judge(metrics)

    def _judge(self, metrics: dict[str, float]) -> None:
        """Keep the best checkpoint and ask for an early stop, by an inline validation's `metrics`."""
        value = metrics.get(self.validation.metric)
        if value is None:
            return
        improved, self.best, self.since_best, stop = judge(value, self.best, self.since_best, self.validation)
        if improved:
            self.save("best", ckpt.BEST)
        if stop and self.lead:  # the supervisor stops it, saying why
            self.sender.send(EarlyStop(pipeline=self.name, reason=stop))

    def _hand_off(self, epoch: int) -> None:
        """Hand the weights to the validator: a sharded gang's are gathered to rank 0 first, by every rank."""
        if self.full is not None:
            self.full.gather()
        if self.lead:
            self.handoff.hand_off(epoch, self.step)
