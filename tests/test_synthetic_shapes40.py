"""The 40-class synthetic shapes (data=synthetic_shapes40): sizes, determinism, classes that differ, the
difficulty knobs, the data module and its config, and that nothing is ever downloaded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from canonical_network.data.synthetic_shapes import SyntheticShapesDataModule, generate_synthetic_shapes
from canonical_network.data.synthetic_shapes40 import (
    SHAPES40_CLASS_PARTS,
    SHAPES40_CLASSES,
    SHAPES40_FAMILIES,
    SHAPES40_NUM_PARTS,
    SHAPES40_PART_NAMES,
    SyntheticShapes40DataModule,
    generate_synthetic_shapes40,
)
from canonical_network.groups.euclidean import axis_rotation

#: the anisotropic scale jitter the shape tests were calibrated at (the generator's default when they were written)
FIXED_JITTER = 0.35


@pytest.fixture(scope="module")
def shapes() -> dict[str, np.ndarray]:
    # ten of each class; the scale jitter pinned at the value test_classes_differ's threshold was set for (the
    # default moves with the set's difficulty, docs/measurements.md)
    return generate_synthetic_shapes40(400, 256, seed=3, scale_jitter=FIXED_JITTER)


def test_forty_balanced_classes_in_ten_families_of_four(shapes):
    assert len(SHAPES40_CLASSES) == len(set(SHAPES40_CLASSES)) == 40
    assert {f: SHAPES40_FAMILIES.count(f) for f in SHAPES40_FAMILIES} == {f: 4 for f in set(SHAPES40_FAMILIES)}
    assert len(set(SHAPES40_FAMILIES)) == 10
    points, labels, parts = shapes["points"], shapes["categories"], shapes["part_labels"]
    assert points.shape == (400, 256, 3) and points.dtype == np.float32 and np.isfinite(points).all()
    assert labels.dtype == np.int64 and np.array_equal(np.bincount(labels), np.full(40, 10))
    assert parts.shape == (400, 256) and parts.dtype == np.int64
    assert np.abs(points.mean(axis=1)).max() < 0.02  # centred up to noise
    assert np.linalg.norm(points, axis=-1).max() < 1.2  # unit sphere plus noise (0.03 a coordinate)
    # Part ids are global, contiguous per class, and each class uses only its own.
    assert SHAPES40_CLASS_PARTS[-1][-1] + 1 == SHAPES40_NUM_PARTS
    for c, name in enumerate(SHAPES40_CLASSES):
        assert len(SHAPES40_CLASS_PARTS[c]) == len(SHAPES40_PART_NAMES[name])
        assert set(np.unique(parts[labels == c])) <= set(SHAPES40_CLASS_PARTS[c])


def test_deterministic_by_seed(shapes):
    again = generate_synthetic_shapes40(400, 256, seed=3, scale_jitter=FIXED_JITTER)
    assert all(np.array_equal(shapes[k], again[k]) for k in shapes)
    generator = generate_synthetic_shapes40(400, 256, seed=np.random.default_rng(3), scale_jitter=FIXED_JITTER)
    assert all(np.array_equal(shapes[k], generator[k]) for k in shapes)
    other = generate_synthetic_shapes40(400, 256, seed=4, scale_jitter=FIXED_JITTER)
    assert not np.array_equal(shapes["points"], other["points"])


def _descriptor(points: np.ndarray) -> np.ndarray:
    """Per cloud (N, P, 3) → (N, 3 + 3 + 8): extents, second moments and a histogram of heights."""
    heights = np.stack([np.histogram(p[:, 2], bins=8, range=(-1, 1))[0] for p in points]) / points.shape[1]
    return np.concatenate([np.ptp(points, axis=1), (points**2).mean(axis=1), heights], axis=1)


def test_classes_differ(shapes):
    """Every class has its own look: a nearest-class-mean rule on a 14-number descriptor of the canonical-pose
    clouds, fitted on one draw and scored on another, is far above chance (1/40), and no two class means
    coincide."""
    train = _descriptor(shapes["points"])
    means = np.stack([train[shapes["categories"] == c].mean(0) for c in range(40)])
    gaps = np.linalg.norm(means[:, None] - means[None], axis=-1) + np.eye(40)
    assert gaps.min() > 0.01
    test = generate_synthetic_shapes40(400, 256, seed=5, scale_jitter=FIXED_JITTER)
    nearest = np.linalg.norm(_descriptor(test["points"])[:, None] - means[None], axis=-1).argmin(1)
    assert (nearest == test["categories"]).mean() > 0.3


def test_optional_parts_and_sampling_knobs():
    complete = generate_synthetic_shapes40(80, 256, seed=0, part_dropout=0.0)
    sparse = generate_synthetic_shapes40(80, 256, seed=0, part_dropout=0.9)
    # Without dropout every part of every class appears (each part gets a share of the points).
    for c in range(40):
        assert set(np.unique(complete["part_labels"][complete["categories"] == c])) == set(SHAPES40_CLASS_PARTS[c])
    assert len(np.unique(sparse["part_labels"])) < SHAPES40_NUM_PARTS
    # Sampling bias: the density along a direction varies more with it than without it.
    flat = generate_synthetic_shapes40(80, 1024, seed=0, noise_std=0.0, part_dropout=0.0, sampling_bias=0.0)
    biased = generate_synthetic_shapes40(80, 1024, seed=0, noise_std=0.0, part_dropout=0.0, sampling_bias=6.0)
    assert np.abs(biased["points"].mean(1)).max() < 1e-5  # recentred after thinning
    # Thinning towards one side moves the unit-sphere scale: the clouds are not the same point sets.
    assert not np.allclose(flat["points"], biased["points"])
    with pytest.raises(ValueError, match="part_dropout"):
        generate_synthetic_shapes40(4, 8, part_dropout=1.0)


def _far_point_distance(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.spatial import cKDTree

    nearest = np.concatenate([cKDTree(b).query(a)[0], cKDTree(a).query(b)[0]])
    return float(np.quantile(nearest, 0.99))


#: Classes that a turn about z maps nearly onto themselves, like ModelNet40's bottles and cups: their off-axis
#: parts (a label, a switch, a door, a tag, three fins) are small. Measured over two shapes of each class at
#: 2,048 points (the ratio the test checks): 1.05-1.3 for the first seven, 1.6-1.95 for the other five; every
#: other class above 1.95.
NEARLY_SYMMETRIC = {"rocket", "lighthouse", "table_lamp", "bottle", "cabinet", "coffee_table", "cup",
                    "bucket_hat", "bed", "umbrella", "bus", "hat"}


def test_most_classes_have_no_symmetry_about_z():
    """After a half, third or quarter turn about z, some part of a shape lies clearly away from the unturned
    shape (farther than 1.5x the gaps between two samplings of the same surface), except for the nearly
    symmetric classes listed above."""
    data = generate_synthetic_shapes40(40, 2048, seed=0, noise_std=0.0, part_dropout=0.0, sampling_bias=0.0,
                                       scale_jitter=FIXED_JITTER)
    for points, c in zip(data["points"].astype(np.float64), data["categories"], strict=True):
        if SHAPES40_CLASSES[c] in NEARLY_SYMMETRIC:
            continue
        first, second = points[::2], points[1::2]
        gaps = _far_point_distance(first, second)
        for angle in (math.pi, 2 * math.pi / 3, math.pi / 2):
            turned = second @ axis_rotation(torch.tensor(angle, dtype=torch.float64), "z").numpy().T
            assert _far_point_distance(first, turned) > 1.5 * gaps, SHAPES40_CLASSES[c]


def test_data_module_formats_streams_and_never_downloads(monkeypatch):
    import socket
    import urllib.request

    def fail(*args, **kwargs):
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    monkeypatch.setattr(urllib.request, "urlretrieve", fail)
    monkeypatch.setattr(socket, "create_connection", fail)
    dm = SyntheticShapes40DataModule(num_train=80, num_val=40, num_test=40, num_points=64, batch_size=8,
                                     rotation="z/so3")
    dm.setup()
    points, labels = next(iter(dm.train_dataloader()))
    assert points.shape == (8, 64, 3) and points.dtype == torch.float32 and labels.dtype == torch.int64
    assert dm.num_classes == 40 and len(dm.splits["test"]) == 40
    bigger = SyntheticShapes40DataModule(num_train=120, num_val=40, num_test=40, num_points=64, rotation="z/so3")
    bigger.setup()
    assert torch.equal(bigger.splits["test"].tensors[0], dm.splits["test"].tensors[0])  # split streams
    with pytest.raises(ValueError, match="data.task"):
        SyntheticShapes40DataModule(task="segmentation")


def test_the_seven_class_default_is_unchanged():
    """The 7-class module still serves generate_synthetic_shapes' clouds (committed results stay valid)."""
    dm = SyntheticShapesDataModule(num_train=7, num_val=7, num_test=7, num_points=32, rotation="z/z")
    dm.setup()
    seed = np.random.SeedSequence([0, __import__("zlib").crc32(b"train")])
    expected = generate_synthetic_shapes(7, 32, np.random.default_rng(seed))
    assert np.array_equal(dm.splits["train"].tensors[0].numpy(), expected["points"])


