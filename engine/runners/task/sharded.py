"""A `Task` gang with `strategy = "fsdp"`: its model sharded by FSDP2, its optimizer over the shards, its weights
gathered for the validator.

`shard_model` applies `fully_shard` per layer (the Task's `shard` choice, or each direct child that
has parameters, then the root), with FSDP2's mixed precision where `precision` asks for it;
`optimizer_over` makes the optimizer over the sharded parameters; `FullWeights` is rank 0's full copy
for the snapshot hand-off. Checkpoints are sharded_checkpoint.py.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

# A Task's `shard`: module classes FSDP2 shards as units, or a function shard(model, fully_shard) that shards them.
ShardHook = Callable[[torch.nn.Module, Callable[[torch.nn.Module], torch.nn.Module]], object]
Shard = Iterable[type[torch.nn.Module]] | ShardHook
# A Task's `optimizer`: one made already, or a function of the parameters returning one.
OptimizerOrFactory = torch.optim.Optimizer | Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]

SHARD_PROBLEM = ("shard is neither a list of torch.nn.Module classes (each module of one a unit FSDP2 shards) nor "
                 "a function shard(model, fully_shard)")


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's own policy for `precision`: parameters gathered in bf16 or fp16 for the forward and backward,
    gradients reduced and kept in float32 (so no autocast and no gradient scaler on top)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from ...worker.precision import DTYPES

    dtype = DTYPES.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def default_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each direct child that holds parameters: its weights are gathered only while it runs."""
    return [child for child in model.children() if any(True for _ in child.parameters())]


def device_mesh(device: torch.device, world: int, shard_group: int) -> DeviceMesh:
    """The ranks as FSDP2 sees them: one dimension sharding one copy (shard_group = world), or two (HSDP):
    `world // shard_group` copies replicated across groups of `shard_group` consecutive ranks, each sharded
    within its group (a node's ranks, whose links are fastest)."""
    from torch.distributed.device_mesh import init_device_mesh

    if shard_group >= world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world // shard_group, shard_group), mesh_dim_names=("replicate", "shard"))


def shard_model(model: torch.nn.Module, shard: Shard | None, precision: str,
                mesh: DeviceMesh | None = None) -> torch.nn.Module:
    """Shard `model` in place over `mesh` (None: every rank of the default group): the units `shard` names
    first, then the root, so every parameter ends up a DTensor holding this rank's part."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(precision)

    def apply(module: torch.nn.Module) -> torch.nn.Module:
        fully_shard(module, mesh=mesh, mp_policy=policy)  # in place: the module is an FSDPModule from now on
        return module

    if callable(shard) and not isinstance(shard, type):
        shard(model, apply)
    else:
        classes = tuple(cast("Iterable[type[torch.nn.Module]]", shard)) if shard is not None else ()
        units = [m for m in model.modules() if m is not model and isinstance(m, classes)] if classes \
            else default_units(model)
        for unit in units:
            apply(unit)
    if not hasattr(model, "reshard"):  # the hook may have sharded the root already
        apply(model)
    return model


def shard_problem(shard: object) -> str:
    """What is wrong with a Task's `shard` ("" when nothing is)."""
    if shard is None or (callable(shard) and not isinstance(shard, type)):
        return ""
    try:
        classes = list(cast(Iterable[object], shard))  # a TypeError when it is not
    except TypeError:
        return SHARD_PROBLEM
    if not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
        return SHARD_PROBLEM
    return ""


def optimizer_over(optimizer: OptimizerOrFactory, model: torch.nn.Module,
                   names: dict[int, str]) -> torch.optim.Optimizer:
    """The Task's optimizer over the parameters `model` trains with now.

    A function of the parameters is called now, after sharding. An Optimizer the factory made before sharding
    replaced the parameters has its groups pointed at their replacements, found by name (`names`: id of each
    original parameter -> its name); it has no state yet, so nothing is lost, and a scheduler made over it stays
    valid. Elsewhere the parameters are the same objects, and it is left as it is.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer(model.parameters())
    now = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [now.get(names.get(id(p), ""), p) for p in group["params"]]
    return optimizer


def local_numel(model: torch.nn.Module) -> int:
    """Elements of the parameters this rank holds (its shards)."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())


def sharded_checksum(model: torch.nn.Module) -> float:
    """A sum over every weight of the whole model (a collective: the shards' sums, added over ranks)."""
    with torch.no_grad():
        local = sum((p.to_local().double().sum() for p in model.parameters()),  # type: ignore[attr-defined]  # DTensors
                    torch.zeros((), dtype=torch.float64))
        dist.all_reduce(local)
        return float(local)


def full_state(model: torch.nn.Module) -> dict[str, Any]:
    """The whole model's weights on rank 0's CPU (other ranks get {}): a collective, every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class FullWeights:
    """Rank 0's full copy of a sharded model's weights in CPU memory, what the snapshot writer copies from.

    Its tensors stay the same objects (the writer keeps them); `gather` refreshes them, and is a collective:
    every rank calls it at the same step, rank 0 alone keeps what it gathers.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.state: dict[str, torch.Tensor] = full_state(model)

    def gather(self) -> None:
        for name, value in full_state(self.model).items():
            self.state[name].copy_(value)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state

