"""The N-body task end to end: E(3) equivariance of every equivariant row as built from its real config, the
test metric, and a short run of every nbody experiment through ``canonical_network.train.run``.

All inputs are real simulated frames: a tiny dataset with nbody_small's parameters and seed (fewer
simulations) is generated once per module into a temporary folder.
"""

from __future__ import annotations

import functools
import json
import math

import hydra
import pytest
import torch
from lightning import Trainer
from omegaconf import DictConfig

from canonical_network.data.nbody import NBodyDataModule
from canonical_network.groups.euclidean import EuclideanTransform, random_rotations
from canonical_network.train import RESULTS_FILE, run
from tests.conftest import EXPERIMENTS, compose_config, shrink

# Simulations per split of the tiny dataset; 16 test systems make one batch of real frames.
TINY = {"num_train": 16, "num_valid": 8, "num_test": 16}
NBODY_EXPERIMENTS = [e for e in EXPERIMENTS if e.startswith("nbody/")]
# Rows whose model is E(3)-equivariant by construction (Table 3): all but the plain GNN.
EQUIVARIANT_ROWS = ["linear", "egnn", "fa_gnn", "cn_gnn", "cn_gnn_o3", "cn_gnn_frozen"]
# nbody experiments that are not rows of Table 3: our whole-GNN frame averaging, beside Puny et al.'s fa_gnn.
VARIANTS = ["fa_gnn_global"]
# The tolerances.
ATOL = {torch.float32: 1e-4, torch.float64: 1e-8}
# Translations of the order of the systems' own extent (positions in nbody_small spread over a few units).
SHIFT_SCALE = 3.0


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("nbody_tiny")
    NBodyDataModule(data_dir=str(out), **TINY).prepare_data()
    return out


@pytest.fixture(scope="module")
def frames(tiny_dir) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real inputs at frame 30: loc (16, 5, 3), vel (16, 5, 3), charges (16, 5, 1), float32."""
    dm = NBodyDataModule(data_dir=str(tiny_dir), batch_size=TINY["num_test"], **TINY)
    dm.setup()
    loc, vel, charges, _ = next(iter(dm.test_dataloader()))
    return loc, vel, charges


@functools.cache
def row_config(row: str) -> DictConfig:
    # Composing costs more than building the small models: once per row for all tests (read-only).
    return compose_config([f"experiment=nbody/{row}"])


def build_row(row: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The LightningModule of ``experiment=nbody/<row>`` as train.py instantiates it, in eval mode."""
    torch.manual_seed(0)
    return hydra.utils.instantiate(row_config(row).model).to(dtype).eval()


def sampled_transforms(batch_size: int, dtype: torch.dtype):
    """One Haar rotation and translation per system, then those rotations composed with −I (reflections).

    A batch of 16 systems thus checks 16 sampled rotations and 16 sampled reflections in two forward passes.
    """
    gen = torch.Generator().manual_seed(0)
    rotation = random_rotations(batch_size, gen, dtype=torch.float64)
    shift = SHIFT_SCALE * torch.randn(batch_size, 3, generator=gen, dtype=torch.float64)
    for sign in (1.0, -1.0):
        yield EuclideanTransform((sign * rotation).to(dtype), shift.to(dtype))


def max_equivariance_error(model: torch.nn.Module, frames, dtype: torch.dtype) -> float:
    """``max |model(x Rᵀ + t, v Rᵀ, q) − (model(x, v, q) Rᵀ + t)|`` over the sampled ``(R, t)``."""
    loc, vel, charges = (x.to(dtype) for x in frames)
    errors = []
    with torch.no_grad():
        out = model(loc, vel, charges)
        for g in sampled_transforms(len(loc), dtype):
            transformed_then_model = model(g.apply_to_points(loc), g.apply_to_vectors(vel), charges)
            errors.append((transformed_then_model - g.apply_to_points(out)).abs().max().item())
    return max(errors)


def test_every_table_row_has_an_experiment():
    assert set(NBODY_EXPERIMENTS) == {f"nbody/{row}" for row in ["gnn", *EQUIVARIANT_ROWS, *VARIANTS]}


