"""Point-cloud data (ModelNet40, ShapeNet-part, synthetic shapes), rotation protocol, part-seg metrics.

The ModelNet40 and ShapeNet-part readers are tested on tiny files written here in the real formats.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from canonical_network.data.modelnet import ModelNet40DataModule
from canonical_network.data.pointclouds import (
    ROTATION_PROTOCOLS,
    PointCloudDataError,
    SeededDrawSampler,
    parse_rotation,
)
from canonical_network.data.shapenet import (
    SHAPENET_CATEGORIES,
    SHAPENET_CATEGORY_PARTS,
    ShapeNetPartDataModule,
    sample_point_indices,
)
from canonical_network.data.synthetic_shapes import (
    SYNTHETIC_CATEGORIES,
    SYNTHETIC_CATEGORY_PARTS,
    SYNTHETIC_NUM_PARTS,
    SYNTHETIC_PART_NAMES,
    SyntheticShapesDataModule,
    generate_synthetic_shapes,
)
from canonical_network.groups.euclidean import axis_rotation
from canonical_network.tasks.metrics import (
    PartSegmentationMIoU,
    category_part_mask,
    class_mean_accuracy,
    resolve_category_parts,
    restricted_argmax,
    shape_miou,
)
from tests.helpers import EPS32, rel_tol

#: Rotating float32 points rounds each coordinate by ≤ 3 eps of the cloud's scale (3-term products); a
#: coordinate the rotation keeps meets only exact zeros and a one: 4 eps of the scale bounds both.
ROTATED = 4


class FakeTrainer:
    training = True


def _train_batch(dm, batch):
    """``on_after_batch_transfer`` as Lightning calls it on a training batch."""
    dm.trainer = FakeTrainer()
    try:
        return dm.on_after_batch_transfer(batch, 0)
    finally:
        dm.trainer = None


# ---------------------------------------------------------------------------------------------------------
# ModelNet40
# ---------------------------------------------------------------------------------------------------------
def _write_h5(path: Path, points: np.ndarray, labels: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=points.astype(np.float32))
        f.create_dataset("label", data=labels.reshape(-1, 1).astype(np.uint8))


@pytest.fixture
def modelnet_dir(tmp_path) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Two train files (5 + 3 shapes) and one test file (4 shapes), listed with the zip's path prefix."""
    rng = np.random.default_rng(0)
    arrays = {}
    for name, n in (("ply_data_train0.h5", 5), ("ply_data_train1.h5", 3), ("ply_data_test0.h5", 4)):
        arrays[name] = (rng.normal(size=(n, 2048, 3)).astype(np.float32) * 0.3, rng.integers(0, 40, n))
        _write_h5(tmp_path / name, *arrays[name])
    prefix = "data/modelnet40_ply_hdf5_2048/"
    (tmp_path / "train_files.txt").write_text(f"{prefix}ply_data_train0.h5\n{prefix}ply_data_train1.h5\n")
    (tmp_path / "test_files.txt").write_text(f"{prefix}ply_data_test0.h5\n")
    return tmp_path, arrays


def test_modelnet_reads_h5_files_in_batch_format(modelnet_dir):
    root, arrays = modelnet_dir
    dm = ModelNet40DataModule(data_dir=str(root), num_points=1024, rotation="none/none", batch_size=4)
    dm.setup()
    assert {k: len(v) for k, v in dm.splits.items()} == {"train": 8, "val": 4, "test": 4}
    points, labels = next(iter(dm.test_dataloader()))
    assert points.shape == (4, 1024, 3) and points.dtype == torch.float32
    assert labels.shape == (4,) and labels.dtype == torch.int64
    test_points, test_labels = arrays["ply_data_test0.h5"]
    assert torch.equal(points, torch.from_numpy(test_points[:, :1024]))  # the first 1024, as the reference
    assert torch.equal(labels, torch.from_numpy(test_labels))
    train_points = np.concatenate([arrays["ply_data_train0.h5"][0], arrays["ply_data_train1.h5"][0]])
    cloud, label = dm.splits["train"][6]
    assert torch.equal(cloud, torch.from_numpy(train_points[6, :1024]))
    assert label == arrays["ply_data_train1.h5"][1][1]
    assert dm.splits["val"] is dm.splits["test"]  # default val_split="test", the reference protocol
    y_axis = ModelNet40DataModule(data_dir=str(root), rotation="z/z", rotation_axis="y")
    y_axis.setup()
    rotated = y_axis.splits["test"].tensors[0]
    # about y: y kept (its row and column of the rotation are exact zeros and a one; ROTATED), x and z turned
    # (by O(1), not by rounding)
    assert (rotated[..., 1] - points[..., 1]).abs().max() < rel_tol(points, factor=ROTATED)
    assert not torch.allclose(rotated[..., 2], points[..., 2], atol=1e-3)


