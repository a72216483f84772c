"""ModelNet40 classification data (paper §5.3, Table 4) from PointNet's ``modelnet40_ply_hdf5_2048`` files.

The files (Qi et al. 2017) hold 2,048 points per shape, sampled from the mesh surface and normalised into
the unit sphere: 9,843 training and 2,468 test shapes of 40 classes. ``train_files.txt`` / ``test_files.txt``
name the ``.h5`` files of each split, one a line, with a ``data/modelnet40_ply_hdf5_2048/`` prefix that is
stripped here. Each ``.h5`` file has ``data`` (N, 2048, 3) float32 and ``label`` (N, 1) integers.

Batches are ``(points, label)``: points (B, P, 3) float32, label (B,) int64.

Up axis: PointNet's own augmentation rotates these files about y (their up direction); Vector Neurons and
the paper's reference code rotate about the literal z axis for the ``z`` protocol (pytorch3d
``RotateAxisAngle(axis="Z")``). ``rotation_axis="z"`` (default) reproduces them; ``"y"`` gives azimuthal
rotations.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from canonical_network.data.download import DownloadableDataModule
from canonical_network.data.errors import MissingDataFiles
from canonical_network.data.pointclouds import (
    PointCloudDataError,
    PointCloudDataModule,
    seeded_generator,
    split_item,
)
from canonical_network.data.sources import data_readme
from canonical_network.utils.checks import check_bool, check_choice, check_int

log = logging.getLogger(__name__)

MODELNET_NUM_CLASSES = 40
MODELNET_POINTS_PER_SHAPE = 2048
MODELNET_FILE_LISTS = {"train": "train_files.txt", "test": "test_files.txt"}
# The folder the official zip unpacks to; data_dir may point at its parent.
MODELNET_ZIP_FOLDER = "modelnet40_ply_hdf5_2048"
# The allowed values of data.val_split (validate on the test split, or on shapes held out of training).
MODELNET_VAL_SPLIT_CHOICES = ("test", "holdout")
TRAIN_SAMPLING = ("first", "random")


class ModelNetTrainSet(Dataset):
    """Training clouds: the first ``num_points`` points (reference), or a random subset drawn per epoch.

    Args:
        points: (N, 2048, 3) float32.
        labels: (N,) int64.
        num_points: points per returned cloud.
        sampling: ``first`` or ``random`` (``num_points`` distinct points; needs ``(index, draw_seed)``
            items from :class:`~canonical_network.data.pointclouds.SeededDrawSampler`).
    """

    def __init__(self, points: torch.Tensor, labels: torch.Tensor, num_points: int, sampling: str) -> None:
        self.points, self.labels = points, labels
        self.num_points, self.sampling = num_points, sampling

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        index, draw_seed = split_item(item)
        cloud = self.points[index]
        if self.sampling == "random" and draw_seed is not None:
            generator = torch.Generator().manual_seed(draw_seed)
            cloud = cloud[torch.randperm(len(cloud), generator=generator)[: self.num_points]]
        else:
            cloud = cloud[: self.num_points]
        return cloud, self.labels[index]


class ModelNet40DataModule(DownloadableDataModule, PointCloudDataModule):
    """ModelNet40 (40 classes) from the ``modelnet40_ply_hdf5_2048`` HDF5 files.

    Place ``train_files.txt``, ``test_files.txt`` and the ``ply_data_{train,test}*.h5`` files they list under
    ``data_dir`` (or leave them in the ``modelnet40_ply_hdf5_2048/`` folder the zip unpacks to, inside
    ``data_dir``). With ``download=True`` the archive is downloaded, verified and unpacked there when the
    files are missing (:mod:`canonical_network.data.download`); otherwise nothing is downloaded.

    Validation: ``val_split="test"`` validates on the test split, as the reference code (and DGCNN, Vector
    Neurons) does — the paper's numbers come from that protocol, which selects checkpoints on the test set.
    ``val_split="holdout"`` instead holds out ``holdout_size`` random training shapes (drawn with
    ``data_seed``) for validation and trains on the rest.

    Args:
        data_dir: folder holding the files.
        num_points: points per cloud (1,024 in the paper, ≤ 2,048). Evaluation clouds always use the first
            ``num_points`` points, as the reference code does.
        train_sampling: ``first`` (reference) or ``random``: a random subset of ``num_points`` of the 2,048
            points per training sample, redrawn every epoch.
        val_split: ``test`` or ``holdout`` (see above).
        holdout_size: training shapes held out when ``val_split="holdout"``.
        rotation: train/test rotation protocol (``z/z``, ``z/so3``, ``so3/so3``, ...).
        rotation_axis: axis of the ``z`` protocol (see the module docstring).
        data_seed: seed of the fixed evaluation rotations and of the held-out split.
        batch_size, num_workers, pin_memory: DataLoader arguments (32 in the reference).
        download: download the archive into ``data_dir`` in ``prepare_data`` when files are missing.
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "modelnet40"  # configs/data/<config_name>.yaml
    display_name = "ModelNet40"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data
    tasks = ("PointCloudClassificationTask",)  # the task classes (model._target_) that read it

    NUM_CLASSES = MODELNET_NUM_CLASSES
    SOURCE = "modelnet40"

    def __init__(
        self,
        data_dir: str = "data/modelnet40",
        num_points: int = 1024,
        train_sampling: str = "first",
        val_split: str = "test",
        holdout_size: int = 984,
        rotation: str = "z/z",
        rotation_axis: str = "z",
        data_seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        download: bool = False,
    ) -> None:
        super().__init__(rotation, rotation_axis, data_seed, batch_size, num_workers, pin_memory)
        self.download = check_bool("data.download", download)
        check_int("data.num_points", num_points, low=1, high=MODELNET_POINTS_PER_SHAPE)
        check_choice("data.train_sampling", train_sampling, TRAIN_SAMPLING)
        check_choice("data.val_split", val_split, MODELNET_VAL_SPLIT_CHOICES)
        check_int("data.holdout_size", holdout_size, low=1)
        self.data_dir = Path(data_dir)
        self.num_points = num_points
        self.train_sampling = train_sampling
        self.train_draws = train_sampling == "random"
        self.val_split = val_split
        self.holdout_size = holdout_size
        self.num_classes = self.NUM_CLASSES

    # ------------------------------------------------------------------ files
    def _root(self) -> Path:
        nested = self.data_dir / MODELNET_ZIP_FOLDER
        if not (self.data_dir / MODELNET_FILE_LISTS["train"]).is_file() and nested.is_dir():
            return nested
        return self.data_dir

    def _listed_files(self, root: Path, split: str) -> list[str]:
        lines = (root / MODELNET_FILE_LISTS[split]).read_text().splitlines()
        # Lines read e.g. "data/modelnet40_ply_hdf5_2048/ply_data_train0.h5": only the name is used.
        return [Path(line.strip()).name for line in lines if line.strip()]

    def check_files(self) -> dict[str, list[Path]]:
        """The ``.h5`` files of each split; raises ``FileNotFoundError`` naming every missing file."""
        root = self._root()
        missing = [name for name in MODELNET_FILE_LISTS.values() if not (root / name).is_file()]
        files: dict[str, list[Path]] = {}
        if not missing:
            for split in MODELNET_FILE_LISTS:
                names = self._listed_files(root, split)
                if not names:
                    missing.append(f"(any .h5 file: {MODELNET_FILE_LISTS[split]} is empty)")
                files[split] = [root / name for name in names]
                missing += [name for name in names if not (root / name).is_file()]
        if missing:
            raise MissingDataFiles(
                f"ModelNet40 files not found in {root.resolve()}: {', '.join(missing)}. Download "
                "modelnet40_ply_hdf5_2048.zip (PointNet, Qi et al. 2017; originally "
                "https://shapenet.cs.stanford.edu/media/modelnet40_ply_hdf5_2048.zip) on a machine with "
                f"internet access and unzip it so that train_files.txt, test_files.txt and the ply_data_*.h5 "
                f"files lie in {self.data_dir}/ or {self.data_dir}/{MODELNET_ZIP_FOLDER}/ "
                f"(see {data_readme()}); "
                f"or use the embedded dataset: data=synthetic_shapes. {self.download_hint()}."
            )
        return files

    def prepare_files(self) -> None:
        """Check that every listed ``.h5`` file is there and readable (this dataset has no parsed cache)."""
        for paths in self.check_files().values():
            for path in paths:
                self._read_h5(path)

    @staticmethod
    def _read_h5(path: Path) -> tuple[np.ndarray, np.ndarray]:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                points = np.asarray(f["data"][...], dtype=np.float32)
                labels = np.asarray(f["label"][...]).reshape(-1).astype(np.int64)
        except (OSError, KeyError, ValueError, TypeError) as e:
            raise PointCloudDataError(
                f"{path}: not a readable ModelNet40 HDF5 file with datasets 'data' and 'label' "
                f"({type(e).__name__}: {e}). Replace it with the file of the same name from "
                f"modelnet40_ply_hdf5_2048.zip (see {data_readme()})."
            ) from e
        if (
            points.ndim != 3
            or points.shape[1:] != (MODELNET_POINTS_PER_SHAPE, 3)
            or len(labels) != len(points)
        ):
            raise PointCloudDataError(
                f"{path}: expected 'data' (N, {MODELNET_POINTS_PER_SHAPE}, 3) and 'label' (N, 1); got "
                f"{points.shape} and {len(labels)} labels. Replace it with the file from "
                f"modelnet40_ply_hdf5_2048.zip (see {data_readme()})."
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= MODELNET_NUM_CLASSES):
            raise PointCloudDataError(
                f"{path}: labels must lie in [0, {MODELNET_NUM_CLASSES - 1}]; "
                f"got [{labels.min()}, {labels.max()}]"
            )
        return points, labels

    def _read_split(self, paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self._read_h5(path) for path in paths]
        points = np.concatenate([p for p, _ in parts])
        labels = np.concatenate([lab for _, lab in parts])
        return torch.from_numpy(points), torch.from_numpy(labels)

    # ------------------------------------------------------------------ splits
    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # downloads only with data.download=true; lets the module work without a Trainer
        files = self.check_files()
        train_points, train_labels = self._read_split(files["train"])
        test_points, test_labels = self._read_split(files["test"])

        if self.val_split == "holdout":
            if self.holdout_size >= len(train_labels):
                raise ValueError(
                    f"data.holdout_size={self.holdout_size} leaves no training shapes "
                    f"({len(train_labels)} in {MODELNET_FILE_LISTS['train']})"
                )
            order = torch.randperm(len(train_labels), generator=seeded_generator(self.data_seed, "holdout"))
            val_idx, train_idx = (
                order[: self.holdout_size].sort().values,
                order[self.holdout_size :].sort().values,
            )
            val_points = self.rotate_eval(train_points[val_idx, : self.num_points], "holdout")
            self.splits["val"] = TensorDataset(val_points, train_labels[val_idx])
            train_points, train_labels = train_points[train_idx], train_labels[train_idx]

        test = TensorDataset(self.rotate_eval(test_points[:, : self.num_points], "test"), test_labels)
        self.splits["test"] = test
        if self.val_split == "test":
            self.splits["val"] = test  # same clouds, same fixed rotations
        if self.train_sampling == "first":
            train_points = train_points[:, : self.num_points].contiguous()  # the rest is never used
        self.splits["train"] = ModelNetTrainSet(
            train_points, train_labels, self.num_points, self.train_sampling
        )
        log.info("modelnet40 sizes: %s", {k: len(v) for k, v in self.splits.items()})