def test_forward_contract(frames):
    loc, vel, charges = frames
    for row in ("gnn", "cn_gnn"):
        out = build_row(row)(loc, vel, charges)
        assert out.shape == loc.shape and out.dtype == torch.float32 and torch.isfinite(out).all()


def test_real_frames_have_unique_pca_axes(frames):
    # FA-GNN is equivariant only where the scatter matrix has distinct eigenvalues; otherwise its test below
    # would fail for a reason unrelated to the code.
    centred = (frames[0] - frames[0].mean(dim=1, keepdim=True)).double()
    eigvals = torch.linalg.eigvalsh(centred.transpose(1, 2) @ centred)
    assert ((eigvals[:, 1:] - eigvals[:, :-1]) / eigvals[:, -1:]).min() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("row", EQUIVARIANT_ROWS + VARIANTS)
def test_row_is_e3_equivariant(row, dtype, frames):
    error = max_equivariance_error(build_row(row, dtype), frames, dtype)
    assert error < ATOL[dtype], f"nbody/{row}: max error {error:.3g}"


def test_plain_gnn_row_is_not_equivariant(frames):
    """The same check fails for the GNN row: it can tell an equivariant model from one that is not."""
    assert max_equivariance_error(build_row("gnn"), frames, torch.float32) > 1e-2


def test_canonicalized_rows_do_not_reduce_to_the_centroid(frames):
    """CN rows must use the predictor's output, or equivariance would hold vacuously (prediction = t)."""
    loc, vel, charges = frames
    model = build_row("cn_gnn_o3")
    out = model(loc, vel, charges)
    assert (out - loc.mean(dim=1, keepdim=True)).abs().max() > 1e-2


def test_test_mse_is_the_mean_over_all_coordinates(tiny_dir):
    # 16 test systems in batches of 6: the last batch is smaller and must not be over-weighted.
    model = build_row("cn_gnn")
    dm = NBodyDataModule(data_dir=str(tiny_dir), batch_size=6, **TINY)
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    logged = trainer.test(model, datamodule=dm, verbose=False)[0]["test/mse"]
    loc, vel, charges, target = dm.splits["test"].tensors
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(model(loc, vel, charges), target).item()
    assert logged == pytest.approx(expected, rel=1e-5)


def test_training_order_depends_only_on_seed_and_epoch(tiny_dir):
    # The shared SplitDataModule shuffles by (seed, epoch), never from the global RNG, so resumed runs
    # replay the same batches; validation and test are not shuffled.
    def first_epochs(dm: NBodyDataModule) -> list[torch.Tensor]:
        loader = dm.train_dataloader()
        orders = []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            torch.rand(100)  # other consumers of the global RNG must not matter
            orders.append(torch.cat([batch[0][:, 0, 0] for batch in loader]))
        return orders

    torch.manual_seed(7)
    first = first_epochs(NBodyDataModule(data_dir=str(tiny_dir), batch_size=4, **TINY))
    torch.manual_seed(7)
    again = first_epochs(NBodyDataModule(data_dir=str(tiny_dir), batch_size=4, **TINY))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], first[1])  # a new permutation each epoch
    dm = NBodyDataModule(data_dir=str(tiny_dir), batch_size=4, **TINY)
    val = torch.cat([batch[0] for batch in dm.val_dataloader()])
    assert torch.equal(val, dm.splits["val"].tensors[0])


@pytest.mark.parametrize("experiment", NBODY_EXPERIMENTS)
def test_experiment_trains_tests_and_writes_results(experiment, tiny_dir, tmp_path):
    counts = [f"data.{k}={v}" for k, v in TINY.items()]
    cfg = compose_config(
        [f"experiment={experiment}", f"data.data_dir={tiny_dir}", "data.batch_size=8", *counts,
         # validate after the single epoch, so the best checkpoint by val/mse is the one tested
         "trainer.check_val_every_n_epoch=1"],
        tmp_path,
    )
    results = run(shrink(cfg))
    written = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert written["experiment"] == experiment and written["status"] == "completed"
    assert math.isfinite(written["metrics"]["test/mse"]) and written["metrics"]["test/mse"] > 0
    assert set(written["best_val"]) == {"val/mse"}
    assert written["checkpoint"].endswith(".ckpt")
    assert results["metrics"] == written["metrics"]
