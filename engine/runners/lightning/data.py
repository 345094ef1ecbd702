"""Resumable training data for Lightning pipelines: a sampler that can start an epoch part-way through.

Lightning restarts a plain DataLoader's epoch from its first batch when it resumes
from a mid-epoch checkpoint, so samples would be trained twice. `resumable(loader)`
swaps a DataLoader's RandomSampler or SequentialSampler for `ResumableSampler`,
which draws the same order and skips what the checkpointed part of the epoch trained.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch


class ResumableSampler(torch.utils.data.Sampler):
    """RandomSampler's order (the same draw from torch's generator), but able to resume mid-epoch.

    Each epoch's order comes from one seed drawn exactly as RandomSampler draws it,
    so a run equals plain Lightning's on the same seed; the seed is kept in the
    checkpoint, so a resumed epoch replays that order and skips what was trained.
    """

    def __init__(self, size: int, shuffle: bool):
        self.size, self.shuffle = size, shuffle
        self.epoch = 0
        self.seed = 0  # the current epoch's order
        self.resume: tuple[int, int, int] | None = None  # (epoch, seed, samples to skip)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        # The full epoch: Lightning counts a resumed epoch's batches from where it stopped.
        return self.size

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self.resume is not None and self.resume[0] == self.epoch:
            _, self.seed, skip = self.resume
        elif self.shuffle:
            self.seed = int(torch.empty((), dtype=torch.int64).random_().item())
        self.resume = None
        if self.shuffle:
            gen = torch.Generator()
            gen.manual_seed(self.seed)
            order = torch.randperm(self.size, generator=gen).tolist()
        else:
            order = list(range(self.size))
        yield from order[skip:]


class ResumableDistributedSampler(torch.utils.data.DistributedSampler):
    """The sampler plain Lightning gives each rank of a DDP gang (DistributedSampler, seeded with the run's
    seed), able to resume mid-epoch: each epoch's order follows from the seed and the epoch alone, so a
    resumed epoch replays it and skips what this rank trained before the checkpoint."""

    def __init__(self, dataset: torch.utils.data.Dataset[object], shuffle: bool, rank: int, world: int) -> None:
        import os

        # Lightning's own distributed sampler takes its seed from seed_everything's variable
        super().__init__(dataset, num_replicas=world, rank=rank, shuffle=shuffle,
                         seed=int(os.environ.get("PL_GLOBAL_SEED", 0)))
        self.resume: tuple[int, int, int] | None = None  # (epoch, seed, samples of this rank to skip)

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self.resume is not None and self.resume[0] == self.epoch:
            skip = self.resume[2]
        self.resume = None
        yield from list(super().__iter__())[skip:]


def resumable(loader: object, rank: int = 0,
              world: int = 1) -> tuple[object, ResumableSampler | ResumableDistributedSampler | None]:
    """`loader` with a ResumableSampler in place of its Random/SequentialSampler (for rank `rank` of a gang of
    `world`, a ResumableDistributedSampler, which Lightning leaves in place); others as they are."""
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

    if not isinstance(loader, DataLoader) or type(loader.batch_sampler) is not BatchSampler:
        return loader, None
    inner = loader.batch_sampler.sampler
    if type(inner) is RandomSampler and not inner.replacement and inner.generator is None \
            and inner._num_samples is None:
        shuffle = True
    elif type(inner) is SequentialSampler:
        shuffle = False
    else:
        return loader, None
    sampler: ResumableSampler | ResumableDistributedSampler
    if world > 1:
        sampler = ResumableDistributedSampler(loader.dataset, shuffle, rank, world)
    else:
        sampler = ResumableSampler(len(inner), shuffle)
    return _update_dataloader(loader, sampler), sampler
