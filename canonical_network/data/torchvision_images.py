"""CIFAR-10 and STL-10 through torchvision's dataset classes, with the protocol of Mondal et al. (NeurIPS 2023),
"Equivariant Adaptation of Large Pretrained Models", §5.1 (image classification):

* train on upright images (optionally rotation-augmented: ``data.augmentation``);
* validate on a split carved from the training set with a fixed seed (``data.val_fraction``,
  ``data.split_seed``), so that nothing of the test set steers early stopping or checkpoint choice;
* test on the upright test set; the C_N-rotated test set is the task's group-orbit evaluation
  (``model.orbit_rotations=8`` logs ``test/orbit/error_g{k}``, ``error_mean`` (the paper's "C8-Avg"),
  ``error_max`` and ``error_worst``).

**Padding.** Every image is zero-padded to a ``pad_to × pad_to`` square here, in the data pipeline, so that the
canonicalizer sees, and rotates, the padded image: with ``pad_to ≥ ⌈√2 · side⌉`` no rotation about the centre
moves any pixel of the original image out of the frame (its corners sit at √2·side/2 from the centre). Padding
after canonicalization would be too late (the corners are lost in the rotation), and padding inside the
predictor would not be seen by the canonicalizer. Resizing to a backbone's resolution happens inside the
predictor, after canonicalization (:mod:`canonical_network.prediction.torchvision_backbones`).

Files are torchvision's on-disk formats under ``data.root``: ``cifar-10-batches-py/`` (pickled batches) and
``stl10_binary/`` (``train_X.bin``, …). torchvision checks each file's md5 before reading it. Nothing is
downloaded unless ``data.download=true`` (torchvision's own download, from the URLs of its dataset classes).

Batches are ``(images, labels)``: images (B, 3, pad_to, pad_to) float32 in [0, 1] (no normalisation here:
the canonicalizer works on the image as it is; a pretrained predictor applies ImageNet's mean and std
itself), labels (B,) int64.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from canonical_network.data.errors import MissingDataFiles
from canonical_network.data.rotated_mnist import ImageDataModule
from canonical_network.utils.checks import check_bool, check_int, check_number

log = logging.getLogger(__name__)


def min_rotation_pad(side: int) -> int:
    """The smallest square side that holds an image of ``side × side`` under every rotation about its centre
    (``⌈√2 · side⌉``, rounded up to the parity of ``side`` so that the padding is the same on both sides)."""
    size = math.ceil(math.sqrt(2) * side)
    return size + (size - side) % 2


def pad_to_square(images: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad (…, H, W) images to (…, size, size), centred: the same number of pixels on opposite sides
    (an odd remainder goes to the bottom and right). ``size`` must be at least H and W."""
    h, w = images.shape[-2:]
    if size < h or size < w:
        raise ValueError(f"cannot pad {h}×{w} images to {size}×{size}: data.pad_to must be >= the image size")
    top, left = (size - h) // 2, (size - w) // 2
    return F.pad(images, (left, size - w - left, top, size - h - top))


