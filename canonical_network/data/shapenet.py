"""ShapeNet-part segmentation data (paper §5.3, Table 5b) from PointNet++'s
``shapenetcore_partanno_segmentation_benchmark_v0_normal`` files.

The benchmark (Yi et al. 2016, as packaged for PointNet++) holds one text file per shape,
``<synset>/<token>.txt``, with rows ``x y z nx ny nz part`` (part: a global part id 0..49), plus
``synsetoffset2category.txt`` (category name, synset folder) and the official split
``train_test_split/shuffled_{train,val,test}_file_list.json`` (entries ``shape_data/<synset>/<token>``):
12,137 / 1,870 / 2,874 shapes of 16 categories with 50 parts in all. Normals are not used.

Batches are ``(points, category, part_labels)``: points (B, P, 3) float32, category (B,) int64 (index into
:data:`SHAPENET_CATEGORIES`), part_labels (B, P) int64 (global part ids, see :data:`SHAPENET_CATEGORY_PARTS`).

The text is parsed and checked once per split and cached as ``parsed_{split}.npz`` beside the files, keyed
on the content of the files it was parsed from (:mod:`canonical_network.data.cache`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from canonical_network.data.cache import SourceCache
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

# Category order of synsetoffset2category.txt (alphabetical); the index is the `category` of a batch.
SHAPENET_CATEGORIES = (
    "Airplane", "Bag", "Cap", "Car", "Chair", "Earphone", "Guitar", "Knife",
    "Lamp", "Laptop", "Motorbike", "Mug", "Pistol", "Rocket", "Skateboard", "Table",
)  # fmt: skip
_PARTS_PER_CATEGORY = (4, 2, 2, 4, 4, 3, 3, 2, 4, 2, 6, 2, 3, 3, 3, 3)
# Global part ids are contiguous per category in this order (Airplane 0-3, Bag 4-5, ..., Table 47-49).
SHAPENET_CATEGORY_PARTS: tuple[tuple[int, ...], ...] = tuple(
    tuple(range(sum(_PARTS_PER_CATEGORY[:c]), sum(_PARTS_PER_CATEGORY[: c + 1])))
    for c in range(len(SHAPENET_CATEGORIES))
)
SHAPENET_NUM_PARTS = 50
SHAPENET_SPLITS = ("train", "val", "test")
SHAPENET_CATEGORY_FILE = "synsetoffset2category.txt"
SHAPENET_SPLIT_FILES = {s: f"train_test_split/shuffled_{s}_file_list.json" for s in SHAPENET_SPLITS}
SHAPENET_ZIP_FOLDER = "shapenetcore_partanno_segmentation_benchmark_v0_normal"
# Version of the parsed_{split}.npz layout: bump when parsing or checks change.
_CACHE_FORMAT = 2
# The allowed values of data.val_split (validate on the official test list, or on its val list).
SHAPENET_VAL_SPLIT_CHOICES = ("test", "val")

_HOW_TO_GET = (
    "Download shapenetcore_partanno_segmentation_benchmark_v0_normal.zip (PointNet++, Qi et al. 2017; "
    "originally https://shapenet.cs.stanford.edu/media/"
    "shapenetcore_partanno_segmentation_benchmark_v0_normal.zip) "
    "on a machine with internet access and unzip it so that synsetoffset2category.txt, train_test_split/ and "
    "the <synset>/ folders lie in {data_dir}/ or {data_dir}/"
    + SHAPENET_ZIP_FOLDER
    + "/ (see {readme}); "
    "or use the embedded dataset: data=synthetic_shapes with task=segmentation."
)


def sample_point_indices(num_available: int, num_points: int, generator: torch.Generator) -> torch.Tensor:
    """``num_points`` indices into a shape of ``num_available`` points: distinct when there are enough,
    otherwise every point once plus random repeats, in random order."""
    if num_available >= num_points:
        return torch.randperm(num_available, generator=generator)[:num_points]
    extra = torch.randint(num_available, (num_points - num_available,), generator=generator)
    index = torch.cat([torch.arange(num_available), extra])
    return index[torch.randperm(num_points, generator=generator)]


class ShapeNetPartShapes:
    """All shapes of one or more splits, concatenated: shape ``i`` is ``points[offsets[i]:offsets[i+1]]``.

    Attributes:
        points: (M, 3) float32, every shape's points one after another.
        labels: (M,) uint8 global part ids (int64 in :meth:`sample`; uint8 saves ~300 MB on the full set).
        offsets: (N + 1,) int64.
        categories: (N,) int64.
        ids: N strings ``<synset>/<token>``.
    """

    def __init__(self, points, labels, offsets, categories, ids) -> None:
        self.points, self.labels, self.offsets = points, labels, offsets
        self.categories, self.ids = categories, list(ids)

    def __len__(self) -> int:
        return len(self.categories)

    def sample(
        self, index: int, num_points: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape ``index`` resampled to ``num_points``: points (P, 3), part labels (P,)."""
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        chosen = start + sample_point_indices(stop - start, num_points, generator)
        return self.points[chosen], self.labels[chosen].long()

    @staticmethod
    def concatenate(groups: list[ShapeNetPartShapes]) -> ShapeNetPartShapes:
        if len(groups) == 1:
            return groups[0]
        shifts = np.cumsum([0] + [len(g.points) for g in groups[:-1]])
        offsets = torch.cat(
            [groups[0].offsets[:1]] + [g.offsets[1:] + int(s) for g, s in zip(groups, shifts, strict=True)]
        )
        return ShapeNetPartShapes(
            torch.cat([g.points for g in groups]),
            torch.cat([g.labels for g in groups]),
            offsets,
            torch.cat([g.categories for g in groups]),
            [i for g in groups for i in g.ids],
        )


