"""How a hand-off's bytes reach a snapshot slot: the copy engines a `SnapshotWriter` drives.

A `CopyEngine` starts the copy of the live weights into one slot and returns a `Copy` that says when
the bytes have landed; worker/snapshot.py picks one by where the weights live (`copy_mode`): `HostCopy`
for the CPU (done when `start` returns), CUDA's asynchronous engine (worker/cuda_copy.py), else
`BlockingDeviceCopy`.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

HOST, STAGED, DIRECT, BLOCKING = "host", "cuda-staged", "cuda-direct", "blocking"


@runtime_checkable
class Copy(Protocol):
    """One hand-off's copy into a slot, which may still be running on a device."""

    def done(self) -> bool:
        """Whether the bytes are in the slot now (never blocks)."""

    def wait(self) -> None:
        """Block until the bytes are in the slot; called off the training thread when `done()` was False."""


@runtime_checkable
class CopyEngine(Protocol):
    """Copies the live weights into slots; `start` is all the training thread waits for."""

    name: str  # HOST, STAGED, DIRECT or BLOCKING: what the snapshot meta and the tests read
    staging_bytes: int  # device memory held for staging (bytes); 0 when it stages nothing
    notices: list[str]  # what the user should read once (pinning failed, ...), said when the writer opens

    def start(self, slot: int) -> Copy:
        """Begin copying the weights into `slot`; never called while an earlier Copy is still running."""

    def close(self) -> None:
        """Give back what the engine holds (pinned pages, staging memory); no Copy may be running."""


class Landed:
    """A copy that was over when `start` returned."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


LANDED = Landed()


class HostCopy:
    """CPU weights: one foreach copy into the slot's typed views, finished when `start` returns."""

    name = HOST
    staging_bytes = 0

    def __init__(self, tensors: list[torch.Tensor], views: list[list[torch.Tensor]]):
        self.tensors, self.views = tensors, views
        self.notices: list[str] = []

    def start(self, slot: int) -> Copy:
        torch._foreach_copy_(self.views[slot], self.tensors)
        return LANDED

    def close(self) -> None:
        return None


class BlockingDeviceCopy:
    """Weights on another device (or on several): a copy per tensor that waits for each one."""

    name = BLOCKING
    staging_bytes = 0

    def __init__(self, tensors: list[torch.Tensor], views: list[list[torch.Tensor]], notices: list[str] | None = None):
        self.tensors, self.views = tensors, views
        self.notices = list(notices or [])

    def start(self, slot: int) -> Copy:
        for view, t in zip(self.views[slot], self.tensors):
            view.copy_(t)
        return LANDED

    def close(self) -> None:
        return None


def copy_mode(devices: list[torch.device], staging: bool) -> str:
    """Which engine suits weights on `devices`: HOST, STAGED or DIRECT (all on one CUDA device), else BLOCKING."""
    if all(d.type == "cpu" for d in devices):
        return HOST
    if devices and all(d.type == "cuda" for d in devices) and len({d.index for d in devices}) == 1:
        return STAGED if staging else DIRECT
    return BLOCKING