def test_modelnet_zip_folder_holdout_and_random_subsets(modelnet_dir, tmp_path_factory):
    root, arrays = modelnet_dir
    parent = tmp_path_factory.mktemp("parent")
    (parent / "modelnet40_ply_hdf5_2048").symlink_to(root, target_is_directory=True)
    dm = ModelNet40DataModule(
        data_dir=str(parent),
        num_points=512,
        val_split="holdout",
        holdout_size=3,
        train_sampling="random",
        rotation="none/none",
    )
    dm.setup()
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (5, 3, 4)
    train = dm.splits["train"]
    a, b, again = train[(0, 11)], train[(0, 12)], train[(0, 11)]
    assert a[0].shape == (512, 3) and torch.equal(a[0], again[0]) and not torch.equal(a[0], b[0])
    full = {tuple(p) for p in train.points[0].tolist()}
    assert len({tuple(p) for p in a[0].tolist()}) == 512 and all(tuple(p) in full for p in a[0].tolist())
    # Held-out shapes are training shapes no longer trained on.
    all_train = np.concatenate([arrays["ply_data_train0.h5"][0], arrays["ply_data_train1.h5"][0]])
    val_first = dm.splits["val"].tensors[0][:, 0].numpy()
    train_first = train.points[:, 0].numpy()
    for row in val_first:
        assert (np.abs(all_train[:, 0] - row).sum(1) == 0).any()
        assert not (np.abs(train_first - row).sum(1) == 0).any()


def test_modelnet_missing_and_corrupt_files(modelnet_dir, tmp_path_factory):
    root, _ = modelnet_dir
    with pytest.raises(
        FileNotFoundError, match=r"train_files\.txt, test_files\.txt.*modelnet40_ply_hdf5_2048\.zip"
    ):
        ModelNet40DataModule(data_dir=str(tmp_path_factory.mktemp("empty"))).setup()
    (root / "ply_data_train1.h5").unlink()
    with pytest.raises(FileNotFoundError, match=r"ply_data_train1\.h5") as info:
        ModelNet40DataModule(data_dir=str(root)).setup()
    assert "ply_data_train0.h5" not in str(info.value)
    (root / "ply_data_train1.h5").write_bytes(b"not an hdf5 file")
    with pytest.raises(PointCloudDataError, match=r"ply_data_train1\.h5"):
        ModelNet40DataModule(data_dir=str(root)).setup()


# ---------------------------------------------------------------------------------------------------------
# ShapeNet-part
# ---------------------------------------------------------------------------------------------------------
SYNSETS = {
    "Airplane": "02691156", "Bag": "02773838", "Cap": "02954340", "Car": "02958343", "Chair": "03001627",
    "Earphone": "03261776", "Guitar": "03467517", "Knife": "03624134", "Lamp": "03636649",
    "Laptop": "03642806", "Motorbike": "03790512", "Mug": "03797390", "Pistol": "03948459",
    "Rocket": "04099429", "Skateboard": "04225987", "Table": "04379243",
}  # fmt: skip
# (category, token, number of points, split): Mug shapes have fewer points than sampled.
SHAPES = [
    ("Airplane", "a1", 300, "train"), ("Airplane", "a2", 260, "train"), ("Mug", "m1", 90, "train"),
    ("Table", "t1", 280, "val"), ("Airplane", "a3", 250, "test"), ("Mug", "m2", 100, "test"),
    ("Table", "t2", 400, "test"),
]  # fmt: skip