class ShapeNetPartTrainSet(Dataset):
    """Training shapes, resampled to ``num_points`` with a fresh draw every epoch (``(index, draw_seed)``
    items from :class:`~canonical_network.data.pointclouds.SeededDrawSampler`)."""

    def __init__(self, shapes: ShapeNetPartShapes, num_points: int) -> None:
        self.shapes, self.num_points = shapes, num_points

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index, draw_seed = split_item(item)
        generator = torch.Generator().manual_seed(index if draw_seed is None else draw_seed)
        points, labels = self.shapes.sample(index, self.num_points, generator)
        return points, self.shapes.categories[index], labels


class ShapeNetPartDataModule(DownloadableDataModule, PointCloudDataModule):
    """ShapeNet-part (16 categories, 50 parts) from the PointNet++ text files.

    With ``download=True`` the archive is downloaded, verified and unpacked into ``data_dir`` when the files
    are missing (:mod:`canonical_network.data.download`); otherwise nothing is downloaded.

    Validation: ``val_split="test"`` trains on the official train + val lists and validates on the test
    list, as the reference code does (its ``trainval`` / ``test``); ``val_split="val"`` trains on train and
    validates on val. Testing always uses the test list.

    Every shape is centred on its centroid and scaled into the unit sphere (``normalize``, the reference's
    ``pc_normalize``), then resampled to ``num_points``: distinct points when it has enough, every point
    plus random repeats otherwise. Training shapes are resampled every epoch; validation and test shapes
    once, with ``data_seed``, and rotated by fixed rotations (see
    :mod:`~canonical_network.data.pointclouds`).

    Up axis: the files store shapes with y up; the reference code's ``z`` protocol rotates about the literal
    z axis, which ``rotation_axis="z"`` (default) reproduces.

    Args:
        data_dir: folder holding the files.
        num_points: points per shape (2,048 in the paper).
        val_split: ``test`` or ``val`` (see above).
        normalize: centre and scale each shape into the unit sphere.
        rotation: train/test rotation protocol (``z/so3``, ``so3/so3``, ...).
        rotation_axis: axis of the ``z`` protocol.
        data_seed: seed of the evaluation point samples and rotations.
        batch_size, num_workers, pin_memory: DataLoader arguments.
        download: download the archive into ``data_dir`` in ``prepare_data`` when files are missing.
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "shapenet_part"  # configs/data/<config_name>.yaml
    display_name = "ShapeNet-part"
    paper_data = True  # the paper's numbers were measured on (a subset of) this data
    tasks = ("PartSegmentationTask",)  # the task classes (model._target_) that read it

    SOURCE = "shapenet_part"
    NUM_CATEGORIES = len(SHAPENET_CATEGORIES)
    NUM_PARTS = SHAPENET_NUM_PARTS
    CATEGORY_PARTS = SHAPENET_CATEGORY_PARTS
    train_draws = True

    def __init__(
        self,
        data_dir: str = "data/shapenet_part",
        num_points: int = 2048,
        val_split: str = "test",
        normalize: bool = True,
        rotation: str = "z/so3",
        rotation_axis: str = "z",
        data_seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        download: bool = False,
    ) -> None:
        super().__init__(rotation, rotation_axis, data_seed, batch_size, num_workers, pin_memory)
        self.download = check_bool("data.download", download)
        check_int("data.num_points", num_points, low=1)
        check_choice("data.val_split", val_split, SHAPENET_VAL_SPLIT_CHOICES)
        self.data_dir = Path(data_dir)
        self.num_points = num_points
        self.val_split = val_split
        self.normalize = normalize
        self.num_categories = self.NUM_CATEGORIES
        self.num_parts = self.NUM_PARTS
        self.category_parts = self.CATEGORY_PARTS
        self._caches: dict[tuple, SourceCache] = {}  # one per split list, so each file is hashed once

    # ------------------------------------------------------------------ files
    def _root(self) -> Path:
        nested = self.data_dir / SHAPENET_ZIP_FOLDER
        if not (self.data_dir / SHAPENET_CATEGORY_FILE).is_file() and nested.is_dir():
            return nested
        return self.data_dir

    def _missing_error(self, root: Path, missing: list[str]) -> MissingDataFiles:
        shown = missing if len(missing) <= 10 else missing[:10] + [f"... ({len(missing) - 10} more)"]
        return MissingDataFiles(
            f"ShapeNet-part files not found in {root.resolve()}: {', '.join(shown)}. "
            + _HOW_TO_GET.format(data_dir=self.data_dir, readme=data_readme())
            + f" {self.download_hint()}."
        )

    def _synsets(self, root: Path) -> dict[str, int]:
        """synset folder → category index, from synsetoffset2category.txt."""
        synsets: dict[str, int] = {}
        path = root / SHAPENET_CATEGORY_FILE
        for line in path.read_text().splitlines():
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2 or fields[0] not in SHAPENET_CATEGORIES:
                raise PointCloudDataError(
                    f"{path}: expected lines '<category> <synset>' with a category among "
                    f"{list(SHAPENET_CATEGORIES)}; "
                    f"got {line!r}. " + _HOW_TO_GET.format(data_dir=self.data_dir, readme=data_readme())
                )
            synsets[fields[1]] = SHAPENET_CATEGORIES.index(fields[0])
        return synsets

    def _split_ids(self, root: Path, split: str) -> list[str]:
        path = root / SHAPENET_SPLIT_FILES[split]
        try:
            entries = json.loads(path.read_text())
            # "shape_data/<synset>/<token>" -> "<synset>/<token>"
            return ["/".join(str(entry).split("/")[-2:]) for entry in entries]
        except (ValueError, TypeError) as e:
            raise PointCloudDataError(
                f"{path}: not a JSON list of 'shape_data/<synset>/<token>' entries ({e}). "
                + _HOW_TO_GET.format(data_dir=self.data_dir, readme=data_readme())
            ) from e

    def check_files(self, splits: tuple[str, ...] = SHAPENET_SPLITS) -> dict[str, list[str]]:
        """Shape ids of each split; raises ``FileNotFoundError`` naming every missing file.

        Shape files are only required for splits without a current cache (one parsed from files with the
        content they have now; shape files deleted after parsing are not needed).
        """
        root = self._root()
        missing = [
            name
            for name in [SHAPENET_CATEGORY_FILE, *SHAPENET_SPLIT_FILES.values()]
            if not (root / name).is_file()
        ]
        if missing:
            raise self._missing_error(root, missing)
        ids = {split: self._split_ids(root, split) for split in splits}
        for split in splits:
            if not self._cache(root, split, ids[split]).is_current():
                missing += [f"{i}.txt" for i in ids[split] if not (root / f"{i}.txt").is_file()]
        if missing:
            raise self._missing_error(root, missing)
        return ids

    # ------------------------------------------------------------------ parsing and cache
    def _cache(self, root: Path, split: str, ids: list[str]) -> SourceCache:
        """``parsed_{split}.npz``, keyed on the category file and the split's shape files (their names, in
        order, and their content)."""
        name = (root, split, tuple(ids))
        if name not in self._caches:
            sources = [root / SHAPENET_CATEGORY_FILE] + [root / f"{shape_id}.txt" for shape_id in ids]
            self._caches[name] = SourceCache(
                root / f"parsed_{split}.npz",
                sources,
                key={"format": _CACHE_FORMAT},
                what=f"ShapeNet-part {split}",
            )
        return self._caches[name]

    @staticmethod
    def _shapes(arrays: dict[str, np.ndarray], ids: list[str]) -> ShapeNetPartShapes:
        return ShapeNetPartShapes(
            torch.from_numpy(arrays["points"]),
            torch.from_numpy(arrays["labels"]),
            torch.from_numpy(arrays["offsets"]),
            torch.from_numpy(arrays["categories"]),
            ids,
        )

    def _parse(self, root: Path, ids: list[str], synsets: dict[str, int]) -> dict[str, np.ndarray]:
        points, labels, counts, categories, problems = [], [], [], [], []
        for shape_id in ids:
            path = root / f"{shape_id}.txt"
            synset = shape_id.split("/")[0]
            if synset not in synsets:
                problems.append(f"{path}: synset {synset} is not listed in {SHAPENET_CATEGORY_FILE}")
                continue
            category = synsets[synset]
            # np.fromstring with a separator parses whitespace-separated text in C, far faster than loadtxt
            # (timed by hand, not recorded: docs/measurements.md).
            table = np.fromstring(path.read_text(), dtype=np.float32, sep=" ")
            if table.size == 0 or table.size % 7:
                problems.append(
                    f"{path}: expected rows of 7 numbers (x y z nx ny nz part); got {table.size} numbers"
                )
                continue
            table = table.reshape(-1, 7)
            part = table[:, 6].astype(np.int64)
            allowed = SHAPENET_CATEGORY_PARTS[category]
            if part.min() < allowed[0] or part.max() > allowed[-1] or not np.array_equal(part, table[:, 6]):
                problems.append(
                    f"{path}: part labels must be integers in {allowed[0]}..{allowed[-1]} "
                    f"({SHAPENET_CATEGORIES[category]}); got {table[:, 6].min():g}..{table[:, 6].max():g}"
                )
                continue
            points.append(table[:, :3])
            labels.append(part.astype(np.uint8))
            counts.append(len(table))
            categories.append(category)
        if problems:
            shown = problems if len(problems) <= 10 else problems[:10] + [f"... ({len(problems) - 10} more)"]
            raise PointCloudDataError(
                "ShapeNet-part files are corrupt:\n  "
                + "\n  ".join(shown)
                + "\nReplace them: "
                + _HOW_TO_GET.format(data_dir=self.data_dir, readme=data_readme())
            )
        return {
            "points": np.concatenate(points) if points else np.zeros((0, 3), np.float32),
            "labels": np.concatenate(labels) if labels else np.zeros(0, np.uint8),
            "offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            "categories": np.array(categories, dtype=np.int64),
        }

    def prepare_files(self) -> None:
        """Check the files and build the ``parsed_{split}.npz`` caches (what :meth:`setup` reads), without
        the splits."""
        ids = self.check_files()
        root = self._root()
        synsets = self._synsets(root)
        for split in SHAPENET_SPLITS:
            self._read_split(root, split, ids[split], synsets)

    def _read_split(
        self, root: Path, split: str, ids: list[str], synsets: dict[str, int]
    ) -> ShapeNetPartShapes:
        arrays = self._cache(root, split, ids).load_or_build(lambda: self._parse(root, ids, synsets))
        return self._shapes(arrays, ids)

    @staticmethod
    def _normalize(shapes: ShapeNetPartShapes) -> None:
        """Centre each shape on its centroid and scale it into the unit sphere, in place."""
        if len(shapes) == 0:
            return
        points = shapes.points.numpy()
        starts = shapes.offsets[:-1].numpy()
        counts = np.diff(shapes.offsets.numpy())
        owner = np.repeat(np.arange(len(counts)), counts)
        points -= (np.add.reduceat(points, starts, axis=0) / counts[:, None])[owner]
        radius = np.maximum.reduceat(np.sqrt((points**2).sum(axis=1)), starts)
        points /= np.maximum(radius, np.finfo(np.float32).tiny)[owner, None]

    # ------------------------------------------------------------------ splits
    def _eval_set(self, shapes: ShapeNetPartShapes, split: str) -> TensorDataset:
        generator = seeded_generator(self.data_seed, "points", split)
        samples = [shapes.sample(i, self.num_points, generator) for i in range(len(shapes))]
        points = torch.stack([p for p, _ in samples]) if samples else torch.zeros(0, self.num_points, 3)
        labels = (
            torch.stack([lab for _, lab in samples])
            if samples
            else torch.zeros(0, self.num_points, dtype=torch.long)
        )
        return TensorDataset(self.rotate_eval(points, split), shapes.categories, labels)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()  # downloads only with data.download=true; lets the module work without a Trainer
        ids = self.check_files()
        root = self._root()
        synsets = self._synsets(root)
        shapes = {split: self._read_split(root, split, ids[split], synsets) for split in SHAPENET_SPLITS}
        if self.normalize:
            for group in shapes.values():
                self._normalize(group)
        train = [shapes["train"], shapes["val"]] if self.val_split == "test" else [shapes["train"]]
        self.splits["train"] = ShapeNetPartTrainSet(ShapeNetPartShapes.concatenate(train), self.num_points)
        self.splits["test"] = self._eval_set(shapes["test"], "test")
        self.splits["val"] = (
            self.splits["test"] if self.val_split == "test" else self._eval_set(shapes["val"], "val")
        )
        log.info("shapenet_part sizes: %s", {k: len(v) for k, v in self.splits.items()})
