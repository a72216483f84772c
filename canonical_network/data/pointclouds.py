"""What the point-cloud data modules share (paper §5.3, Appendix G.3): the train/test rotation protocol,
seeded draws for training samples, and the loaders.

The modules themselves live in :mod:`~canonical_network.data.modelnet` (ModelNet40 classification),
:mod:`~canonical_network.data.shapenet` (ShapeNet-part segmentation) and
:mod:`~canonical_network.data.synthetic_shapes` (the embedded default for both tasks).

Rotation protocol
-----------------
``rotation="<train>/<test>"`` with each side one of ``none``, ``z``, ``so3`` (Esteves et al. 2018, adopted by
Vector Neurons and the paper): ``z`` is a uniform rotation about one axis (``rotation_axis``, the literal z
axis by default), ``so3`` a uniform (Haar) rotation. The paper's three settings are ``z/z``, ``z/so3`` and
``so3/so3``.

* Training clouds get a fresh rotation per sample and per batch, on the device, in
  :meth:`PointCloudDataModule.on_after_batch_transfer` (training batches only), like the rotation
  augmentation of the image modules.
* Validation and test clouds get one fixed rotation each, drawn once from ``data_seed`` and the split's
  name, so evaluation is deterministic and the same across runs and instantiations (the reference code
  draws fresh test rotations at every evaluation).

Points are row vectors ``(B, P, 3)`` and a rotation ``R`` acts as ``x ↦ x Rᵀ``
(:func:`canonical_network.groups.euclidean.apply_rotation`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, Sampler

from canonical_network.data.base import SplitDataModule
from canonical_network.data.errors import DataFilesError
from canonical_network.data.samplers import EpochSeededRandomSampler, seeded_generator
from canonical_network.groups.euclidean import apply_rotation, random_axis_rotations, random_rotations
from canonical_network.utils.checks import check_choice, check_int

ROTATION_KINDS = ("none", "z", "so3")
# The paper's three settings first (Table 4, Table 5b); every other combination is allowed too.
ROTATION_PROTOCOLS = ("z/z", "z/so3", "so3/so3") + tuple(
    f"{a}/{b}"
    for a in ROTATION_KINDS
    for b in ROTATION_KINDS
    if f"{a}/{b}" not in ("z/z", "z/so3", "so3/so3")
)
ROTATION_AXES = ("x", "y", "z")


class PointCloudDataError(DataFilesError):
    """Point-cloud data files exist but cannot be used (unreadable, wrong layout, labels out of range)."""


def parse_rotation(protocol: str) -> tuple[str, str]:
    """``"z/so3"`` → ``("z", "so3")``; raises ``ValueError`` listing the valid protocols."""
    check_choice("data.rotation", protocol, ROTATION_PROTOCOLS)
    train, test = protocol.split("/")
    return train, test


def sample_rotations(
    kind: str,
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    axis: str = "z",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Rotation matrices ``(B, 3, 3)`` of one protocol side: identity, about ``axis``, or Haar on SO(3)."""
    check_choice("kind", kind, ROTATION_KINDS)
    if kind == "none":
        return torch.eye(3, device=device).expand(batch_size, 3, 3).clone()
    if kind == "z":
        return random_axis_rotations(batch_size, generator, axis=axis, device=device)
    return random_rotations(batch_size, generator, device=device)


def rotate_fixed(points: torch.Tensor, kind: str, seed: int, split: str, axis: str = "z") -> torch.Tensor:
    """Rotate every cloud of an evaluation split ``(N, P, 3)`` by its own fixed rotation.

    Rotation ``i`` depends only on ``(seed, split, kind, axis)`` and ``i``, so two instantiations (or a
    validation split that *is* the test split) see identical clouds.
    """
    if kind == "none":
        return points
    generator = seeded_generator(seed, "rotation", split)
    rotations = sample_rotations(kind, len(points), generator, axis=axis)
    return apply_rotation(points, rotations.to(points.dtype))


class SeededDrawSampler(EpochSeededRandomSampler):
    """:class:`EpochSeededRandomSampler` that yields ``(index, draw_seed)`` instead of ``index``.

    Datasets whose training samples are random (a random subset of a cloud's points, resampling a shape to a
    fixed size) draw from ``draw_seed``, never from a global or per-worker RNG: the draws then depend only
    on (seed, epoch), whatever the number of workers, and a resumed run sees the samples it would have seen.
    """

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        generator = self.epoch_generator()
        order = torch.randperm(self.num_samples, generator=generator).tolist()
        seeds = torch.randint(0, 2**62, (self.num_samples,), generator=generator).tolist()
        yield from zip(order, seeds, strict=True)


def split_item(item: int | tuple[int, int]) -> tuple[int, int | None]:
    """``index`` or ``(index, draw_seed)`` from :class:`SeededDrawSampler` → ``(index, draw_seed | None)``."""
    if isinstance(item, tuple):
        return int(item[0]), int(item[1])
    return int(item), None


class PointCloudDataModule(SplitDataModule):
    """Loaders, the training rotation and argument checks shared by the point-cloud data modules.

    Subclasses fill ``self.splits`` (``train``, ``val``, ``test`` datasets) in ``setup`` and apply
    :func:`rotate_fixed` to their evaluation clouds. Batches are tuples whose first element is the points
    ``(B, P, 3)`` float32; the rest (labels) is passed through untouched.

    Args:
        rotation: ``"<train>/<test>"`` protocol, one of :data:`ROTATION_PROTOCOLS`.
        rotation_axis: axis of the ``z`` protocol side.
        data_seed: seed of everything fixed about the data (evaluation rotations and point samples,
            held-out splits, generated shapes); independent of the training seed.
        batch_size, num_workers, pin_memory: DataLoader arguments.
    """

    #: Datasets whose training samples draw random numbers take ``(index, draw_seed)`` items.
    train_draws: bool = False

    def __init__(
        self,
        rotation: str,
        rotation_axis: str,
        data_seed: int,
        batch_size: int,
        num_workers: int,
        pin_memory: bool,
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory)
        self.train_rotation, self.test_rotation = parse_rotation(rotation)
        check_choice("data.rotation_axis", rotation_axis, ROTATION_AXES)
        check_int("data.data_seed", data_seed, low=0)
        self.rotation = rotation
        self.rotation_axis = rotation_axis
        self.data_seed = data_seed

    def rotate_eval(self, points: torch.Tensor, split: str) -> torch.Tensor:
        """Fixed test-protocol rotations of an evaluation split's clouds ``(N, P, 3)``."""
        return rotate_fixed(points, self.test_rotation, self.data_seed, split, axis=self.rotation_axis)

    def train_sampler(self, dataset: Dataset) -> Sampler:
        sampler = SeededDrawSampler if self.train_draws else EpochSeededRandomSampler
        return sampler(dataset, seed=self.shuffle_seed)

    def augment_train_batch(self, batch):
        # A fresh rotation per cloud and per step, on the device.
        if self.train_rotation == "none":
            return batch
        points, *rest = batch
        rotations = sample_rotations(self.train_rotation, points.shape[0], axis=self.rotation_axis, device=points.device)
        return (apply_rotation(points, rotations.to(points.dtype)), *rest)