def test_config_composes_with_a_modelnet_row():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from canonical_network.utils.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=["experiment=modelnet/pointnet", "data=synthetic_shapes40",
                                          "data.num_train=40", "data.num_val=40", "data.num_test=40",
                                          "data.num_points=32"])
    dm = instantiate(cfg.data)
    assert isinstance(dm, SyntheticShapes40DataModule) and cfg.data_info.num_classes == 40
    model = instantiate(cfg.model)
    dm.setup()
    points, _ = next(iter(dm.train_dataloader()))
    assert model(points).shape == (32, 40)


@pytest.mark.parametrize("module", ["SyntheticShapesDataModule", "SyntheticShapes40DataModule"])
def test_the_config_file_and_the_class_give_the_same_difficulty(module):
    """A run records its config file's values and records.dataset_of compares them with that file: the class's
    own defaults (what a user of the plain-PyTorch class gets) must be the same data."""
    import inspect

    from canonical_network.data import synthetic_shapes, synthetic_shapes40
    from canonical_network.records import shapes_difficulty_defaults

    cls = getattr(synthetic_shapes40 if "40" in module else synthetic_shapes, module)
    signature = inspect.signature(cls.__init__).parameters
    from_file = shapes_difficulty_defaults(module)
    assert from_file and from_file == {key: signature[key].default for key in from_file}
    assert set(from_file) == {key for key in ("noise_std", "part_dropout", "sampling_bias", "scale_jitter")
                              if key in signature}
