"""Data loading shared by every runner and the validator: a resumable per-epoch sampler and DataLoaders.

`EpochSampler` fixes each epoch's order by (seed, epoch), so a resumed epoch skips
exactly what was trained; `make_loader` turns a Dataset into a DataLoader from the
pipeline's settings and passes anything else (the user's own iterable) through.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..config.schema import Pipeline


class EpochSampler(torch.utils.data.Sampler):
    """A shuffled order fixed by (seed, epoch), so a resumed epoch can skip what was done.

    In a gang of `world` ranks each takes every `world`-th sample of that order from its
    rank on, the order padded from its start to a multiple of `world` as DistributedSampler
    does: every rank has as many batches, so none waits in a collective for another.
    """

    def __init__(self, size: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.rank, self.world = rank, world
        self.per_rank = -(-size // world)  # ceil
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.size, generator=gen).tolist()
        else:
            order = list(range(self.size))
        if self.world > 1:
            total = self.per_rank * self.world
            order = (order * -(-total // self.size))[:total][self.rank::self.world]  # padded cyclically
        return iter(order[self.skip:])

    def __len__(self) -> int:
        return self.per_rank - self.skip


def is_dataset(data: Any) -> bool:
    """A map-style Dataset torchherd batches itself (not a DataLoader or other iterable)."""
    return hasattr(data, "__getitem__") and hasattr(data, "__len__") and \
        not isinstance(data, torch.utils.data.DataLoader)


def make_loader(data: Any, pipe: Pipeline, device: torch.device, shuffle: bool,
                num_workers: int | None = None, rank: int = 0, world: int = 1) -> tuple[Any, EpochSampler | None]:
    """A DataLoader over `data` from the pipeline's settings and its sampler; other iterables as they are.

    `num_workers` overrides the pipeline's (the validator loads in its own process); `rank` and
    `world` shard it for one rank of a gang.
    """
    if not is_dataset(data):
        return data, None
    sampler = EpochSampler(len(data), pipe.seed, shuffle, rank, world)
    workers = pipe.num_workers if num_workers is None else num_workers
    loader = torch.utils.data.DataLoader(
        data, batch_size=pipe.batch_size, sampler=sampler, num_workers=workers,
        pin_memory=pipe.pin_memory and device.type == "cuda",
        persistent_workers=pipe.persistent_workers and workers > 0)
    return loader, sampler
