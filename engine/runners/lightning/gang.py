"""A Lightning pipeline as a DDP gang: the Trainer arguments that hand torchherd's ranks to Lightning's own
strategy, and the collectives that keep the ranks' reports and obedience in step.

torchherd starts every rank with torchrun's environment, so Lightning's TorchElasticEnvironment finds it and
spawns nothing itself; `gang_trainer_args` sets `devices` and `num_nodes` to match. `LightningGang` makes rank
0's reading of the supervisor's commands every rank's (the Task trainer's `Gang.agree`) and averages reports.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from ...worker.control import WorkerControl
from ..base import cuda_index
from . import FSDP_ON_CPU

if TYPE_CHECKING:
    from ...protocol.spec import WorkerSpec



def gang_trainer_args(spec: WorkerSpec, strategy_name: str) -> dict[str, Any]:
    """`devices`, `num_nodes` and `strategy` for one rank of a gang of `spec.world_size`.

    Lightning checks that devices x num_nodes is torchrun's WORLD_SIZE; per node that is LOCAL_WORLD_SIZE
    ranks over GROUP_WORLD_SIZE nodes (one node, unless a cluster spread the gang). The strategy is the
    one Lightning registers under `strategy_name`, with the collective timeout torchherd gives every gang.
    """
    from lightning.pytorch.strategies import StrategyRegistry

    if strategy_name == "fsdp" and not spec.device.startswith("cuda"):
        raise ValueError(FSDP_ON_CPU)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", spec.world_size))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    if devices * nodes != spec.world_size:
        raise ValueError(f"the gang's {spec.world_size} ranks are spread unevenly over {nodes} nodes (this one has "
                         f"{devices}), and Lightning needs as many on every node: give the nodes slots that divide "
                         "ranks evenly, or lower ranks to what one node holds")
    entry = StrategyRegistry[strategy_name]
    strategy = entry["strategy"](**{**entry["init_params"],
                                    "timeout": timedelta(seconds=spec.collective_timeout)})
    return {"devices": devices, "num_nodes": nodes, "strategy": strategy}


class LightningGang:
    """This rank of a Lightning gang: rank 0 reads the supervisor's commands and every rank obeys them at the
    same step; reported values are means over the ranks, so every rank judges (NaN policy) alike."""

    def __init__(self, spec: WorkerSpec) -> None:
        from ..task.distributed import Gang

        device = torch.device("cuda", cuda_index(spec.device)) if spec.device.startswith("cuda") \
            else torch.device("cpu")
        # Lightning's strategy has joined the process group by the time any of these is called
        self._gang = Gang(spec.rank, spec.world_size, device)
        self.rank, self.world = spec.rank, spec.world_size

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def agree(self, control: WorkerControl, save: Callable[[str], None]) -> None:
        """Every rank takes rank 0's stop, pause and checkpoint-now here (a paused gang holds here together).
        Lightning's own Timer agrees on max_time, so torchherd's verdict on it is never asked."""
        self._gang.agree(control, save, lambda: False)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """`values` averaged over every rank (one all-reduce: every rank calls it at the same step)."""
        return self._gang.mean(values)

    def finish(self, module: torch.nn.Module, step: int) -> None:
        """Print this rank's weights checksum to its log (every rank of a gang ends with the same weights),
        then wait for the others: none ends, starting the gang's linger clock, while rank 0 still saves."""
        print(f"torchherd: rank {self.rank} step {step} weights checksum {self._gang.checksum(module):.10g}",
              file=sys.stderr, flush=True)
        self._gang.barrier()
