"""The Lightning runner: Lightning's own `Trainer.fit` with a torchherd callback.

Every hook, logger, scheduler interval and optimiser setup stays Lightning's.
torchherd sets the Trainer arguments that are its job (limits, precision,
accumulation, the devices, the root dir, no progress bar) and `HerdCallback`
reports steps and epochs, hands snapshots to the validator, beats the heartbeat,
obeys pause/stop/checkpoint-now between batches and writes `.ckpt` files
atomically. The training DataLoader gets `ResumableSampler` (engine/runners/lightning/data.py),
so a resumed epoch trains exactly the samples the stopped one had not.

Lightning is imported only when a run starts: it imports rich, which no engine
module may load at import time (tests/test_boundary.py), and it costs seconds.
"""
from __future__ import annotations

import inspect
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from ...protocol.channel import WorkerExit
from ...protocol.messages import (
    CheckpointSaved,
    EarlyStop,
    EpochEnd,
    Notice,
    Resumed,
    TrainingStarted,
    ValResult,
    WorkerError,
)
from ...protocol.names import NoticeTopic, PipelineKind, ValidationMode
from ...protocol.progress import judge
from ...worker import checkpoint as ckpt
from ...worker.handoff import HandOff, snapshot_meta
from ...worker.reporting import ReportWindow
from ...worker.retune import lr_scale, number, scale_lrs
from ..base import error_text
from . import LightningRunner
from .data import ResumableDistributedSampler, ResumableSampler, resumable
from .ending import end_fit_now, stopped_by_its_own_early_stopping
from .gang import LightningGang, gang_trainer_args
from .logged import logged_on_epoch, logged_on_step
from .support import PREPARED, LightningTask, build_for, monitors_problem, prepare_once, val_monitors

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from ...config.schema import Pipeline, ValidationConfig
    from ...protocol.channel import StatusSender
    from ...protocol.messages import Event
    from ...protocol.spec import WorkerSpec
    from ...worker.control import WorkerControl

LAST, PREV, BEST = (LightningRunner.checkpoint_name(which) for which in ("last", "prev", "best"))
PRECISION: dict[str, Literal["32-true", "bf16-mixed", "16-mixed"]] = {
    "32": "32-true", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}


