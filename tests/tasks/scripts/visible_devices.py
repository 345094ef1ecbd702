"""Prints what one process of a torchrun-style job sees: RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES and TORCHHERD_GPUS.

It touches no GPU, so it runs on a machine without one. It exits 3 where the DDP examples people copy
(`torch.device(f"cuda:{LOCAL_RANK}")`, `DDP(model, device_ids=[LOCAL_RANK])`) would stop with
"invalid device ordinal": LOCAL_RANK not below the number of GPUs CUDA_VISIBLE_DEVICES shows.
"""
import os
import sys

rank = os.environ.get("RANK", "0")
local = int(os.environ.get("LOCAL_RANK", "0"))
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
own = os.environ.get("TORCHHERD_GPUS", "")
print(f"visible_devices: rank {rank} local_rank {local} cuda_visible_devices [{visible}] own [{own}]", flush=True)
sys.exit(0 if local < len([g for g in visible.split(",") if g]) else 3)
