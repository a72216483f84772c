"""Samplers whose order depends only on (seed, epoch), so a resumed run sees the batches it would have seen."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sized

import numpy as np
import torch
from torch.utils.data import DistributedSampler, Sampler


def seeded_generator(seed: int, *keys: str) -> torch.Generator:
    """A CPU generator determined by ``seed`` and string ``keys`` only (e.g. ``"rotation", "test"``).

    Keys are hashed with crc32 (stable across processes and Python versions, unlike ``hash``) and mixed with the
    seed by NumPy's ``SeedSequence``, so each use of randomness gets an independent, reproducible stream, and
    nearby seeds give unrelated streams (``seed + 1`` is not ``seed`` one step on).
    """
    entropy = [int(seed)] + [zlib.crc32(key.encode()) for key in keys]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class EpochSeededRandomSampler(Sampler[int]):
    """Uniform random permutation per epoch, drawn from a stream of ``(seed, epoch)``, never from the global RNG.

    Lightning calls ``set_epoch`` before every training epoch (as it does for ``DistributedSampler``). A run
    resumed from an epoch's checkpoint therefore shuffles the next epochs exactly as the uninterrupted run.
    The stream is :func:`seeded_generator` of ``(seed, "order", epoch)``: the seeds of a table cell see unrelated
    orders. (Up to commit 317577c it was ``manual_seed(seed + epoch)``, so seed 1's epoch ``e`` saw seed 0's epoch
    ``e + 1``; records name the commit they ran, ``code_version``.)

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

    def epoch_generator(self) -> torch.Generator:
        """The generator of this epoch's order (and of anything a subclass draws with it)."""
        return seeded_generator(self.seed, "order", str(self.epoch))

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self.num_samples, generator=self.epoch_generator()).tolist()

    def __len__(self) -> int:
        return self.num_samples


class DealtDistributedSampler(DistributedSampler):
    """Training under DDP: the one-process order of ``sampler``, dealt to the processes in turn.

    Position ``k`` of the order goes to process ``k mod N``, so process ``r`` reads positions ``r, r + N, ...``:
    with a per-process batch ``b``, step ``s`` of the N processes together covers positions ``[s·N·b, (s+1)·N·b)``,
    which is step ``s`` of one process with batch ``N·b`` (DDP averages the processes' mean-loss gradients, so
    that is the same gradient up to the order of float additions). Lightning's default, wrapping the sampler
    in ``DistributedSamplerWrapper``, reshuffles its order with a seed of its own: the same data, other batches.
    As ``DistributedSampler``, the order is padded with its first positions to a multiple of N (every process
    takes the same number of steps). ``set_epoch`` reaches ``sampler`` (:class:`EpochSeededRandomSampler`: the
    order of ``(seed, epoch)``, so a resumed run deals what the uninterrupted one dealt).
    """

    def __init__(self, sampler: Sampler[int], dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        order = list(self.sampler)
        order += order[: self.total_size - len(order)]
        return iter(order[self.rank : self.total_size : self.num_replicas])
