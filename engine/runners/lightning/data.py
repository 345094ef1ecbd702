"""Resumable training data for Lightning pipelines: a sampler that can start an epoch part-way through.

Lightning restarts a plain DataLoader's epoch from its first batch when it resumes
from a mid-epoch checkpoint, so samples would be trained twice. `resumable(loader)`
swaps a DataLoader's RandomSampler or SequentialSampler for `ResumableSampler`,
which draws the same order and skips what the checkpointed part of the epoch trained.
"""
from __future__ import annotations

from typing import Any

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

    def __iter__(self):
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


def resumable(loader: Any) -> tuple[Any, ResumableSampler | None]:
    """`loader` with a ResumableSampler in place of its Random/SequentialSampler; others as they are."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler
    from lightning.pytorch.utilities.data import _update_dataloader

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
    sampler = ResumableSampler(len(inner), shuffle)
    return _update_dataloader(loader, sampler), sampler