class PaddedImages(Dataset):
    """``(image, label)`` pairs from uint8 images (N, C, H, W), returned as float32 in [0, 1], zero-padded to
    ``pad_to`` (None: as stored). The images stay uint8 in memory (CIFAR-10's training set: 150 MB instead
    of 600 MB as float32, 1.3 GB padded) and are converted one sample at a time."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, pad_to: int | None) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or len(images) != len(labels):
            raise ValueError(f"expected uint8 images (N, C, H, W) and N labels; got {images.dtype} "
                             f"{tuple(images.shape)} and {len(labels)} labels")
        self.images, self.labels, self.pad_to = images, labels, pad_to

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].float() / 255.0
        if self.pad_to is not None:
            image = pad_to_square(image, self.pad_to)
        return image, self.labels[index]


class TorchvisionImageDataModule(ImageDataModule):
    """Train / validation (carved from train) / test splits of a torchvision image dataset.

    Args:
        root: the folder holding the dataset's torchvision folder (``cifar-10-batches-py`` or ``stl10_binary``).
        val_fraction: share of the training images held out for validation, in (0, 1).
        split_seed: seed of that split (independent of the training seed: every run validates on the same images).
        pad_to: side of the zero-padded square images; ``null`` keeps the stored size (rotations then cut the
            corners off). Must be ≥ the image side; ⌈√2 · side⌉ (:func:`min_rotation_pad`) keeps every rotation
            of the whole image in the frame.
        augmentation: ``none`` | ``rotation`` (a uniform angle per image and step) | ``c<N>`` (a uniform element
            of C_N per image and step; ``c8`` is Mondal et al.'s "C8-Aug."), applied to the padded image.
        download: let torchvision download the dataset into ``root`` when it is missing (needs internet).
    """

    #: set by subclasses: what the errors call the dataset, torchvision's folder under ``root``, the stored side
    NAME: str
    FOLDER: str
    SIDE: int
    NUM_CLASSES = 10

    def __init__(
        self,
        root: str = "data",
        val_fraction: float = 0.1,
        split_seed: int = 0,
        pad_to: int | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        augmentation: str = "none",
        pin_memory: bool = False,
        download: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, augmentation, pin_memory)
        check_number("data.val_fraction", val_fraction, low=0, high=1, low_inclusive=False, high_inclusive=False)
        check_int("data.split_seed", split_seed)
        check_int("data.pad_to", pad_to, low=self.SIDE, optional=True)
        self.root = Path(root)
        self.val_fraction = float(val_fraction)
        self.split_seed = split_seed
        self.pad_to = pad_to
        self.download = check_bool("data.download", download)

    def _read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 images (N, 3, SIDE, SIDE), int64 labels (N,)) of the training or the test split."""
        raise NotImplementedError

    def _read_checked(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return self._read(train)
        except RuntimeError as error:  # torchvision: "Dataset not found or corrupted. You can use download=True"
            folder = self.root.resolve() / self.FOLDER
            raise MissingDataFiles(
                f"{self.NAME} not found or corrupted in {folder} (torchvision: {error}). Put torchvision's "
                f"{self.FOLDER}/ folder under data.root={str(self.root)!r} (on a machine with internet access: "
                f"torchvision.datasets.{type(self).__name__.removesuffix('DataModule')}(root, download=True)), "
                "or set data.download=true to let training download it."
            ) from None

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node: the only place a download may happen.
        if self.download:
            self._read(train=True)
            self._read(train=False)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        images, labels = self._read_checked(train=True)
        num_val = max(1, round(self.val_fraction * len(images)))
        if num_val >= len(images):
            raise ValueError(f"data.val_fraction={self.val_fraction} leaves no training images of {len(images)}")
        order = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.split_seed))
        val, train = order[:num_val], order[num_val:]
        self.splits["train"] = PaddedImages(images[train], labels[train], self.pad_to)
        self.splits["val"] = PaddedImages(images[val], labels[val], self.pad_to)
        self.splits["test"] = PaddedImages(*self._read_checked(train=False), self.pad_to)
        log.info("%s sizes: %s", self.NAME, {k: len(v) for k, v in self.splits.items()})


class CIFAR10DataModule(TorchvisionImageDataModule):
    """CIFAR-10 (50,000 training, 10,000 test images of 32 × 32, 10 classes) via ``torchvision.datasets.CIFAR10``."""

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "cifar10"  # configs/data/<config_name>.yaml
    display_name = "CIFAR-10"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data (Mondal et al. 2023)
    tasks = ("ImageClassificationTask",)  # the task classes (model._target_) that read it

    NAME, FOLDER, SIDE = "CIFAR-10", "cifar-10-batches-py", 32

    def _read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision.datasets import CIFAR10

        dataset = CIFAR10(str(self.root), train=train, download=self.download)
        images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2).contiguous()  # stored (N, H, W, C)
        return images, torch.as_tensor(dataset.targets, dtype=torch.int64)


class STL10DataModule(TorchvisionImageDataModule):
    """STL-10's labelled images (5,000 training, 8,000 test images of 96 × 96, 10 classes) via
    ``torchvision.datasets.STL10`` (splits ``train`` and ``test``; the unlabelled images are not used, but
    torchvision checks that their file is there)."""

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "stl10"  # configs/data/<config_name>.yaml
    display_name = "STL-10"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data (Mondal et al. 2023)
    tasks = ("ImageClassificationTask",)  # the task classes (model._target_) that read it

    NAME, FOLDER, SIDE = "STL-10", "stl10_binary", 96

    def _read(self, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision.datasets import STL10

        dataset = STL10(str(self.root), split="train" if train else "test", download=self.download)
        images = torch.from_numpy(dataset.data).contiguous()  # (N, C, H, W) after torchvision's transpose
        return images, torch.from_numpy(dataset.labels.astype("int64"))
