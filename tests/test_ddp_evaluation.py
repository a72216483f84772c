"""Evaluation under DDP measures what one process measures (issue 37, item 1).

Each task family's test loop runs once in one process and once in N processes (``ddp_fork`` on CPU, gloo, as ``trainer=ddp_cpu``), on
evaluation sets whose size is not a multiple of N, and the logged test metrics must agree: every sample counted
once (``SplitDataModule.eval_sampler``), every metric reduced over all processes (torchmetrics states, the
evaluation loss as a weighted mean). The negative control is Lightning's default sampler, which pads each
process's share by repeating samples: the same check sees the duplicates.

Tolerance. Counts (accuracy, error, identity rate, orbit flags) are sums of 0/1 flags and agree exactly. Float
sums (MSE, losses, IoU) are added in another order when the processes' partial sums are reduced: the relative
difference is at most ``n · eps32`` for ``n`` summed terms (worst-case recursive summation); ``n`` is bounded
by the number of per-sample values summed, ``2¹²`` here (49 systems × 15 coordinates, 100 digits, 49 clouds ×
64 points), so ``rtol = 2¹² · eps32 ≈ 4.9e-4`` of each metric. A duplicated sample changes an MSE by ~1/49 of
the difference between its error and the mean: ~1e-2 relative, far outside it.
"""

from __future__ import annotations

import math
import os

import hydra
import pytest
import torch
from lightning import Trainer
from omegaconf import open_dict

from canonical_network.data.nbody import NBodyDataModule
from canonical_network.utils.config import PROJECT_ROOT
from tests.helpers import compose_config

#: relative tolerance of float metrics (module docstring): n · eps32 with n = 2¹²
RTOL = 2**12 * torch.finfo(torch.float32).eps

#: family -> (experiment, overrides): small evaluation sets of sizes 49 or 100 (not multiples of 2 and/or 3)
FAMILIES = {
    "nbody": ("nbody/cn_gnn", ["data.num_train=60", "data.num_valid=10", "data.num_test=49", "data.batch_size=8",
                               "data.max_train_samples=60", "data.seed=5"]),
    "rotmnist": ("rotmnist/cn_p4", ["data.train_per_class=480", "data.val_per_class=10", "data.batch_size=16",
                                    "data.eval_rotations=1", "model.orbit_rotations=4"]),
    "modelnet": ("modelnet/cn_nl_pointnet", ["data.num_train=16", "data.num_val=8", "data.num_test=49",
                                             "data.num_points=64", "data.batch_size=8", "data.rotation=z/so3",
                                             "canonicalization.k=8"]),
    "shapenet": ("shapenet/cn_nl_pointnet", ["data.num_train=16", "data.num_val=8", "data.num_test=49",
                                             "data.num_points=64", "data.batch_size=8", "data.rotation=z/so3",
                                             "canonicalization.k=8"]),
}


@pytest.fixture(autouse=True)
def restored_environment():
    """Lightning's process launchers write MASTER_ADDR / MASTER_PORT (and more) into this process's environment;
    later tests that start runs in subprocesses (tests/test_local_launcher.py) must not inherit them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class PaddedNBodyDataModule(NBodyDataModule):
    """The negative control: Lightning's default evaluation sampler under DDP (pads by repeating samples)."""

    def eval_sampler(self, dataset, split):
        return None


def _test_metrics(family: str, devices: int, tmp_path, padded: bool = False) -> dict[str, float]:
    experiment, overrides = FAMILIES[family]
    cfg = compose_config([f"experiment={experiment}", *overrides], tmp_path)
    with open_dict(cfg):
        if family == "nbody":
            cfg.data.data_dir = str(tmp_path / "nbody")
        if padded:
            cfg.data._target_ = f"{__name__}.PaddedNBodyDataModule"
    torch.manual_seed(0)
    datamodule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy="ddp_fork" if devices > 1 else "auto",
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[], num_sanity_val_steps=0)
    trainer.test(model, datamodule=datamodule, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}


