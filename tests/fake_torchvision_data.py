"""Tiny CIFAR-10 and STL-10 folders in torchvision's on-disk formats, for tests that must not download.

torchvision checks each file's md5 against the published one before reading it; :func:`accept_checksums` points
those checks at the files written here (pytest's ``monkeypatch``, undone after the test), so the real reading
code of :class:`torchvision.datasets.CIFAR10` / ``STL10`` runs unchanged on the fake files.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np

CIFAR_FOLDER, STL_FOLDER = "cifar-10-batches-py", "stl10_binary"
CIFAR_TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def fake_images(n: int, side: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random RGB images (n, 3, side, side) uint8 in 1..255 (no pixel is 0, so zero padding is visible)
    and labels 0..9 that cycle, so every class appears."""
    rng = np.random.default_rng(seed)
    return rng.integers(1, 256, size=(n, 3, side, side), dtype=np.uint8), np.arange(n) % 10


def write_cifar10(root: Path, per_batch: int = 4, test: int = 8) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``root/cifar-10-batches-py``: 5 training batches of ``per_batch`` images, a test batch, the meta file.
    Returns the images (N, 3, 32, 32) and labels written, per split (``train`` in batch order, ``test``)."""
    folder = root / CIFAR_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    written = {"train": fake_images(5 * per_batch, 32, seed=0), "test": fake_images(test, 32, seed=1)}

    def dump(name: str, images: np.ndarray, labels: np.ndarray) -> None:
        # CIFAR's batches: rows of 3072 bytes, the red plane, then green, then blue (row-major 32×32 each)
        entry = {"data": images.reshape(len(images), -1), "labels": [int(x) for x in labels], "batch_label": name}
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)

    images, labels = written["train"]
    for i, name in enumerate(CIFAR_TRAIN_BATCHES):
        dump(name, images[i * per_batch : (i + 1) * per_batch], labels[i * per_batch : (i + 1) * per_batch])
    dump("test_batch", *written["test"])
    with open(folder / "batches.meta", "wb") as f:
        names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
        pickle.dump({"label_names": names, "num_cases_per_batch": per_batch}, f)
    return written


def write_stl10(root: Path, train: int = 10, test: int = 8) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``root/stl10_binary`` with ``train_X.bin``/``train_y.bin``, ``test_X.bin``/``test_y.bin`` and a one-image
    ``unlabeled_X.bin`` (torchvision checks that it exists). Returns the images (N, 3, 96, 96) and labels (0..9)."""
    folder = root / STL_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    written = {"train": fake_images(train, 96, seed=2), "test": fake_images(test, 96, seed=3)}
    for split, (images, labels) in written.items():
        # STL-10's binary files store each channel column-major (torchvision transposes H and W back)
        (folder / f"{split}_X.bin").write_bytes(images.transpose(0, 1, 3, 2).tobytes())
        (folder / f"{split}_y.bin").write_bytes((labels + 1).astype(np.uint8).tobytes())  # labels 1..10 on disk
    (folder / "unlabeled_X.bin").write_bytes(fake_images(1, 96, seed=4)[0].transpose(0, 1, 3, 2).tobytes())
    return written


def accept_checksums(monkeypatch, root: Path) -> None:
    """Make torchvision's md5 checks accept the fake files under ``root`` (for the rest of the test)."""
    from torchvision.datasets import CIFAR10, STL10

    cifar, stl = root / CIFAR_FOLDER, root / STL_FOLDER
    if cifar.is_dir():
        monkeypatch.setattr(CIFAR10, "train_list", [[n, _md5(cifar / n)] for n in CIFAR_TRAIN_BATCHES])
        monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", _md5(cifar / "test_batch")]])
        monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": _md5(cifar / "batches.meta")})
    if stl.is_dir():
        monkeypatch.setattr(STL10, "train_list", [[n, _md5(stl / n)] for n in
                                                  ("train_X.bin", "train_y.bin", "unlabeled_X.bin")])
        monkeypatch.setattr(STL10, "test_list", [[n, _md5(stl / n)] for n in ("test_X.bin", "test_y.bin")])
