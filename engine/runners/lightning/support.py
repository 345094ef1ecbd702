"""Lightning modules as torchherd tasks: `LightningTask`, building one from a config, and its checks.

`build_lightning(pipe)` turns `task = "lightning:file.py:Class"` (with an optional
`datamodule`) or a factory returning `LightningTask` into a built task; the worker
(engine/runners/lightning/runner.py) and the validator (engine/runners/lightning/scorer.py) both
call it in fresh processes. `build_factory` builds a plain `task = "file.py:build"`,
whose factory may return either a `Task` or a `LightningTask`. Importing this module
loads neither torch nor Lightning.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ...config.schema import Pipeline

PREFIX = "lightning:"
MISSING = 'Lightning is not installed: pip install "torchherd[lightning]"'
PREPARED = ".prepare_data.done"  # in the pipeline folder: prepare_data already ran for this run


@dataclass
class LightningTask:
    """A LightningModule to train under torchherd, with what plain Lightning would be given.

    `datamodule` is optional (without it the module's own *_dataloader methods are
    used); `callbacks` are passed to Lightning's Trainer; `trainer_args` are further
    Trainer keyword arguments, except those torchherd owns (limits, precision,
    accumulation, devices, root dir, progress bar), which the config sets.
    """

    module: Any  # lightning.pytorch.LightningModule
    datamodule: Any = None  # lightning.pytorch.LightningDataModule
    callbacks: list[Any] = field(default_factory=list)
    trainer_args: dict[str, Any] = field(default_factory=dict)


# Trainer arguments torchherd sets from the config; a task's trainer_args may not set them.
OWNED_ARGS = ("max_epochs", "max_steps", "max_time", "precision", "accumulate_grad_batches", "accelerator",
              "devices", "num_nodes", "strategy", "default_root_dir", "enable_progress_bar",
              "limit_val_batches", "check_val_every_n_epoch", "log_every_n_steps")


def lightning_installed() -> bool:
    """Whether Lightning can be imported, found without importing it (that costs seconds)."""
    return importlib.util.find_spec("lightning") is not None


def _load_attr(ref: str) -> Callable[..., object]:
    """The object `file.py:Name` or `package.module:Name` names (a class or a factory)."""
    from ..task.api import TaskError, load_callable

    try:
        return load_callable(ref)
    except TaskError:
        raise
    except Exception as exc:  # pragma: no cover - load_callable reports its own failures
        raise TaskError(f"cannot load {ref}: {type(exc).__name__}: {exc}") from exc


def _construct(ref: str, obj: Callable[..., object], params: dict[str, Any], what: str) -> Any:
    from ..task.api import TaskError

    try:
        return obj(**params)
    except TypeError as exc:
        try:
            accepted = ", ".join(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            accepted = "?"
        raise TaskError(f"{what} {ref}({', '.join(params)}) raised TypeError: {exc} "
                        f"(its constructor takes: {accepted or 'nothing'})") from exc
    except Exception as exc:
        raise TaskError(f"{what} {ref} raised {type(exc).__name__}: {exc}") from exc


def build_lightning(ref: str, params: dict[str, Any], datamodule: str = "",
                    datamodule_params: dict[str, Any] | None = None) -> LightningTask:
    """Build the LightningTask a pipeline names; raises TaskError saying what is wrong."""
    from ..task.api import TaskError, call_factory

    if not lightning_installed():
        raise TaskError(MISSING)
    import lightning.pytorch as pl

    ref = ref.removeprefix(PREFIX)
    obj = _load_attr(ref)
    task: LightningTask | None
    if inspect.isclass(obj):
        if not issubclass(obj, pl.LightningModule):
            raise TaskError(f"{ref} is a class but not a LightningModule")
        task = LightningTask(module=_construct(ref, obj, dict(params), "LightningModule"))
    else:
        built = call_factory(ref, params, obj)
        task = as_lightning_task(built)
        if task is None:
            raise TaskError(f"task factory {ref} returned {type(built).__name__}; it must return "
                            "torchherd.LightningTask(...) or a LightningModule")
    return _checked(ref, task, datamodule, datamodule_params)


def as_lightning_task(obj: object) -> LightningTask | None:
    """What a factory returned, as a LightningTask if it is one (or a bare LightningModule); else None.

    Imports nothing: a factory that built a LightningModule has imported Lightning already.
    """
    if isinstance(obj, LightningTask):
        return obj
    pl = sys.modules.get("lightning.pytorch")
    if pl is not None and isinstance(obj, pl.LightningModule):
        return LightningTask(module=obj)
    return None


def build_factory(ref: str, params: dict[str, Any]) -> Any:
    """What the factory of `task = "file.py:build"` builds: a checked Task, or a checked LightningTask.

    The config decides a pipeline's kind before any user code runs, so a factory that returns
    `torchherd.LightningTask` makes a "task" pipeline until it has run: the worker and the probe
    build through here (the factory runs once) and hand a LightningTask to the Lightning side.
    """
    from ..task.api import call_factory, check_task

    built = call_factory(ref, params)
    task = as_lightning_task(built)
    if task is not None:
        return _checked(ref, task, "", None)
    return check_task(ref, built, instead="for a LightningModule, torchherd.LightningTask(...)")


def _checked(ref: str, task: LightningTask, datamodule: str, datamodule_params: dict[str, Any] | None
             ) -> LightningTask:
    """`task` with the config's DataModule, if it names one, once both are what Lightning needs."""
    import lightning.pytorch as pl

    from ..task.api import TaskError

    if not isinstance(task.module, pl.LightningModule):
        raise TaskError(f"{ref}: module is {type(task.module).__name__}, not a LightningModule")
    if datamodule:
        dm_cls = _load_attr(datamodule)
        task.datamodule = _construct(datamodule, dm_cls, dict(datamodule_params or {}), "DataModule")
    if task.datamodule is not None and not isinstance(task.datamodule, pl.LightningDataModule):
        raise TaskError(f"datamodule is {type(task.datamodule).__name__}, not a LightningDataModule")
    owned = sorted(set(task.trainer_args) & set(OWNED_ARGS))
    if owned:
        raise TaskError(f"trainer_args sets {', '.join(owned)}, which the torchherd config controls "
                        "(set them in the config instead)")
    return task