class HerdHooks:
    """Reports, snapshots, checkpoints and obeys the supervisor from inside Lightning's loop.

    The hooks of `HerdCallback`, which adds Lightning's Callback as a base once Lightning is imported.
    """

    def __init__(self, runner: LightningAttempt):
        self.r = runner
        self.batches = 0  # batches of the current epoch trained
        self.best: float | None = None
        self.since_best = 0  # inline validations since the best, for `patience`
        self.stopping = False
        self.exit_code: int | None = None
        self._step = -1  # global_step at the last report check
        # On the training device from on_train_start; the CPU's until then.
        self._window = ReportWindow(torch.zeros(()))  # the batches since the last step report
        self._epoch_loss = torch.zeros(())  # the epoch's loss sum, kept on the device: no sync per step
        self._epoch_n = 0
        self._epoch_start = 0.0
        self._val_before: dict[str, Any] = {}
        self._val_start = 0.0
        self._saved_lr: object = None  # the params.lr the checkpoint resumed from was written under

    # ----------------------------------------------------- checkpoint state

    def state_dict(self) -> dict[str, Any]:
        s = self.r.sampler
        return {"batches": self.batches, "epoch_seed": s.seed if s else 0, "best": self.best,
                "snapshot_seq": self.r.handoff.seq,
                "params_lr": number(self.r.pipe.params.get("lr"))}  # what a PBT trial taking it over rescales from

    def on_load_checkpoint(self, trainer: pl.Trainer, module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        # A file an older torchherd wrote says its lr only in the module's hyperparameters (load_state_dict,
        # called after this, reads the callback's own record where there is one).
        self._saved_lr = (checkpoint.get("hyper_parameters") or {}).get("lr")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = state.get("batches", 0)
        self.best = state.get("best")
        self.r.handoff.resumed(state.get("snapshot_seq", 0))
        self.r.resume_order = (state.get("epoch_seed", 0), self.batches)
        if "params_lr" in state:
            self._saved_lr = state["params_lr"]

    def _retune_lr(self, trainer: pl.Trainer) -> None:
        """A checkpoint written under another `params.lr` (a PBT trial took over a better one's), its optimizers
        and schedulers restored: every rate scaled by the new over the old, so training goes on at the new rate
        with the optimizers' state and the schedules otherwise as saved."""
        new = number(self.r.pipe.params.get("lr"))
        scale = lr_scale(self._saved_lr, new)
        if scale is None:
            return
        scale_lrs(trainer.optimizers, [c.scheduler for c in trainer.lr_scheduler_configs], scale)
        if trainer.is_global_zero:
            self.r.send(Notice(pipeline=self.r.name, level="info", text=(
                f"checkpoint written with params.lr {self._saved_lr:g}: learning rate scaled to params.lr {new:g}")))

    # ------------------------------------------------------------- hooks

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        r = self.r
        self._retune_lr(trainer)  # Lightning has restored the optimizers and schedulers by now
        (r.dir / PREPARED).touch()  # fit has run prepare_data: later processes of this run skip it
        if r.sampler is not None and r.resume_order is not None:
            seed, batches = r.resume_order
            r.sampler.resume = (trainer.current_epoch, seed, batches * r.batch_size)
        # "runner" in the meta tells the validator to score with Lightning: a factory's LightningTask has
        # no `lightning:` prefix in its config for it to go by.
        r.handoff.open(module, snapshot_meta(r.pipe, r.validation, r.dir, self.best, PipelineKind.LIGHTNING))
        per_epoch = trainer.num_training_batches
        per_epoch = int(per_epoch) if per_epoch != float("inf") else 0
        r.send(TrainingStarted(pipeline=r.name, epoch=trainer.current_epoch, step=trainer.global_step,
                               epochs_total=r.pipe.max_epochs,
                               steps_per_epoch=per_epoch // r.pipe.accumulate_grad_batches,
                               device=str(module.device),
                               parameters=sum(p.numel() for p in module.parameters())))
        self._step = trainer.global_step
        self._window = ReportWindow(torch.zeros((), device=module.device))
        self._epoch_loss = torch.zeros((), device=module.device)
        self._epoch_start = time.monotonic()
        r.obey(trainer, trainer.global_step)

    def on_train_epoch_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.batches = 0
        self._epoch_start = time.monotonic()

    def on_before_backward(self, trainer: pl.Trainer, module: pl.LightningModule, loss: torch.Tensor) -> None:
        self._window.before_backward()  # a gang's rank: its own work is done, DDP's backward waits for peers

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs: object, batch: object,
                           batch_idx: int) -> None:
        r = self.r
        self.batches = batch_idx + 1
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if torch.is_tensor(loss):
            loss = loss.detach()
            self._window.add(loss, r.batch_size)
            self._epoch_loss += loss
            self._epoch_n += 1
        step = trainer.global_step
        if step != self._step:  # an optimizer stepped
            self._step = step
            v = r.validation
            if v.mode == ValidationMode.BACKGROUND and v.every_n_steps and step % v.every_n_steps == 0:
                r.handoff.hand_off(trainer.current_epoch, step)
            if step % r.pipe.log_every_n_steps == 0:
                if r.gang is not None:  # every rank at this step takes rank 0's reading of the commands
                    r.gang.agree(r.control, lambda reason: r.save(trainer, reason))
                if self._window.batches and self._report(trainer, step):
                    return
        r.obey(trainer, step)
        if r.control.take_checkpoint_request():
            r.save(trainer, "request")
        if r.control.should_stop and not self.stopping:
            # Saved here, mid-epoch: once should_stop is set Lightning marks the epoch done,
            # and a checkpoint written after fit() returns would skip the epoch's rest.
            r.save(trainer, "stop")
            self.stopping, trainer.should_stop = True, True
            end_fit_now()

    def _report(self, trainer: pl.Trainer, step: int) -> bool:
        """The step report of the window; True when the NaN policy ends training instead."""
        w, r = self._window, self.r
        names, values = logged_on_step(trainer, w.loss.device)
        synced = torch.stack([w.loss.float(), *values])
        if r.gang is not None:  # the gang's means, so every rank reports (and judges NaN) alike
            synced = r.gang.mean(synced)
        figures = synced.tolist()  # the report's one device sync
        code = w.report(r.control, r.sender, figures[0] / w.batches,
                        f"epoch {trainer.current_epoch + 1} step {step} (step report)", epoch=trainer.current_epoch,
                        step=step, lr=r.lr(trainer), metrics=dict(zip(names, figures[1:])),
                        rank=r.spec.rank if r.gang is not None else None)
        if code is not None:
            self.exit_code, trainer.should_stop = code, True
        return code is not None

    def on_validation_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._val_before = dict(trainer.callback_metrics)
        self._val_start = time.monotonic()

    def on_validation_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: object,
                                **kwargs: object) -> None:
        self.r.control.beat(trainer.global_step)  # a long validation is neither a stall nor a hang

    def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        r = self.r
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if v is not self._val_before.get(k) and (not torch.is_tensor(v) or v.numel() == 1)}
        r.send(ValResult(pipeline=r.name, epoch=trainer.current_epoch, step=trainer.global_step, metrics=metrics,
                         latency=time.monotonic() - self._val_start, mode=ValidationMode.INLINE))
        v = r.validation
        value = metrics.get(v.metric)
        if value is None:
            return
        improved, self.best, self.since_best, stop = judge(value, self.best, self.since_best, v)
        if improved:
            r.save(trainer, "best", BEST)
        if stop:  # the supervisor stops it, saying why
            r.send(EarlyStop(pipeline=r.name, reason=stop))

    def on_train_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if self.stopping or self.exit_code is not None:
            return  # stopped mid-epoch: this epoch is not over, whatever Lightning counts
        r = self.r
        epoch = trainer.current_epoch
        duration = time.monotonic() - self._epoch_start
        if r.gang is not None:
            self._epoch_loss = r.gang.mean(self._epoch_loss)
        train_loss = float(self._epoch_loss) / max(self._epoch_n, 1)
        if self._epoch_n:
            code = r.control.non_finite(train_loss, f"epoch {epoch + 1} (epoch mean)")
            if code is not None:
                self.exit_code, trainer.should_stop = code, True
                return
        self._epoch_loss.zero_()
        self._epoch_n = 0
        v = r.validation
        if v.mode == ValidationMode.BACKGROUND and (epoch + 1) % v.every_n_epochs == 0:
            r.handoff.hand_off(epoch, trainer.global_step)
        per_epoch = trainer.num_training_batches
        per_epoch = int(per_epoch) if per_epoch != float("inf") else 0
        r.send(EpochEnd(pipeline=r.name, epoch=epoch, step=trainer.global_step, train_loss=train_loss,
                        duration=duration, samples_per_s=self.batches * r.batch_size * r.world / max(duration, 1e-9),
                        epochs_total=r.pipe.max_epochs,
                        steps_per_epoch=per_epoch // r.pipe.accumulate_grad_batches,
                        metrics=logged_on_epoch(trainer)))
        self.batches = 0  # the checkpoint below starts the next epoch from its first batch
        if (epoch + 1) % r.pipe.checkpoint_every_n_epochs == 0 or epoch + 1 >= r.pipe.max_epochs:
            r.save(trainer, "epoch", epoch=epoch + 1)  # (Lightning counts this epoch done once the hook returns)


