"""The task API: what a user's factory returns (`Task`) and how torchherd finds and builds it.

A task is one Python callable, `build(params) -> Task`, named in the config as a
built-in name, 'path/to/file.py:build' or 'package.module:build'. Both the worker
and the validator call it in fresh processes, so it must not rely on state of ours.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


@dataclass
class Task:
    """Everything torchherd needs to train and validate one model.

    Batches must be `(inputs, targets)`; inputs go through `model`, and
    `loss_fn(outputs, targets)` returns a scalar tensor. `train_data` and
    `val_data` are Datasets (torchherd builds the DataLoaders from the config's
    batch_size, num_workers, pin_memory, ...) or any iterable of batches.
    `metrics_fn(outputs, targets)` may return extra validation metrics (for
    example accuracy) as a dict of numbers or scalar tensors, averaged per sample.
    `scheduler`, if given, is stepped once per epoch.

    `optimizer` may also be a function of the parameters (`lambda params: torch.optim.AdamW(params)`), called
    once the model is in place (sharded, with `strategy = "fsdp"`), and `scheduler` then a function of the
    optimizer. An Optimizer made over `model.parameters()` works too: under fsdp its groups are pointed at the
    shards. `shard` says which modules FSDP2 shards as units (gathered only while they run): a list of module
    classes, or a function `shard(model, fully_shard)` that calls `fully_shard(module)` itself; default each
    direct child of the model that has parameters. The model itself is always sharded last.
    """

    model: Any  # torch.nn.Module
    optimizer: Any  # torch.optim.Optimizer, or a function of the parameters returning one
    train_data: Any
    loss_fn: Callable[[Any, Any], Any]
    val_data: Any = None
    metrics_fn: Callable[[Any, Any], dict[str, Any]] | None = None
    scheduler: Any = None  # an LR scheduler, or a function of the optimizer returning one
    shard: Any = None  # strategy "fsdp": module classes to shard as units, or a function shard(model, fully_shard)


def no_val_data_text(background: bool) -> str:
    """What `check --probe` and a run say, once, of a Task without `val_data`: nothing is validated, and
    (in the background mode) no snapshot goes to the validator, so nothing is waited for at the end."""
    return "no val_data: nothing to validate" + (", no background validation" if background else "")


class Validating(Protocol):
    """What the validator scores a pipeline with: a `Task`, or what a script's `validate` factory returns
    (torchherd.client.Validation, or anything with these, as `build_validation` checks)."""

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def val_data(self) -> object: ...
    @property
    def loss_fn(self) -> Callable[[Any, Any], Any]: ...
    @property
    def metrics_fn(self) -> Callable[[Any, Any], dict[str, Any]] | None: ...


class TaskError(Exception):
    """A task that cannot be found, imported or built; the message says which and why."""


def load_callable(ref: str) -> Callable[..., Any]:
    from ...config.schema import BUILTIN_TASKS

    if ref in BUILTIN_TASKS:  # built-in tasks are Tasks too: found by name, as any module's are
        ref = f"{__package__}.builtin:{ref}"
    target, _, attr = ref.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise TaskError(f"task file not found: {path}")
        name = f"torchherd_task_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise TaskError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so pickling and dataclasses inside it work
        # The task's folder is importable, so a task file can import its neighbours.
        sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise TaskError(f"syntax error in {path} line {exc.lineno}: {exc.msg}") from exc
        except Exception as exc:
            raise TaskError(f"importing {path} raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise TaskError(f"importing module {target!r} raised {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise TaskError(f"{target} has no {attr!r}")
    if not callable(fn):
        raise TaskError(f"{target}:{attr} is not callable")
    return fn


def build_task(ref: str, params: dict[str, Any]) -> Task:
    """Import the factory named by `ref`, call it with `params` and check what it returns."""
    return check_task(ref, call_factory(ref, params))


def build_validation(ref: str, params: dict[str, Any]) -> Validating:
    """Call a script pipeline's `validate` factory and check what it returns (a Validation, or a Task)."""
    import torch

    fn = load_callable(ref)
    try:
        built = fn(dict(params))
    except Exception as exc:
        raise TaskError(f"validate factory {ref} raised {type(exc).__name__}: {exc}") from exc
    problems = []
    if not isinstance(getattr(built, "model", None), torch.nn.Module):
        problems.append("no model (a torch.nn.Module)")
    if getattr(built, "val_data", None) is None:
        problems.append("no val_data")
    if not callable(getattr(built, "loss_fn", None)):
        problems.append("no callable loss_fn")
    if problems:
        raise TaskError(f"validate factory {ref} returned a {type(built).__name__} with " + ", ".join(problems) +
                        "; return torchherd.client.Validation(model=..., val_data=..., loss_fn=...)")
    return built


def call_factory(ref: str, params: dict[str, Any], fn: Callable[..., object] | None = None) -> Any:
    """What the factory named by `ref` (or `fn`, already loaded from it) returns for `params`; TaskError
    if it raises."""
    fn = fn if fn is not None else load_callable(ref)
    try:
        return fn(dict(params))
    except Exception as exc:
        raise TaskError(f"task factory {ref} raised {type(exc).__name__}: {exc}") from exc


def check_task(ref: str, task: object, instead: str = "") -> Task:
    """`task` if it is a usable Task; else TaskError naming the factory and what is wrong.

    `instead` names what else the caller would have accepted, for the message.
    """
    import torch

    if not isinstance(task, Task):
        raise TaskError(f"task factory {ref} returned {type(task).__name__}; it must return torchherd.Task(...)"
                        + (f" or, {instead}" if instead else ""))
    problems = []
    if not isinstance(task.model, torch.nn.Module):
        problems.append(f"model is {type(task.model).__name__}, not a torch.nn.Module")
    if not isinstance(task.optimizer, torch.optim.Optimizer) and not callable(task.optimizer):
        problems.append(f"optimizer is {type(task.optimizer).__name__}, not a torch.optim.Optimizer "
                        "(or a function of the parameters returning one)")
    from .sharded import shard_problem

    if shard_problem(task.shard):
        problems.append(shard_problem(task.shard))
    if task.train_data is None:
        problems.append("train_data is None")
    if not callable(task.loss_fn):
        problems.append("loss_fn is not callable")
    if task.metrics_fn is not None and not callable(task.metrics_fn):
        problems.append("metrics_fn is not callable")
    if problems:
        raise TaskError(f"task factory {ref} returned a Task whose " + "; ".join(problems))
    return task