def build_for(pipe: Pipeline) -> LightningTask:
    """`build_lightning` from a Pipeline's settings."""
    ref = cast(str, pipe.task_ref or pipe.task)  # a Lightning pipeline's config names its task (the loader checks)
    return build_lightning(ref, pipe.params, pipe.datamodule, pipe.datamodule_params)


def prepare_once(task: LightningTask, pipeline_dir: Path) -> None:
    """Make `prepare_data` a no-op in this process if an earlier process of the run already ran it.

    Lightning calls it in every process that fits or validates; it downloads or
    writes files, so once per run is enough. The worker marks it done after fit
    has called it (see lightning_runner); the validator always skips it.
    """
    if not (pipeline_dir / PREPARED).exists():
        return
    for obj in (task.module, task.datamodule):
        if obj is not None:
            obj.prepare_data = _noop


def _noop() -> None:
    return None


# ----------------------------------------------------------- validation monitors


def val_monitors(task: LightningTask, with_optimizers: bool = True) -> list[str]:
    """What inside the worker watches a validation metric ('EarlyStopping monitors val_loss', ...).

    In background validation the worker never computes those metrics, so each would
    raise or silently never act. Optimizers are asked for only with `with_optimizers`
    (configure_optimizers may need a fitting Trainer; a failure there counts as none).
    """
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    found = []
    for cb in task.callbacks:
        monitor = getattr(cb, "monitor", None)
        if isinstance(cb, (EarlyStopping, ModelCheckpoint)) and _is_val(monitor):
            found.append(f"{type(cb).__name__} monitors {monitor!r}")
    if with_optimizers:
        try:
            config = task.module.configure_optimizers()
        except Exception:
            config = None
        found += [f"ReduceLROnPlateau monitors {m!r}" for m in _plateau_monitors(config) if _is_val(m)]
    return found


def _is_val(monitor: object) -> bool:
    """A metric name only validation logs ('val_loss', 'val/acc', 'valid_f1')."""
    return isinstance(monitor, str) and monitor.lower().startswith("val")


def _plateau_monitors(config: object) -> list[str]:
    import torch

    items = config if isinstance(config, (list, tuple)) else [config]
    out = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out += _plateau_monitors(list(item))
            continue
        if not isinstance(item, dict):
            continue
        sched = item.get("lr_scheduler")
        monitor = item.get("monitor", "val_loss")
        if isinstance(sched, dict):
            monitor = sched.get("monitor", monitor)
            sched = sched.get("scheduler")
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            out.append(monitor)
    return out


def monitors_problem(found: list[str]) -> str:
    """The message for val-metric monitors under background validation."""
    return (f"{'; '.join(found)}, but with background validation the worker never computes validation "
            "metrics: use [validation] metric and patience (early stopping and the best checkpoint are "
            "kept by the validator), or set [validation] mode = \"inline\"")
