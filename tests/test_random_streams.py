"""What a run's randomness depends on: its seed and the epoch, never the number of loader workers.

* The training order of seed ``s`` at epoch ``e`` comes from a stream hashed from ``(s, e)``: the seeds of a table
  cell see unrelated orders (it was ``manual_seed(s + e)``, so seed 1's epoch ``e`` was seed 0's epoch ``e + 1``).
* Reading a loader never draws from the global RNG (each new iterator takes its workers' base seed from the
  loader's own generator), so the run's stream of dropout masks and augmentation angles is the same with
  ``data.num_workers=0`` (a new iterator every epoch) as with workers (persistent: one iterator).
"""

from __future__ import annotations

import hydra
import lightning as L
import pytest
import torch

from canonical_network.data.samplers import EpochSeededRandomSampler
from tests.helpers import compose_config


def _order(seed: int, epoch: int, size: int = 200) -> list[int]:
    sampler = EpochSeededRandomSampler(range(size), seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_seeds_shuffle_into_unrelated_orders():
    assert _order(0, 3) == _order(0, 3)  # a resumed run shuffles as the uninterrupted one
    assert sorted(_order(0, 3)) == list(range(200))
    assert _order(0, 3) != _order(0, 4)  # a new order every epoch
    for epoch in range(4):  # no seed replays another seed's order one epoch on
        assert _order(1, epoch) != _order(0, epoch + 1)
        assert _order(2, epoch) != _order(1, epoch + 1)


def _image_data(num_workers: int):
    cfg = compose_config(["experiment=rotmnist/cnn_aug", f"data.num_workers={num_workers}", "data.batch_size=64"])
    torch.manual_seed(0)
    data = hydra.utils.instantiate(cfg.data)
    data.setup()
    return data


@pytest.mark.parametrize("num_workers", [0, 1])
def test_reading_a_loader_never_draws_from_the_global_rng(num_workers):
    data = _image_data(num_workers)
    loaders = [data.train_dataloader(), data.val_dataloader(), data.test_dataloader()]
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for _ in range(2):  # two epochs' worth of new iterators
        for loader in loaders:
            next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before)


def _fit(num_workers: int) -> dict[str, torch.Tensor]:
    cfg = compose_config(["experiment=rotmnist/cnn_aug", f"data.num_workers={num_workers}", "data.batch_size=32"])
    L.seed_everything(0, verbose=False)
    data = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, limit_train_batches=2, limit_val_batches=1,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(model, datamodule=data)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def test_training_is_the_same_with_and_without_loader_workers():
    """Three epochs of CNN (rotation aug.): random angles per image and step, drawn from the global RNG in the
    main process; with workers the loaders' iterators are made once, without them every epoch."""
    plain, workers = _fit(0), _fit(1)
    assert plain.keys() == workers.keys()
    assert all(torch.equal(plain[name], workers[name]) for name in plain)
