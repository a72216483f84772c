"""The Rotated MNIST data modules: embedded 5k split and the MNIST-rot .amat reader."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from canonical_network.data.rotated_mnist import (
    AMAT_ROWS,
    AMAT_TEST,
    AMAT_TRAIN,
    RotatedMNIST5kDataModule,
    RotatedMNISTDataModule,
)
from canonical_network.groups.image import rotate_deg


@pytest.fixture(scope="module")
def mnist5k():
    dm = RotatedMNIST5kDataModule(eval_rotations=4)
    dm.setup()
    return dm


def test_split_sizes_and_class_balance(mnist5k):
    sizes = {k: len(v) for k, v in mnist5k.splits.items()}
    assert sizes == {"train": 3600, "val": 400 * 4, "test": 1000 * 4}
    for split, per_class in (("train", 360), ("val", 160), ("test", 400)):
        labels = mnist5k.splits[split].tensors[1]
        assert torch.equal(torch.bincount(labels, minlength=10), torch.full((10,), per_class))
    images = mnist5k.splits["train"].tensors[0]
    assert images.shape[1:] == (1, 28, 28) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1


def test_data_is_fixed_by_data_seed_not_training_seed(mnist5k):
    torch.manual_seed(123)
    again = RotatedMNIST5kDataModule(eval_rotations=4)
    again.setup()
    assert torch.equal(again.splits["test"].tensors[0], mnist5k.splits["test"].tensors[0])
    other = RotatedMNIST5kDataModule(eval_rotations=4, data_seed=1)
    other.setup()
    assert not torch.equal(other.splits["train"].tensors[0], mnist5k.splits["train"].tensors[0])


def test_eval_views_are_rotations_of_one_digit(mnist5k):
    images, labels = mnist5k.splits["test"].tensors
    views = images[:4]  # digit-major: the 4 views of the first test digit, 90° apart
    assert len(set(labels[:4].tolist())) == 1
    for k in range(1, 4):
        back = rotate_deg(views[k : k + 1], -90.0 * k)
        other_digit = images[4:5]
        assert (back - views[:1]).abs().mean() < 0.3 * (other_digit - views[:1]).abs().mean()


def test_training_rotation_augmentation_only_in_training():
    dm = RotatedMNIST5kDataModule(augmentation="rotation")
    batch = (torch.rand(8, 1, 28, 28), torch.zeros(8, dtype=torch.long))

    class FakeTrainer:
        training = True

    assert dm.on_after_batch_transfer(batch, 0)[0] is batch[0]  # no trainer attached: untouched
    dm.trainer = FakeTrainer()
    assert not torch.equal(dm.on_after_batch_transfer(batch, 0)[0], batch[0])
    FakeTrainer.training = False
    assert dm.on_after_batch_transfer(batch, 0)[0] is batch[0]


def _write_amat(path, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    table = np.concatenate([rng.random((rows, 784)), rng.integers(0, 10, (rows, 1))], axis=1)
    np.savetxt(path, table, fmt="%.6f")
    return table


class TinyMNISTRot(RotatedMNISTDataModule):
    """The reader on tiny files: 12 train_valid rows and 5 test rows stand for 12,000 and 50,000."""

    EXPECTED_ROWS = {AMAT_TRAIN: 12, AMAT_TEST: 5}


def test_benchmark_row_counts():
    assert AMAT_ROWS == {AMAT_TRAIN: 12_000, AMAT_TEST: 50_000}
    assert RotatedMNISTDataModule.EXPECTED_ROWS == AMAT_ROWS


def test_amat_reader_splits_train_and_validation(tmp_path):
    train = _write_amat(tmp_path / AMAT_TRAIN, rows=12, seed=0)
    test = _write_amat(tmp_path / AMAT_TEST, rows=5, seed=1)
    dm = TinyMNISTRot(data_dir=str(tmp_path), num_train=10, batch_size=4)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [10, 2, 5]
    val_images, val_labels = dm.splits["val"].tensors
    # the .amat text holds 6 decimals (±5e-7) and pixels in [0, 1] are read as float32 (±2⁻²⁵): 1e-6 covers both
    np.testing.assert_allclose(val_images.view(2, -1).numpy(), train[10:, :784], atol=1e-6)
    assert val_labels.tolist() == train[10:, 784].astype(int).tolist()
    assert dm.splits["test"].tensors[1].tolist() == test[:, 784].astype(int).tolist()
    assert (tmp_path / AMAT_TRAIN).with_suffix(".npz").is_file()  # parsed once, cached beside the file
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 1, 28, 28)
    again = TinyMNISTRot(data_dir=str(tmp_path), num_train=10)
    again.setup()  # from the cache
    assert torch.equal(again.splits["val"].tensors[0], val_images)


def test_missing_amat_files_raise_one_clear_error(tmp_path):
    dm = RotatedMNISTDataModule(data_dir=str(tmp_path / "rotated_mnist"))
    with pytest.raises(FileNotFoundError) as err:
        dm.setup()
    message = str(err.value)
    assert AMAT_TRAIN in message and AMAT_TEST in message and "rotated_mnist" in message
    assert "data=rotated_mnist_5k" in message


def test_malformed_amat_is_refused(tmp_path):
    np.savetxt(tmp_path / AMAT_TRAIN, np.zeros((3, 10)))
    np.savetxt(tmp_path / AMAT_TEST, np.zeros((3, 10)))
    with pytest.raises(ValueError, match=r"train_valid\.amat, line 1: 10 numbers where a row holds 785"):
        RotatedMNISTDataModule(data_dir=str(tmp_path), num_train=2).setup()


def _amat_lines(rows: int = 12, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    table = np.concatenate([rng.random((rows, 784)), rng.integers(0, 10, (rows, 1))], axis=1)
    return [" ".join(f"{v:.6f}" for v in row) for row in table]


def _with_field(line: str, column: int, value: str) -> str:
    fields = line.split()
    fields[column - 1] = value
    return " ".join(fields)


# (what is wrong, how to damage the 12 train_valid lines, the line and problem the error must name)
DAMAGED_AMAT = {
    "truncated": (
        lambda lines: lines[:-1] + [lines[-1][: len(lines[-1]) // 2]],
        r"line 12: \d+ numbers where",
    ),
    "label 12": (
        lambda lines: lines[:6] + [_with_field(lines[6], 785, "12.000000")] + lines[7:],
        r"line 7: the label \(column 785\) is 12; labels are integers 0\.\.9",
    ),
    "label 3.5": (
        lambda lines: lines[:2] + [_with_field(lines[2], 785, "3.500000")] + lines[3:],
        r"line 3: the label \(column 785\) is 3\.5",
    ),
    "NaN pixel": (
        lambda lines: lines[:4] + [_with_field(lines[4], 100, "nan")] + lines[5:],
        r"line 5: pixel 100 \(column 100\) is nan; pixels are finite values in \[0, 1\]",
    ),
    "pixel above 1": (
        lambda lines: [_with_field(lines[0], 3, "255.000000")] + lines[1:],
        r"line 1: pixel 3 \(column 3\) is 255",
    ),
    "garbage": (
        lambda lines: lines[:9] + [_with_field(lines[9], 42, "0.1x3")] + lines[10:],
        r"line 10: column 42 is '0\.1x3', not a number",
    ),
    "row too long": (lambda lines: lines[:3] + [lines[3] + " 0.5"] + lines[4:], r"line 4: 786 numbers where"),
    "a row missing": (lambda lines: lines[:-1], r"train_valid\.amat: 11 rows; the MNIST-rot file has 12\."),
}


@pytest.mark.parametrize("damage", list(DAMAGED_AMAT))
def test_damaged_amat_is_refused_naming_file_and_line_and_not_cached(tmp_path, damage):
    make, expected = DAMAGED_AMAT[damage]
    (tmp_path / AMAT_TRAIN).write_text("\n".join(make(_amat_lines())) + "\n")
    _write_amat(tmp_path / AMAT_TEST, rows=5, seed=1)
    with pytest.raises(ValueError, match=str(tmp_path / AMAT_TRAIN).replace(".", r"\.")) as err:
        TinyMNISTRot(data_dir=str(tmp_path), num_train=10).setup()
    assert re.search(expected, str(err.value)), str(err.value)
    assert "mnist_rotation_new.zip" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([AMAT_TEST, AMAT_TRAIN])  # nothing cached


def test_a_blank_line_does_not_shift_the_line_named(tmp_path):
    lines = _amat_lines()
    lines[8] = _with_field(lines[8], 785, "-1.000000")
    (tmp_path / AMAT_TRAIN).write_text("\n".join(lines[:2] + [""] + lines[2:]) + "\n")
    _write_amat(tmp_path / AMAT_TEST, rows=5, seed=1)
    with pytest.raises(ValueError, match=r"train_valid\.amat, line 10: the label \(column 785\) is -1"):
        TinyMNISTRot(data_dir=str(tmp_path), num_train=10).setup()


def test_bad_data_arguments_name_the_key():
    with pytest.raises(ValueError, match="data.augmentation must be one of"):
        RotatedMNIST5kDataModule(augmentation="flip")
    with pytest.raises(ValueError, match="data.eval_rotations"):
        RotatedMNIST5kDataModule(eval_rotations=0)


@pytest.mark.parametrize("augmentation", ["none", "rotation"])
def test_augmentation_reaches_training_steps_inside_a_real_trainer(augmentation):
    """Through Lightning itself: the training step sees rotated digits only when augmentation is on."""
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.seen = None

        def training_step(self, batch, batch_idx):
            self.seen = batch[0].clone()
            return (self.weight * batch[0].mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    torch.manual_seed(0)
    dm = RotatedMNIST5kDataModule(augmentation=augmentation, batch_size=16, eval_rotations=1)
    dm.setup()
    raw = next(iter(dm.train_dataloader()))[0]  # the sampler's order depends only on (seed, epoch)
    model = Recorder()
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, accelerator="cpu")
    trainer.fit(model, datamodule=dm)
    assert model.seen.shape == raw.shape
    assert torch.equal(model.seen, raw) == (augmentation == "none")
