"""The Rotated MNIST data modules: embedded 5k split and the MNIST-rot .amat reader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from canonical_network.data.rotated_mnist import (
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


def test_amat_reader_splits_train_and_validation(tmp_path):
    train = _write_amat(tmp_path / AMAT_TRAIN, rows=12, seed=0)
    test = _write_amat(tmp_path / AMAT_TEST, rows=5, seed=1)
    dm = RotatedMNISTDataModule(data_dir=str(tmp_path), num_train=10, batch_size=4)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [10, 2, 5]
    val_images, val_labels = dm.splits["val"].tensors
    np.testing.assert_allclose(val_images.view(2, -1).numpy(), train[10:, :784], atol=1e-6)
    assert val_labels.tolist() == train[10:, 784].astype(int).tolist()
    assert dm.splits["test"].tensors[1].tolist() == test[:, 784].astype(int).tolist()
    assert (tmp_path / AMAT_TRAIN).with_suffix(".npy").is_file()  # parsed once, cached beside the file
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 1, 28, 28)


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
    with pytest.raises(ValueError, match="785 columns"):
        RotatedMNISTDataModule(data_dir=str(tmp_path), num_train=2).setup()


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
