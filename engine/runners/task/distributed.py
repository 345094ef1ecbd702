"""The `Task` trainer's side of a gang: its process group, model wrapping (DDP, or FSDP2 shards), loss means and
collective commands.

`Gang.join` starts the process group (gloo on CPU, nccl on a GPU) with a timeout far
below torch's 30 minutes, `mean` averages a tensor over ranks (at report intervals
only), and `agree` makes rank 0's reading of the supervisor's commands every rank's,
so all ranks stop, pause and checkpoint at the same step and none waits alone.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ...worker.control import WorkerControl

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel

    from ...config.schema import Pipeline
    from .sharded import Shard

PAUSE_POLL = 0.5  # seconds rank 0 waits for a command between the paused gang's rounds
STOP, PAUSE, CHECKPOINT, TIME_UP = range(4)  # the flags rank 0 broadcasts


class Gang:
    """This process's rank in a gang of `world`: rank 0 decides, every rank does the same."""

    def __init__(self, rank: int, world: int, device: torch.device, strategy: str = "ddp",
                 shard_group: int | None = None, timeout: timedelta | None = None):
        self.rank, self.world, self.device = rank, world, device
        self.timeout = timeout  # the process group's collective timeout (None: torch's default)
        self.shard_group = shard_group or world  # fsdp: ranks sharding one copy of the model (fewer: HSDP)
        self.strategy = strategy  # the pipeline's `strategy`: "ddp", "ddp_find_unused_parameters_true", "fsdp"
        self.sharded = strategy == "fsdp"  # each rank holds a shard of the weights, so saving is a collective
        # gloo reduces CPU tensors, nccl CUDA ones
        self._flags = torch.zeros(4, dtype=torch.int64, device=device)

    @classmethod
    def join(cls, rank: int, world: int, device: torch.device, timeout: float, strategy: str = "ddp",
             shard_group: int | None = None) -> Gang:
        """Join the process group torchrun's variables (MASTER_ADDR, MASTER_PORT) describe."""
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        return cls(rank, world, device, strategy, shard_group, timedelta(seconds=timeout))

    @property
    def lead(self) -> bool:
        """Rank 0 alone checkpoints, reports and hands snapshots to the validator."""
        return self.rank == 0

    def wrap(self, model: torch.nn.Module, shard: Shard | None = None,
             pipe: Pipeline | None = None) -> DistributedDataParallel | None:
        """`model` in DDP; or, sharded, None: `model` itself is sharded in place (FSDP2, per `shard`, with the
        pipeline's precision as FSDP2's mixed-precision policy)."""
        if self.sharded:
            from .sharded import device_mesh, shard_model

            mesh = device_mesh(self.device, self.world, self.shard_group)
            shard_model(model, shard, pipe.precision if pipe is not None else "32", mesh)
            return None
        from torch.nn.parallel import DistributedDataParallel

        on_gpu = self.device.type == "cuda"
        return DistributedDataParallel(model, device_ids=[self.device.index or 0] if on_gpu else None,
                                       find_unused_parameters=self.strategy == "ddp_find_unused_parameters_true")

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of `value` over every rank (a collective: every rank calls it at the same step)."""
        total = value.detach().clone()
        dist.all_reduce(total)
        return total / self.world

    def agree(self, control: WorkerControl, save: Callable[[str], None], time_up: Callable[[], bool]) -> bool:
        """Every rank takes rank 0's commands (stop, pause, checkpoint-now) and its verdict on the time
        budget; a paused gang holds here, all ranks together. Returns whether the time budget is spent."""
        flags = self._broadcast(control, time_up)
        paused, last = False, time.monotonic()
        while flags[PAUSE] and not flags[STOP]:
            # Rounds keep every rank in step, and well inside the collective timeout; the time paused is
            # credited before each, so rank 0's verdict on max_time leaves it out.
            now = time.monotonic()
            control.paused_time, last, paused = control.paused_time + now - last, now, True
            flags = self._broadcast(control, time_up, wait=PAUSE_POLL, save=save)
        if paused:
            control.paused_time += time.monotonic() - last
        return bool(flags[TIME_UP])

    def _broadcast(self, control: WorkerControl, time_up: Callable[[], bool], wait: float = 0.0,
                   save: Callable[[str], None] | None = None) -> list[int]:
        if not self.lead:
            control.discard()  # commands reach every rank; rank 0's decide, the others' must not pile up
        else:
            control.poll(timeout=wait)
            if save is not None and not self.sharded and control.take_checkpoint_request():
                save("request")  # paused: the weights are the same on every rank
            self._flags.copy_(torch.tensor([control.should_stop, control.paused, control.checkpoint_requested,
                                            time_up()], dtype=torch.int64))
        dist.broadcast(self._flags, src=0)
        flags = self._flags.tolist()
        if flags[STOP] and control.stop_reason is None:
            control.stop_reason = "stopped with rank 0"
        control.paused = bool(flags[PAUSE])
        control.checkpoint_requested = bool(flags[CHECKPOINT])
        if save is not None and self.sharded and control.take_checkpoint_request():
            save("request")  # paused, sharded: every rank writes its shards, together
        return flags

    def checkpoint_group(self) -> ProcessGroup:
        """A gloo group of every rank for checkpoints written in the background (DCP's async save): their
        collectives run on a thread of their own, never mixed into training's on the default group. A
        collective: every rank calls it, once."""
        return dist.new_group(backend="gloo", timeout=self.timeout)

    def barrier(self) -> None:
        """Every rank waits here for the others (the last: none ends while rank 0 still saves)."""
        dist.barrier()

    def checksum(self, model: torch.nn.Module) -> float:
        """A sum over every weight: equal on every rank while they train in step."""
        if self.sharded:  # a collective: the shards' sums, added over ranks
            from .sharded import sharded_checksum

            return sharded_checksum(model) / (self.world // self.shard_group)  # each copy counted once
        with torch.no_grad():
            return float(sum(p.double().sum() for p in model.parameters()))