class LightningAttempt:
    """One attempt of a Lightning pipeline in this process; `run()` returns the exit code."""

    def __init__(self, spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
                 control: WorkerControl):
        self.spec, self.pipe, self.validation = spec, pipe, validation
        self.sender, self.control = sender, control
        self.name = pipe.name
        self.dir = Path(spec.pipeline_dir)
        self.ckpt_dir = self.dir / "checkpoints"
        self.handoff = HandOff(self.name, sender, validation, Path(spec.snapshot_dir) if spec.snapshot_dir else None,
                               spec.snapshot_seq)  # snapshot numbers keep rising across attempts
        self.sampler: ResumableSampler | ResumableDistributedSampler | None = None
        self.resume_order: tuple[int, int] | None = None
        self.batch_size = 1
        self.saved_step = -1  # global_step of the newest `last` checkpoint
        self.gang = LightningGang(spec) if spec.world_size > 1 else None
        self.world = spec.world_size

    def send(self, event: Event) -> None:
        self.sender.send(event)

    @staticmethod
    def lr(trainer: pl.Trainer) -> float:
        return float(trainer.optimizers[0].param_groups[0]["lr"]) if trainer.optimizers else 0.0

    def obey(self, trainer: pl.Trainer, step: int) -> None:
        """Between batches: beat, and alone obey the supervisor (a gang's ranks obey together, at agreements)."""
        if self.gang is None:
            self.control.between_steps(step, lambda reason: self.save(trainer, reason))
        else:
            self.control.beat(step)

    def save(self, trainer: pl.Trainer, reason: str, name: str = LAST, epoch: int | None = None) -> None:
        """Checkpoint (a gang's rank 0 writes what every rank holds; FSDP's ranks gather it together). `epoch`:
        the epochs it has trained, as its CheckpointSaved says (as a Task's does: PBT judges by it whether the
        checkpoint has training left in it); Lightning's current epoch unless an epoch is ending."""
        if name == LAST:
            self.saved_step = trainer.global_step
        if not trainer.is_global_zero and self.pipe.strategy not in ("fsdp", "deepspeed"):  # theirs is a collective
            return
        try:
            state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            if not trainer.is_global_zero:
                return
            path = ckpt.save_checkpoint(self.ckpt_dir, state, name, self.pipe.keep_last)
        except ckpt.CheckpointError as exc:
            self.send(Notice(pipeline=self.name, level="error", text=f"checkpoint failed: {exc}",
                             topic=NoticeTopic.CHECKPOINT_FAILED))
            return
        self.send(CheckpointSaved(pipeline=self.name, path=str(path),
                                  epoch=trainer.current_epoch if epoch is None else epoch, step=trainer.global_step,
                                  reason=reason))

    def _wrap_train_loader(self, task: LightningTask) -> None:
        """Give the training DataLoader a ResumableSampler, wherever it comes from."""
        source = task.datamodule if task.datamodule is not None else task.module
        original = source.train_dataloader

        def train_dataloader() -> object:  # the user's loader, whatever it is
            loader, self.sampler = resumable(original(), self.spec.rank, self.world)
            self.batch_size = getattr(loader, "batch_size", None) or 1
            if self.sampler is None:
                self.send(Notice(pipeline=self.name, level="warning", text=(
                    "the training data is not a DataLoader with a plain random or sequential sampler: "
                    "a resumed epoch starts from its beginning")))
            return loader

        source.train_dataloader = train_dataloader

    def trainer_args(self, task: LightningTask, callback: HerdHooks) -> dict[str, Any]:
        from lightning.pytorch.callbacks import ModelCheckpoint

        pipe, v = self.pipe, self.validation
        args = dict(task.trainer_args)
        args.setdefault("enable_checkpointing", any(isinstance(c, ModelCheckpoint) for c in task.callbacks))
        args.update(max_epochs=pipe.max_epochs, max_steps=pipe.max_steps or -1,
                    precision=PRECISION[pipe.precision], accumulate_grad_batches=pipe.accumulate_grad_batches,
                    accelerator="gpu" if self.spec.device.startswith("cuda") else "cpu", devices=1,
                    default_root_dir=str(self.dir), enable_progress_bar=False,
                    log_every_n_steps=pipe.log_every_n_steps, callbacks=[*task.callbacks, callback])
        if self.gang is not None:
            args.update(gang_trainer_args(self.spec, pipe.strategy))
        if pipe.max_time is not None:
            args["max_time"] = timedelta(seconds=pipe.max_time)
        if v.mode == ValidationMode.INLINE:
            args["check_val_every_n_epoch"] = v.every_n_epochs
            args.setdefault("num_sanity_val_steps", 0)
        else:  # background or off: the worker never runs validation_step
            args["limit_val_batches"] = 0
            args["num_sanity_val_steps"] = 0
        return args

    def _latest(self) -> Path | None:
        """The checkpoint this attempt resumes from, announced (CheckpointRefused: one not to be loaded)."""
        state, path, note = ckpt.load_latest(self.ckpt_dir, suffix=LightningRunner.checkpoint_suffix,
                                             required="state_dict", trusted=self.pipe.trust_checkpoints)
        if note:
            self.send(Notice(pipeline=self.name, level="warning", text=f"checkpoint: {note}"))
        if state is not None and path is not None:
            self.send(Resumed(pipeline=self.name, path=str(path), epoch=state.get("epoch", 0),
                              step=state.get("global_step", 0), note=note))
        return path

    def run(self, task: LightningTask | None = None) -> int:
        """Train; `task` is one a `task = "file.py:build"` factory already built (else it is built here)."""
        import lightning.pytorch as pl

        from ..task.api import TaskError

        if task is not None:
            # The worker seeded torch before the factory ran, as seed_everything does before a
            # `lightning:` module is built; seed the rest the same way but leave torch's generator
            # where building left it, so both ways train the same run.
            with torch.random.fork_rng(devices=[]):
                pl.seed_everything(self.pipe.seed, verbose=False)
        else:
            pl.seed_everything(self.pipe.seed, verbose=False)
            try:
                task = build_for(self.pipe)
            except TaskError as exc:
                print(f"torchherd: {exc}", file=sys.stderr)
                self.send(WorkerError(pipeline=self.name, error=error_text(str(exc)), where="build",
                                      traceback=traceback.format_exc()))
                return WorkerExit.FATAL
        if self.validation.mode == ValidationMode.BACKGROUND:
            found = val_monitors(task, with_optimizers=False)
            if found:
                text = monitors_problem(found)
                self.send(WorkerError(pipeline=self.name, error=text, where="build"))
                return WorkerExit.FATAL
        prepare_once(task, self.dir)
        self._wrap_train_loader(task)
        try:
            path = self._latest()
        except ckpt.CheckpointRefused as exc:  # no restart makes it safe: the pipeline fails, saying why
            self.send(WorkerError(pipeline=self.name, error=f"CheckpointRefused: {exc}", where="checkpoint"))
            return WorkerExit.FATAL
        callback = herd_callback(self)
        try:
            args = self.trainer_args(task, callback)
        except ValueError as exc:  # a gang Lightning cannot train (engine/runners/lightning/gang.py)
            self.send(WorkerError(pipeline=self.name, error=str(exc), where="build"))
            return WorkerExit.FATAL
        trainer = pl.Trainer(**args)
        # Lightning loads the file as _latest checked it (2.5+ takes weights_only; before, only _latest's check)
        safety = {"weights_only": not self.pipe.trust_checkpoints} \
            if "weights_only" in inspect.signature(trainer.fit).parameters else {}
        try:
            trainer.fit(task.module, datamodule=task.datamodule, ckpt_path=str(path) if path else None, **safety)
            if callback.exit_code is None and not callback.stopping and not trainer.interrupted:
                self.handoff.finish(alive=lambda: self.control.beat(trainer.global_step))
        finally:
            self.handoff.close()  # the last snapshot's copy may still be running
        return self._fitted(trainer, callback, task)

    def _fitted(self, trainer: pl.Trainer, callback: HerdHooks, task: LightningTask) -> int:
        """Once Trainer.fit has returned: what is left to save and say, and the worker's exit code."""
        if callback.exit_code is not None:
            return callback.exit_code
        if trainer.interrupted:  # a KeyboardInterrupt Lightning caught: nothing finished
            return WorkerExit.STOPPED
        if not callback.stopping and self.saved_step != trainer.global_step:  # ended mid-epoch (max_steps, ...)
            self.save(trainer, "final")
        if self.gang is not None:  # stopped or done, every rank at the same step
            self.gang.finish(task.module, trainer.global_step)
        if not callback.stopping and (why := stopped_by_its_own_early_stopping(trainer)) is not None:
            # An early stop, not "trained to its limits": said before this exit, which the supervisor reads after it.
            self.send(EarlyStop(pipeline=self.name, reason=why))
            return WorkerExit.STOPPED
        return WorkerExit.STOPPED if callback.stopping else WorkerExit.COMPLETED


def herd_callback(runner: LightningAttempt) -> HerdHooks:
    """A Lightning Callback with HerdHooks' hooks, for `runner`."""
    import lightning.pytorch as pl

    cls = type("HerdCallback", (HerdHooks, pl.Callback), {"__doc__": HerdHooks.__doc__})
    callback: HerdHooks = cls(runner)
    return callback


def run_lightning(spec: WorkerSpec, pipe: Pipeline, validation: ValidationConfig, sender: StatusSender,
                  control: WorkerControl, task: LightningTask | None = None) -> int:
    """The runner for `task = "lightning:..."` pipelines (engine/runners/lightning/__init__.py), and for a
    `task = "file.py:build"` whose factory returned the LightningTask `task`."""
    return LightningAttempt(spec, pipe, validation, sender, control).run(task)