def _assert_same(single: dict[str, float], parallel: dict[str, float]) -> None:
    assert single and set(parallel) == set(single)
    for key, value in single.items():
        assert math.isclose(parallel[key], value, rel_tol=RTOL, abs_tol=0.0), (key, parallel[key], value)


@pytest.mark.usefixtures("one_thread")
def test_nbody_test_mse_on_three_processes_is_the_single_process_one(tmp_path):
    single = _test_metrics("nbody", 1, tmp_path)
    assert {"test/mse", "test/identity_rate"} <= set(single)
    _assert_same(single, _test_metrics("nbody", 3, tmp_path))


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_lightning_default_sampler_counts_repeated_samples_and_the_check_sees_it(tmp_path):
    single = _test_metrics("nbody", 1, tmp_path)
    padded = _test_metrics("nbody", 3, tmp_path, padded=True)  # 49 systems padded to 51: two counted twice
    assert not math.isclose(padded["test/mse"], single["test/mse"], rel_tol=RTOL, abs_tol=0.0)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("devices", [2, 3])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_evaluates_the_same_on_several_processes(family, devices, tmp_path):
    single = _test_metrics(family, 1, tmp_path)
    _assert_same(single, _test_metrics(family, devices, tmp_path))


# ----------------------------------------------------------------------------------------- training under DDP
#: after T = 8 SGD steps, one process and two differ only by the rounding of each step's gradient (the two
#: processes' mean-loss gradients averaged, against one mean over both halves; other batch sizes may take
#: other BLAS blockings): per entry ≤ n · eps32 relative with n = 2⁷ ≥ the longest sum of the GNN's forward and
#: backward (its hidden width 64, doubled), accumulated over the T steps: T · n · eps32 ≈ 1.2e-4 of each tensor's
#: scale. Lightning's own sampler wrapper (the control) reshuffles the order: other batches, ~1e-2 apart.
TRAIN_RTOL = 8 * 2**7 * torch.finfo(torch.float32).eps


class WrappedNBodyDataModule(NBodyDataModule):
    """The control: the training sampler left to Lightning, which wraps it in ``DistributedSamplerWrapper``."""

    def _train_sampler(self, dataset):
        return self.train_sampler(dataset)


