"""scripts/dress_rehearsal.py: its generated files have the real archives' layouts, and the real loaders read
them (tiny sizes here; the script's defaults are the archives' sizes)."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys

import h5py
import numpy as np
import pandas as pd
import pytest

from canonical_network.data.modelnet import ModelNet40DataModule
from canonical_network.data.rotated_mnist import AMAT_ROWS, AMAT_TEST, AMAT_TRAIN, RotatedMNISTDataModule
from canonical_network.data.shapenet import SHAPENET_CATEGORY_PARTS, ShapeNetPartDataModule
from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "dress_rehearsal.py"


def _module():
    spec = importlib.util.spec_from_file_location("dress_rehearsal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rehearsal = _module()


def test_the_default_sizes_are_the_archives():
    assert rehearsal.SIZES["modelnet"] == {"train": 9843, "test": 2468}
    assert rehearsal.SIZES["shapenet"] == {"train": 12137, "val": 1870, "test": 2874}
    assert rehearsal.SIZES["rotmnist"] == {"train": AMAT_ROWS[AMAT_TRAIN], "test": AMAT_ROWS[AMAT_TEST]}


def test_fixed_point_text_reads_back():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(size=(50, 6)), rng.integers(0, 50, (50, 1))], axis=1)
    values[0, :3] = [-0.0000004, 12.5, -3.0]
    text = rehearsal.fixed_point_text(values, 6)
    parsed = np.fromstring(text.decode(), dtype=np.float64, sep=" ").reshape(values.shape)
    assert np.abs(parsed - values).max() <= 5e-7 + 1e-12
    assert np.array_equal(pd.read_csv(io.BytesIO(text), sep=r"\s+", header=None).to_numpy(), parsed)
    assert rehearsal.fixed_point_text(np.array([[1, 2], [30, 4]]), 0) == b" 1  2\n30  4\n"


def test_modelnet_files_have_the_zip_layout_and_the_loader_reads_them(tmp_path):
    root = tmp_path / "modelnet40"
    rehearsal.write_modelnet(root, {"train": 45, "test": 5}, seed=0)
    folder = root / "modelnet40_ply_hdf5_2048"
    assert (folder / "train_files.txt").read_text() == "data/modelnet40_ply_hdf5_2048/ply_data_train0.h5\n"
    with h5py.File(folder / "ply_data_train0.h5", "r") as f:
        assert set(f) == {"data", "label"}
        assert f["data"].shape == (45, 2048, 3) and f["data"].dtype == np.float32
        assert f["label"].shape == (45, 1) and f["label"].dtype == np.uint8
    dm = ModelNet40DataModule(data_dir=str(root), num_points=1024, batch_size=8)
    dm.setup()
    points, labels = next(iter(dm.train_dataloader()))
    assert points.shape == (8, 1024, 3) and len(dm.splits["train"]) == 45 and len(dm.splits["test"]) == 5
    assert 0 <= int(labels.min()) and int(labels.max()) < 40


def test_modelnet_shards_split_every_2048_clouds(tmp_path, monkeypatch):
    monkeypatch.setattr(rehearsal, "H5_SHARD", 16)
    rehearsal.write_modelnet(tmp_path, {"train": 40, "test": 3}, seed=0)
    names = (tmp_path / "modelnet40_ply_hdf5_2048" / "train_files.txt").read_text().split()
    assert [n.rsplit("/", 1)[-1] for n in names] == [f"ply_data_train{i}.h5" for i in range(3)]
    dm = ModelNet40DataModule(data_dir=str(tmp_path))
    dm.setup()
    assert len(dm.splits["train"]) == 40


def test_shapenet_files_are_read_by_the_loader(tmp_path):
    root = tmp_path / "shapenet_part"
    rehearsal.write_shapenet(root, {"train": 32, "val": 16, "test": 16}, seed=0)
    dm = ShapeNetPartDataModule(data_dir=str(root), num_points=2048, batch_size=4)
    dm.setup()
    assert len(dm.splits["train"]) == 48 and len(dm.splits["test"]) == 16  # train + val, as val_split=test
    points, categories, parts = dm.splits["test"].tensors
    assert points.shape == (16, 2048, 3) and set(categories.tolist()) == set(range(16))
    for category, labels in zip(categories.tolist(), parts, strict=True):
        assert set(labels.tolist()) <= set(SHAPENET_CATEGORY_PARTS[category])


def test_rotated_mnist_files_are_read_by_the_loader(tmp_path):
    root = tmp_path / "rotated_mnist"
    rehearsal.write_rotated_mnist(root, {"train": 30, "test": 20}, seed=0)

    class AnyRows(RotatedMNISTDataModule):
        EXPECTED_ROWS = None

    dm = AnyRows(data_dir=str(root), num_train=25)
    dm.setup()
    images, labels = dm.splits["train"].tensors
    assert images.shape == (25, 1, 28, 28) and 0 <= images.min() and images.max() <= 1
    assert len(dm.splits["val"]) == 5 and len(dm.splits["test"]) == 20 and labels.max() < 10
    with pytest.raises(ValueError, match="12,000"):  # the real reader wants the archive's row count
        RotatedMNISTDataModule(data_dir=str(root)).setup()


def test_unique_clouds_are_copied_within_their_class():
    points, classes, parts = rehearsal._shapes40(50, seed=0, categories=np.arange(50) % 5, unique=10)
    assert np.array_equal(classes, np.arange(50) % 5)
    for i in range(10, 50):
        same = [j for j in range(10) if classes[j] == classes[i]]
        assert any(np.array_equal(np.sort(points[i], axis=0), np.sort(points[j], axis=0)) for j in same)


@pytest.mark.slow  # minutes on a loaded 2-core machine (Lightning start-up twice, two batches of CN(NL)-PointNet)
def test_tiny_rehearsal_end_to_end(tmp_path):
    out = tmp_path / "rehearsal.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--families", "modelnet", "--batches", "2",
                           "--root", str(tmp_path / "files"), "--output", str(out)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(out.read_text())["results"]["modelnet"]
    assert entry["sizes"] == {"train": 80, "val": 40, "test": 40} and entry["batches"] == 2
    assert entry["samples_per_s"] > 0 and entry["peak_rss_mb"] >= entry["peak_rss_mb_after_load"] > 0