def _write_shapenet(root: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    (root / "synsetoffset2category.txt").write_text("".join(f"{c}\t{s}\n" for c, s in SYNSETS.items()))
    (root / "train_test_split").mkdir()
    tables, lists = {}, {"train": [], "val": [], "test": []}
    for category, token, n, split in SHAPES:
        folder = root / SYNSETS[category]
        folder.mkdir(exist_ok=True)
        parts = SHAPENET_CATEGORY_PARTS[SHAPENET_CATEGORIES.index(category)]
        xyz = rng.normal(size=(n, 3)) * 2.0 + 5.0  # off-centre and large: normalisation must fix it
        table = np.concatenate([xyz, rng.normal(size=(n, 3)), rng.choice(parts, size=(n, 1))], axis=1)
        np.savetxt(folder / f"{token}.txt", table, fmt="%.6f")
        tables[token] = table
        lists[split].append(f"shape_data/{SYNSETS[category]}/{token}")
    for split, entries in lists.items():
        (root / f"train_test_split/shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    return tables


@pytest.fixture
def shapenet_dir(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    return tmp_path, _write_shapenet(tmp_path)


def test_shapenet_reads_text_files_in_batch_format(shapenet_dir):
    root, tables = shapenet_dir
    dm = ShapeNetPartDataModule(data_dir=str(root), num_points=128, rotation="none/none", batch_size=3)
    dm.setup()
    # val_split="test" (reference): train + val lists train, the test list validates and tests.
    assert {k: len(v) for k, v in dm.splits.items()} == {"train": 4, "val": 3, "test": 3}
    points, category, parts = next(iter(dm.test_dataloader()))
    assert points.shape == (3, 128, 3) and points.dtype == torch.float32
    assert category.dtype == torch.int64 and parts.shape == (3, 128) and parts.dtype == torch.int64
    names = [SHAPENET_CATEGORIES[c] for c in category.tolist()]
    assert names == ["Airplane", "Mug", "Table"]
    for c, labels in zip(category.tolist(), parts, strict=True):
        assert set(labels.tolist()) <= set(SHAPENET_CATEGORY_PARTS[c])
    # Normalised (centred on the centroid, farthest point on the unit sphere), as pc_normalize does.
    # m2 has 100 points, resampled to 128: every point at least once, and nothing else.
    distances = torch.cdist(points[1].double(), torch.from_numpy(_pc_normalize(tables["m2"][:, :3])).double())
    # float32 normalisation against float64: a centroid of 100 points (≤ 100 eps) and a division, on
    # coordinates ≤ 1: 2⁷ eps32 ≈ 1.5e-5 (a wrong or missing point is off by O(0.1)).
    tol = 2**7 * EPS32
    assert distances.min(dim=1).values.max() < tol and distances.min(dim=0).values.max() < tol
    assert points.norm(dim=-1).max() <= 1 + 2**3 * EPS32  # a 3-term norm and a division: ≤ ~4 eps over 1
    val_dm = ShapeNetPartDataModule(data_dir=str(root), num_points=128, val_split="val")
    val_dm.setup()
    assert (len(val_dm.splits["train"]), len(val_dm.splits["val"])) == (3, 1)


def _pc_normalize(xyz: np.ndarray) -> np.ndarray:
    xyz = xyz - xyz.mean(0)
    return xyz / np.linalg.norm(xyz, axis=1).max()


def test_shapenet_training_samples_are_seeded_draws(shapenet_dir):
    root, _ = shapenet_dir
    dm = ShapeNetPartDataModule(data_dir=str(root), num_points=128, batch_size=2)
    dm.setup()
    train = dm.splits["train"]
    a, again, other = train[(0, 5)], train[(0, 5)], train[(0, 6)]
    assert all(torch.equal(x, y) for x, y in zip(a, again, strict=True))
    assert not torch.equal(a[0], other[0])
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, SeededDrawSampler)
    points, category, parts = next(iter(loader))
    assert points.shape == (2, 128, 3) and parts.shape == (2, 128) and category.shape == (2,)


def test_sample_point_indices_distinct_or_all_plus_repeats():
    gen = torch.Generator().manual_seed(0)
    many = sample_point_indices(500, 128, gen)
    assert len(set(many.tolist())) == 128 and many.max() < 500
    few = sample_point_indices(50, 128, gen)
    assert set(few.tolist()) == set(range(50)) and len(few) == 128


def test_shapenet_cache_is_used_and_invalidated(shapenet_dir):
    root, _ = shapenet_dir
    first = ShapeNetPartDataModule(data_dir=str(root), num_points=64)
    first.setup()
    assert {p.name for p in root.glob("parsed_*.npz")} == {
        "parsed_train.npz",
        "parsed_val.npz",
        "parsed_test.npz",
    }
    for path in root.glob("0*/*.txt"):
        path.unlink()  # only the cache is left: reading must not need the text files
    cached = ShapeNetPartDataModule(data_dir=str(root), num_points=64)
    cached.setup()
    assert torch.equal(cached.splits["test"].tensors[0], first.splits["test"].tensors[0])
    # A changed split list makes the cache stale; the shape files it now needs are missing.
    path = root / "train_test_split/shuffled_test_file_list.json"
    path.write_text(json.dumps(json.loads(path.read_text())[:2]))
    with pytest.raises(FileNotFoundError, match=r"a3\.txt"):
        ShapeNetPartDataModule(data_dir=str(root)).setup()


def test_shapenet_cache_notices_files_replaced_by_older_ones(shapenet_dir):
    """A shape file replaced by one with other points, dated 2007 as unzip leaves it, is parsed again."""
    root, tables = shapenet_dir
    kwargs = dict(data_dir=str(root), num_points=64, rotation="none/none", normalize=False)
    first = ShapeNetPartDataModule(**kwargs)
    first.setup()
    path = root / SYNSETS["Table"] / "t2.txt"
    moved = tables["t2"].copy()
    moved[:, :3] += 10.0  # other content, same number of points (so the same sampled indices)
    path.unlink()
    np.savetxt(path, moved, fmt="%.6f")
    os.utime(path, ns=(1_180_656_000 * 10**9,) * 2)
    again = ShapeNetPartDataModule(**kwargs)
    again.setup()
    names = [SHAPENET_CATEGORIES[c] for c in again.splits["test"].tensors[1].tolist()]
    t2 = names.index("Table")
    old_points, new_points = first.splits["test"].tensors[0][t2], again.splits["test"].tensors[0][t2]
    # both files hold 6-decimal text, exact after +10; read as float32, each value |x| < 16 is off by at most
    # half an ulp at 16, i.e. 8·eps32: the difference of two such values by at most 16·eps32
    assert torch.allclose(new_points, old_points + 10.0, atol=16 * torch.finfo(torch.float32).eps, rtol=0)
    others = [i for i in range(len(names)) if i != t2]
    assert torch.equal(again.splits["test"].tensors[0][others], first.splits["test"].tensors[0][others])


def test_shapenet_corrupt_files_are_not_cached(shapenet_dir):
    root, _ = shapenet_dir
    (root / SYNSETS["Mug"] / "m2.txt").write_text("0.1 0.2 0.3\n")
    with pytest.raises(PointCloudDataError, match=r"m2\.txt: expected rows of 7"):
        ShapeNetPartDataModule(data_dir=str(root)).setup()
    assert not (root / "parsed_test.npz").exists()


def test_shapenet_missing_and_corrupt_files(shapenet_dir, tmp_path_factory):
    root, _ = shapenet_dir
    with pytest.raises(
        FileNotFoundError, match=r"synsetoffset2category\.txt.*shuffled_train_file_list\.json"
    ):
        ShapeNetPartDataModule(data_dir=str(tmp_path_factory.mktemp("empty"))).setup()
    (root / SYNSETS["Mug"] / "m2.txt").unlink()
    (root / SYNSETS["Table"] / "t2.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"m2\.txt, .*t2\.txt.*benchmark_v0_normal\.zip"):
        ShapeNetPartDataModule(data_dir=str(root)).setup()
    (root / SYNSETS["Mug"] / "m2.txt").write_text("0.1 0.2 0.3\n")
    (root / SYNSETS["Table"] / "t2.txt").write_text("0 0 0 0 0 1 3\n")  # part 3 is an Airplane part
    with pytest.raises(PointCloudDataError, match=r"(?s)m2\.txt: expected rows of 7.*t2\.txt: part labels"):
        ShapeNetPartDataModule(data_dir=str(root)).setup()


def test_shapenet_never_downloads(shapenet_dir, monkeypatch):
    import urllib.request

    def fail(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    monkeypatch.setattr(urllib.request, "urlretrieve", fail)
    root, _ = shapenet_dir
    ShapeNetPartDataModule(data_dir=str(root)).setup()


# ---------------------------------------------------------------------------------------------------------
# Synthetic shapes
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic() -> dict[str, np.ndarray]:
    return generate_synthetic_shapes(140, 512, seed=3)


def test_synthetic_is_deterministic_by_seed(synthetic):
    again = generate_synthetic_shapes(140, 512, seed=3)
    assert all(np.array_equal(synthetic[k], again[k]) for k in synthetic)
    other = generate_synthetic_shapes(140, 512, seed=4)
    assert not np.array_equal(synthetic["points"], other["points"])


def test_synthetic_shapes_labels_and_coverage(synthetic):
    points, categories, parts = synthetic["points"], synthetic["categories"], synthetic["part_labels"]
    assert points.shape == (140, 512, 3) and points.dtype == np.float32
    assert categories.dtype == np.int64 and parts.dtype == np.int64 and parts.shape == (140, 512)
    assert np.array_equal(np.bincount(categories), np.full(len(SYNTHETIC_CATEGORIES), 20))  # balanced
    assert set(np.unique(parts)) == set(range(SYNTHETIC_NUM_PARTS))  # every part appears somewhere
    for c, allowed in enumerate(SYNTHETIC_CATEGORY_PARTS):
        assert set(np.unique(parts[categories == c])) == set(allowed)
    assert np.abs(points.mean(axis=1)).max() < 0.01  # centred (up to noise)
    assert np.linalg.norm(points, axis=-1).max() < 1.06  # unit sphere plus noise


def _part_mean(data, category: str, part: str, axis: int) -> float:
    c = SYNTHETIC_CATEGORIES.index(category)
    part_id = SYNTHETIC_CATEGORY_PARTS[c][SYNTHETIC_PART_NAMES[category].index(part)]
    mask = data["part_labels"] == part_id
    return float(data["points"][..., axis][mask].mean())


@pytest.mark.parametrize(
    "category, above, below",
    [("airplane", "tail", "engine"), ("cap", "crown", "visor"), ("chair", "back", "leg"),
     ("lamp", "shade", "base"), ("table", "top", "leg")],
)  # fmt: skip
def test_synthetic_canonical_pose_is_z_up(synthetic, category, above, below):
    assert (
        _part_mean(synthetic, category, above, axis=2) > _part_mean(synthetic, category, below, axis=2) + 0.1
    )


@pytest.mark.parametrize(
    "category, front, back",
    [("airplane", "body", "tail"), ("cap", "visor", "crown"), ("chair", "seat", "back"),
     ("knife", "blade", "handle"), ("lamp", "shade", "base"), ("mug", "handle", "body"),
     ("table", "drawer", "top")],
)  # fmt: skip
def test_synthetic_canonical_pose_faces_plus_x(synthetic, category, front, back):
    assert (
        _part_mean(synthetic, category, front, axis=0) > _part_mean(synthetic, category, back, axis=0) + 0.1
    )


def _far_point_distance(a: np.ndarray, b: np.ndarray) -> float:
    """99th percentile of the distances from each point of one cloud to the nearest point of the other."""
    from scipy.spatial import cKDTree

    nearest = np.concatenate([cKDTree(b).query(a)[0], cKDTree(a).query(b)[0]])
    return float(np.quantile(nearest, 0.99))


def test_synthetic_shapes_have_no_rotational_symmetry():
    """A canonicalizer can only recover the pose of a shape that no rotation maps onto itself: after a
    half or quarter turn, some part lies clearly away from the unturned shape (farther than the gaps
    between two independent samplings of the same surface)."""
    data = generate_synthetic_shapes(70, 2048, seed=0, noise_std=0.0)  # ten of each category
    turns = [("x", math.pi), ("y", math.pi), ("z", math.pi), ("z", math.pi / 2)]
    for points in data["points"].astype(np.float64):
        first, second = points[::2], points[1::2]  # two independent samplings of the surface
        gaps = _far_point_distance(first, second)
        for axis, angle in turns:
            turned = second @ axis_rotation(torch.tensor(angle, dtype=torch.float64), axis).numpy().T
            assert _far_point_distance(first, turned) > 1.5 * gaps


def test_synthetic_data_module_formats_and_split_streams():
    cls = SyntheticShapesDataModule(num_train=14, num_val=7, num_test=7, num_points=64, batch_size=5)
    cls.setup()
    points, labels = next(iter(cls.train_dataloader()))
    assert points.shape == (5, 64, 3) and points.dtype == torch.float32 and labels.dtype == torch.int64
    seg = SyntheticShapesDataModule(
        task="segmentation", num_train=30, num_val=7, num_test=7, num_points=64, batch_size=5
    )
    seg.setup()
    points, category, parts = next(iter(seg.val_dataloader()))
    assert points.shape == (5, 64, 3) and category.shape == (5,) and parts.shape == (5, 64)
    assert parts.dtype == torch.int64 and parts.max() < seg.num_parts == SYNTHETIC_NUM_PARTS
    # Each split has its own stream: a larger training set leaves the test set unchanged.
    assert torch.equal(seg.splits["test"].tensors[0], cls.splits["test"].tensors[0])
    assert seg.category_parts == SYNTHETIC_CATEGORY_PARTS and cls.num_classes == len(SYNTHETIC_CATEGORIES)
    with pytest.raises(ValueError, match="classification"):
        SyntheticShapesDataModule(task="detection")


# ---------------------------------------------------------------------------------------------------------
# Rotation protocol
# ---------------------------------------------------------------------------------------------------------
def test_rotation_protocol_validation():
    assert parse_rotation("z/so3") == ("z", "so3")
    assert {"z/z", "z/so3", "so3/so3", "none/none"} <= set(ROTATION_PROTOCOLS)
    with pytest.raises(ValueError, match=r"data\.rotation must be one of \['z/z', 'z/so3', 'so3/so3'"):
        SyntheticShapesDataModule(rotation="so3")


def _test_points(rotation: str, seed: int = 0) -> torch.Tensor:
    dm = SyntheticShapesDataModule(num_train=7, num_val=7, num_test=14, num_points=64, rotation=rotation,
                                   data_seed=seed)  # fmt: skip
    dm.setup()
    return dm.splits["test"].tensors[0]


def test_fixed_test_rotations():
    upright = _test_points("none/none")
    z = _test_points("z/z")
    # z rotations keep the up coordinate (exact zeros and a one in its row: ROTATED) and the norms (a
    # rotation rounds each coordinate by ≤ 3 eps of the norm, the norm itself ≤ 2 eps: 2·ROTATED)
    assert (z[..., 2] - upright[..., 2]).abs().max() < rel_tol(upright, factor=ROTATED)
    assert not torch.allclose(z[..., :2], upright[..., :2], atol=1e-3)  # moved by O(1), not by rounding
    assert (z.norm(dim=-1) - upright.norm(dim=-1)).abs().max() < rel_tol(upright, factor=2 * ROTATED)
    so3 = _test_points("z/so3")
    assert not torch.allclose(so3[..., 2], upright[..., 2], atol=1e-3)
    assert (so3.norm(dim=-1) - upright.norm(dim=-1)).abs().max() < rel_tol(upright, factor=2 * ROTATED)
    assert torch.equal(so3, _test_points("so3/so3"))  # fixed per test sample, whatever the training side
    assert torch.equal(z, _test_points("z/z"))  # identical across instantiations
    assert not torch.equal(so3, _test_points("z/so3", seed=1))


def test_training_rotations_fresh_per_batch_and_only_in_training():
    points = torch.from_numpy(generate_synthetic_shapes(8, 64, seed=0)["points"])
    batch = (points, torch.zeros(8, dtype=torch.long))
    z = SyntheticShapesDataModule(rotation="z/so3")
    assert z.on_after_batch_transfer(batch, 0)[0] is points  # no trainer: untouched
    first, second = _train_batch(z, batch)[0], _train_batch(z, batch)[0]
    assert (first[..., 2] - points[..., 2]).abs().max() < rel_tol(points, factor=ROTATED)
    assert not torch.allclose(first, second, atol=1e-3)  # a fresh rotation per batch: O(1) apart
    so3 = _train_batch(SyntheticShapesDataModule(rotation="so3/so3"), batch)[0]
    assert not torch.allclose(so3[..., 2], points[..., 2], atol=1e-3)
    assert (so3.norm(dim=-1) - points.norm(dim=-1)).abs().max() < rel_tol(points, factor=2 * ROTATED)
    assert _train_batch(SyntheticShapesDataModule(rotation="none/so3"), batch)[0] is points
    evaluating = SyntheticShapesDataModule(rotation="so3/so3")
    evaluating.trainer = type("Evaluating", (), {"training": False})()
    assert evaluating.on_after_batch_transfer(batch, 0)[0] is points


def test_seeded_draw_sampler():
    sampler = SeededDrawSampler(range(10), seed=3)
    first = list(sampler)
    assert sorted(i for i, _ in first) == list(range(10)) and first == list(
        SeededDrawSampler(range(10), seed=3)
    )
    sampler.set_epoch(1)
    assert list(sampler) != first


# ---------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------
CATEGORY_PARTS = ((0, 1, 2), (3, 4))  # two categories, five parts


def _logits_for(preds: list[list[int]], num_parts: int = 5) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(preds), num_parts).float()


def test_shape_miou_by_hand_with_absent_part():
    mask = category_part_mask(CATEGORY_PARTS)
    target = torch.tensor([[0, 0, 1, 1]])
    preds = torch.tensor([[0, 1, 1, 1]])
    # part 0: 1/2, part 1: 2/3, part 2 absent from both: 1 → mean 13/18
    assert torch.allclose(
        shape_miou(preds, target, torch.tensor([0]), mask), torch.tensor([13 / 18.0]).double()
    )
    # a part predicted but absent from the target has IoU 0
    preds = torch.tensor([[0, 0, 1, 2]])
    assert torch.allclose(
        shape_miou(preds, target, torch.tensor([0]), mask), torch.tensor([(1 + 0.5 + 0) / 3]).double()
    )


def test_predictions_are_restricted_to_the_category():
    mask = category_part_mask(CATEGORY_PARTS)
    logits = torch.tensor([[[0.0, 1.0, 0.5, 9.0, 9.0], [0.2, 0.1, 0.0, 0.0, 9.0]]])  # parts 3, 4 belong to 1
    assert restricted_argmax(logits, torch.tensor([0]), mask).tolist() == [[1, 0]]
    assert restricted_argmax(logits, torch.tensor([1]), mask).tolist() == [[3, 4]]
    metric = PartSegmentationMIoU(CATEGORY_PARTS)
    metric.update(logits, torch.tensor([[1, 0]]), torch.tensor([0]))
    assert metric.compute()["instance_miou"] == pytest.approx(1.0)  # part 2 absent from both: 1


def test_class_miou_vs_instance_miou_unbalanced():
    metric = PartSegmentationMIoU(CATEGORY_PARTS)
    # three perfect shapes of category 0, in two batches
    target = torch.tensor([[0, 1, 2, 2], [0, 0, 1, 2]])
    metric.update(_logits_for(target.tolist()), target, torch.tensor([0, 0]))
    metric.update(_logits_for([[2, 1, 1, 0]]), torch.tensor([[2, 1, 1, 0]]), torch.tensor([0]))
    # one shape of category 1 with mIoU 1/3: part 3 IoU 1/3 (1 of 3), part 4 IoU 1/3 (1 of 3)
    metric.update(_logits_for([[3, 3, 4, 4]]), torch.tensor([[3, 4, 4, 3]]), torch.tensor([1]))
    result = metric.compute()
    assert result["instance_miou"] == pytest.approx((3 * 1.0 + 1 / 3) / 4)
    assert result["class_miou"] == pytest.approx((1.0 + 1 / 3) / 2)
    assert torch.allclose(metric.per_category(), torch.tensor([1.0, 1 / 3]))
    metric.reset()
    assert metric.shape_count.sum() == 0


def test_metric_checks_and_names():
    metric = PartSegmentationMIoU(CATEGORY_PARTS)
    with pytest.raises(ValueError, match="do not belong"):
        metric.update(_logits_for([[0, 3]]), torch.tensor([[0, 3]]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"\(B, P, 5\)"):
        metric.update(torch.zeros(1, 2, 4), torch.zeros(1, 2, dtype=torch.long), torch.tensor([0]))
    shapenet = PartSegmentationMIoU()  # ShapeNet-part by default
    assert (shapenet.num_categories, shapenet.num_parts) == (16, 50)
    assert resolve_category_parts("synthetic_shapes") == SYNTHETIC_CATEGORY_PARTS
    with pytest.raises(ValueError, match="shapenet_part"):
        resolve_category_parts("modelnet")


def test_class_mean_accuracy_by_hand():
    metric = class_mean_accuracy(num_classes=3)
    labels = torch.tensor([0, 0, 0, 1, 2])
    preds = torch.tensor([0, 0, 1, 1, 0])  # per class: 2/3, 1, 0 → 5/9 (overall accuracy 3/5)
    metric.update(torch.nn.functional.one_hot(preds, 3).float(), labels)
    assert metric.compute() == pytest.approx(5 / 9)
