"""Samplers whose order depends only on (seed, epoch), so a resumed run sees the batches it would have seen."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler


class EpochSeededRandomSampler(Sampler[int]):
    """Uniform random permutation per epoch, drawn from ``seed + epoch``, never from the global RNG.

    Lightning calls ``set_epoch`` before every training epoch (as it does for ``DistributedSampler``). A run
    resumed from an epoch's checkpoint therefore shuffles the next epochs exactly as the uninterrupted run.

    Args:
        data_source: the dataset (only its length is used).
        seed: base seed; defaults to ``torch.initial_seed()``, i.e. the run's ``seed`` after seeding.
    """

    def __init__(self, data_source: Sized, seed: int | None = None) -> None:
        self.num_samples = len(data_source)
        self.seed = torch.initial_seed() if seed is None else int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()

    def __len__(self) -> int:
        return self.num_samples