def _fit(devices: int, batch: int, tmp_path, wrapped: bool = False) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """nbody/gnn (no dropout, no batch norm, no augmentation: a deterministic case) fitted with SGD for 2 epochs
    of 64 systems on ``devices`` processes of ``batch`` systems each."""
    cfg = compose_config(["experiment=nbody/gnn", "data.num_train=64", "data.num_valid=49", "data.num_test=10",
                          "data.max_train_samples=64", "data.seed=5", f"data.batch_size={batch}",
                          "model.optimizer._target_=torch.optim.SGD", "model.optimizer.lr=0.01"], tmp_path)
    with open_dict(cfg):
        cfg.data.data_dir = str(tmp_path / "nbody")
        if wrapped:
            cfg.data._target_ = f"{__name__}.WrappedNBodyDataModule"
    torch.manual_seed(0)
    datamodule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    trainer = Trainer(accelerator="cpu", devices=devices, strategy="ddp_fork" if devices > 1 else "auto",
                      max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[], num_sanity_val_steps=0)
    trainer.fit(model, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_two_processes_with_half_batches_train_as_one_process(tmp_path):
    """data.batch_size is per process: 2 processes × 8 systems take the steps of 1 process × 16 (the distributed
    sampler gives rank r the shuffled order's positions r, r + 2, ...: the two halves of each step's batch are the
    one-process batch, and DDP averages their mean-loss gradients)."""
    def worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return max((b[k] - v).abs().max().item() / max(v.abs().max().item(), 1e-30) for k, v in a.items())

    single_metrics, single = _fit(1, 16, tmp_path)
    double_metrics, double = _fit(2, 8, tmp_path)
    assert worst(single, double) < TRAIN_RTOL
    assert math.isclose(double_metrics["val/mse"], single_metrics["val/mse"], rel_tol=TRAIN_RTOL)
    _, wrapped = _fit(2, 8, tmp_path, wrapped=True)
    assert worst(single, wrapped) > 10 * TRAIN_RTOL


def test_each_process_draws_its_own_random_numbers_reproducibly():
    """on_train_epoch_start under DDP: draws differ across ranks and epochs, repeat for the same (seed, epoch,
    rank), and a one-process run's RNG stream is left alone."""
    from types import SimpleNamespace

    cfg = compose_config(["experiment=nbody/gnn"])
    torch.manual_seed(7)
    model = hydra.utils.instantiate(cfg.model)
    model.setup("fit")

    def draws(world_size: int, rank: int, epoch: int) -> torch.Tensor:
        model._trainer = SimpleNamespace(world_size=world_size, global_rank=rank, current_epoch=epoch)
        try:
            model.on_train_epoch_start()
            return torch.rand(4)
        finally:
            model._trainer = None

    assert not torch.equal(draws(2, 0, 3), draws(2, 1, 3))
    assert not torch.equal(draws(2, 0, 3), draws(2, 0, 4))
    assert torch.equal(draws(2, 1, 3), draws(2, 1, 3))
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(draws(1, 0, 3), expected)


def test_training_shuffle_keeps_the_run_seed_when_a_resume_restores_another_rng_state():
    """Under DDP each process reseeds per epoch, so the RNG state in rank 0's checkpoint carries that reseed as
    its initial_seed(); a resume restores it before the training loader is built. The shuffle must still be the
    run's (seed, epoch) one, taken when the data module was built (train.py seeds first); before this, the
    resumed job of tests/test_slurm.py dealt other batches (test MSE 0.0580 against 0.0573 uninterrupted)."""
    from torch.utils.data import TensorDataset

    from canonical_network.data.base import SplitDataModule
    from canonical_network.data.samplers import EpochSeededRandomSampler

    torch.manual_seed(3)  # the run's seed
    datamodule = SplitDataModule(batch_size=4, num_workers=0)
    dataset = TensorDataset(torch.arange(20))
    torch.set_rng_state(torch.Generator().manual_seed(987654).get_state())  # a restored per-epoch reseed
    assert torch.initial_seed() == 987654
    sampler = datamodule.train_sampler(dataset)
    sampler.set_epoch(4)
    expected = EpochSeededRandomSampler(dataset, seed=3)
    expected.set_epoch(4)
    assert list(sampler) == list(expected)


@pytest.mark.parametrize(("size", "processes", "dropped"), [(10, 1, False), (10, 2, True), (9, 1, True), (9, 2, True), (12, 2, False)])
def test_a_one_sample_training_batch_is_dropped_per_process(monkeypatch, size, processes, dropped):
    """Batch norm refuses a training batch of one sample: the last batch is dropped when *this process's*
    share ends in one (10 samples in batches of 4: one process 4+4+2, each of 2 processes 4+1; 9 are padded
    to 10 for 2 processes)."""
    import canonical_network.data.base as base
    from canonical_network.data.base import SplitDataModule

    if processes > 1:
        monkeypatch.setattr(base.dist, "is_initialized", lambda: True)
        monkeypatch.setattr(base.dist, "get_world_size", lambda: processes)
        monkeypatch.setattr(base.dist, "get_rank", lambda: 0)
    module = SplitDataModule(batch_size=4, num_workers=0)
    module.splits = {"train": torch.utils.data.TensorDataset(torch.arange(size, dtype=torch.float32))}
    loader = module.train_dataloader()
    assert loader.drop_last is dropped
    assert all(len(batch) > 1 for (batch,) in loader)


def test_no_committed_record_ran_on_several_processes():
    """docs/reproducing.md says no committed record ran on several processes, so none is touched by what DDP
    measured wrongly before its fixes: a record that does must be checked against them (and the docs changed)."""
    from canonical_network.records import find_results, read_results

    records = list(find_results(PROJECT_ROOT / "docs" / "reproduction" / "runs"))
    assert records
    for path in records:
        trainer = (read_results(path).get("config") or {}).get("trainer") or {}
        devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
        assert devices == 1 and nodes == 1, (path, devices, nodes)
