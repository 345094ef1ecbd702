"""Mixed precision from the pipeline's `precision` setting: the autocast context and the gradient scaler."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast(device: torch.device, precision: str) -> Callable[[], AbstractContextManager[object]]:
    """A factory of the autocast context for `precision` ("32" gives a no-op context)."""
    dtype = DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


def grad_scaler(device: torch.device, precision: str, sharded: bool = False) -> torch.amp.GradScaler | None:
    """A GradScaler for float16 training; None where none is needed. `sharded`: FSDP's, which agrees over the
    ranks whether any shard's gradients overflowed, so every rank skips the same steps."""
    if precision != "16-mixed":
        return None
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)
