"""What every data module shares: loaders over named splits, (seed, epoch)-seeded shuffling, and a hook that
augments training batches on the device.

Subclasses fill ``self.splits`` (``"train"``, ``"val"``, ``"test"`` → Dataset) in ``setup`` and may override
:meth:`SplitDataModule.train_sampler` and :meth:`SplitDataModule.augment_train_batch`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from lightning import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, Sampler

from canonical_network.data.samplers import (
    DealtDistributedSampler,
    EpochSeededRandomSampler,
    seeded_generator,
)
from canonical_network.utils.checks import check_int

SPLITS = ("train", "val", "test")  # the names of the splits everywhere: data modules, task metrics, logged keys


class SplitDataModule(LightningDataModule):
    """Train/val/test loaders over ``self.splits``; the training set is shuffled by ``(seed, epoch)``.

    Shuffling never draws from the global RNG (:class:`EpochSeededRandomSampler`), so a run resumed from
    a checkpoint sees the batches the uninterrupted run would have seen.

    Args:
        batch_size, num_workers, pin_memory: DataLoader arguments (checked, errors name ``data.<key>``).
    """

    def __init__(self, batch_size: int, num_workers: int, pin_memory: bool = False) -> None:
        super().__init__()
        check_int("data.batch_size", batch_size, low=1)
        check_int("data.num_workers", num_workers, low=0)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.splits: dict[str, Dataset] = {}
        # The run's seed (train.py seeds before building the data), read now: under DDP each process reseeds
        # its RNG per epoch (tasks/base.py), and a resume restores rank 0's RNG state, whose initial_seed() is
        # that reseed, before the training loader exists; shuffling from it would deal other batches than
        # the uninterrupted run.
        self.shuffle_seed = torch.initial_seed()

    def train_sampler(self, dataset: Dataset) -> Sampler:
        """How the training split is shuffled; a new permutation per epoch, from (seed, epoch)."""
        return EpochSeededRandomSampler(dataset, seed=self.shuffle_seed)

    def augment_train_batch(self, batch):
        """Random augmentation of a training batch, on its device after the transfer; none by default."""
        return batch

    def eval_sampler(self, dataset: Dataset, split: str) -> Sampler | None:
        """How an evaluation split is read: in order (``None``), or, with several processes (DDP), each sample by
        exactly one process.

        Lightning's default for evaluation under DDP is ``DistributedSampler``, which pads every process to the
        same number of samples by repeating the first ones: with 2,000 test systems on 3 processes, 1 system
        would be counted twice in every metric. :class:`UnrepeatedDistributedSampler` (Lightning's own, which it
        uses for prediction) gives process ``r`` the samples ``r, r + N, r + 2N, ...``: sizes differ by at most
        one, and the metrics (torchmetrics, synchronised once at the epoch's end; the task logs no per-step
        collective) sum every sample once. Uneven batch counts are safe in evaluation: DDP synchronises buffers
        only in forward passes with gradients.
        """
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        processes = dist.get_world_size()
        if len(dataset) < processes:
            raise ValueError(f"the {split} split has {len(dataset)} sample(s), fewer than the {processes} processes "
                             f"evaluating it: every process needs one; use trainer.devices <= {len(dataset)}")
        return UnrepeatedDistributedSampler(dataset, num_replicas=processes, rank=dist.get_rank(), shuffle=False)

    def _train_sampler(self, dataset: Dataset) -> Sampler:
        """:meth:`train_sampler`, dealt to the processes under DDP (:class:`DealtDistributedSampler`): N processes of
        ``data.batch_size`` take the steps of one process of ``N × data.batch_size``."""
        sampler = self.train_sampler(dataset)
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return sampler
        return DealtDistributedSampler(sampler, dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.splits:
            self.setup()
        dataset = self.splits[split]
        sampler = self._train_sampler(dataset) if shuffle else self.eval_sampler(dataset, split)
        # A last training batch of a single sample breaks batch norm ("Expected more than 1 value per
        # channel"): drop it (a different sample each epoch, by the shuffle). Other sizes are kept as they are.
        # Counted over what this process draws: under DDP each process gets its share of the dataset.
        drop_last = shuffle and len(sampler) % self.batch_size == 1
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            drop_last=drop_last,
            sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            # Each new iterator of a loader draws its workers' base seed from this generator, not from the global
            # RNG, so the run's own random stream (dropout, augmentation) does not depend on data.num_workers
            # (persistent workers draw once, others at every epoch) or on how often Lightning iterates a loader.
            generator=seeded_generator(self.shuffle_seed, "loader", split),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        # Training batches only: Lightning sets self.trainer while fitting (None outside a Trainer), and
        # trainer.training is False during validation, testing and prediction.
        trainer = self.trainer
        if trainer is not None and trainer.training:
            batch = self.augment_train_batch(batch)
        return batch
