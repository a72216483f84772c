"""The N-body task end to end: E(3) equivariance of every equivariant row as built from its real config, the
test metric, and a short run of every nbody experiment through ``canonical_network.train.run``.

All inputs are real simulated frames: a tiny dataset with nbody_small's parameters and seed (fewer
simulations) is generated once per module into a temporary folder.
"""

from __future__ import annotations

import functools
import math

import hydra
import pytest
import torch
from lightning import Trainer
from omegaconf import DictConfig, open_dict

import canonical_network as cn
from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.data.nbody import NBodyDataModule
from canonical_network.groups.euclidean import EuclideanTransform, random_rotations
from canonical_network.prediction.frame_averaging import (
    FrameAveragingGNN,
    LayerwiseFrameAveragingGNN,
    pca_frame,
)
from canonical_network.records import read_results, record_path
from canonical_network.train import run
from tests.helpers import EPS32, EXPERIMENTS, compose_config, frame_condition, shrink
from tests.test_fa_gnn import accumulation_length
from tests.test_fa_gnn import frame_condition as pca_condition

# Simulations per split of the tiny dataset; 16 test systems make one batch of real frames.
TINY = {"num_train": 16, "num_valid": 8, "num_test": 16}
NBODY_EXPERIMENTS = [e for e in EXPERIMENTS if e.startswith("nbody/")]
# Rows whose model is E(3)-equivariant by construction (Table 3): all but the plain GNN and the SE3_ROWS.
EQUIVARIANT_ROWS = ["linear", "egnn", "fa_gnn", "cn_gnn", "cn_gnn_o3", "cn_gnn_frozen", "radial_field"]
# Exactly equivariant in evaluation, as these; in training its frames turn at random (equivariant in law)
TURNED_ROWS = ["cn_gnn_turned"]
# Rows equivariant to rotations and translations but not reflections, as the EGNN repository's models they
# reproduce: checked in tests/test_tensor_field_rows.py (float64, models built with e3nn's float64 constants).
SE3_ROWS = ["tfn", "se3_transformer"]
# nbody experiments that are not rows of Table 3: our whole-GNN frame averaging, beside Puny et al.'s fa_gnn.
VARIANTS = ["fa_gnn_global"]
# Issue 36's S_n rows (a plain MLP alone, behind E(3) x S_n canonicalization, and the two halves): their
# equivariance, and its absence, is checked in tests/test_nbody_mlp_rows.py.
PERMUTATION_ROWS = ["mlp", "cn_mlp", "cn_mlp_sn", "cn_mlp_e3"]
#: ``n`` of the equivariance tolerances (tests/helpers.py): the longest chain of sums of the GNN-type
#: predictors (hidden 64, 4 layers: per layer the edge MLP's 2·64 + 2 and 64 terms, 4 messages, the node
#: MLP's 128 and 64, ≈ 400; with embedding, decoder and a canonicalizer's VN layers ≤ 2¹¹). Puny et al.'s
#: layer-wise FA-GNN uses its own count (tests/test_fa_gnn.py: accumulation_length).
NBODY_TERMS = 2**11
#: A tolerance must leave room for the check to mean something: the plain GNN row misses by ~1 × the outputs'
#: scale, so a tolerance above 1 % of the scale (inputs too close to a degenerate frame) would let it pass.
MEANINGFUL = 1e-2
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


def equivariance_factor(model: torch.nn.Module, loc, vel, charges) -> float:
    """``factor = n · κ`` (tests/helpers.py) of a row's equivariance tolerance at these inputs.

    ``κ``, the amplification of a relative rounding error by the frames the row builds: 1 without a frame
    (linear, EGNN); a learned canonicalizer's Gram–Schmidt conditioning (:func:`frame_condition`); the PCA
    frame's ``λ_max / min gap`` (Davis–Kahan) for the whole-GNN frame averaging; and for the layer-wise
    FA-GNN the product over its re-framings, ``Π (1 + κ_l)`` with its own ``n`` (tests/test_fa_gnn.py).
    """
    canonicalizer, predictor = model.network.canonicalizer, model.network.predictor
    with torch.no_grad():
        if isinstance(predictor, LayerwiseFrameAveragingGNN):
            _, frames = predictor.forward_with_frames(loc, vel, charges)
            return accumulation_length(predictor) * math.prod(1.0 + pca_condition(f) for f in frames)
        if isinstance(predictor, FrameAveragingGNN):
            return NBODY_TERMS * pca_condition(pca_frame(loc))
        if isinstance(canonicalizer, VNDeepSetsCanonicalizer):
            return NBODY_TERMS * max(1.0, frame_condition(canonicalizer.frame_vectors(loc, vel, charges)[0][:, :3]))
    return NBODY_TERMS


def equivariance_check(model: torch.nn.Module, frames, dtype: torch.dtype) -> tuple[float, float, float]:
    """``max |model(x Rᵀ + t, v Rᵀ, q) − (model(x, v, q) Rᵀ + t)|`` over the sampled ``(R, t)``, its tolerance
    ``rel_tol(outputs, factor=equivariance_factor(...))`` in ``dtype`` (the smallest over the elements), and the
    outputs' scale: ``cn.check_equivariance`` with this family's factor as its ``rtol``."""
    loc, vel, charges = (x.to(dtype) for x in frames)
    factor = equivariance_factor(model, loc, vel, charges)
    result = cn.check_equivariance(model, (loc, vel, charges), list(sampled_transforms(len(loc), dtype)),
                                   output_action="points", rtol=factor * torch.finfo(dtype).eps)
    return (result.max_abs_error, min(e.tolerance for e in result.elements),
            max(e.scale for e in result.elements))


def test_every_table_row_has_an_experiment():
    rows = ["gnn", *EQUIVARIANT_ROWS, *TURNED_ROWS, *SE3_ROWS, *VARIANTS, *PERMUTATION_ROWS]
    assert set(NBODY_EXPERIMENTS) == {f"nbody/{row}" for row in rows}


def test_forward_contract(frames):
    loc, vel, charges = frames
    for row in ("gnn", "cn_gnn"):
        out = build_row(row)(loc, vel, charges)
        assert out.shape == loc.shape and out.dtype == torch.float32 and torch.isfinite(out).all()


def test_real_frames_have_unique_pca_axes(frames):
    # FA-GNN is equivariant only where the scatter matrix has distinct eigenvalues; otherwise its test below
    # would fail for a reason unrelated to the code. The relative eigengap must keep the whole-GNN FA's
    # float32 tolerance NBODY_TERMS · eps32 / gap within MEANINGFUL of the scale.
    centred = (frames[0] - frames[0].mean(dim=1, keepdim=True)).double()
    eigvals = torch.linalg.eigvalsh(centred.transpose(1, 2) @ centred)
    assert ((eigvals[:, 1:] - eigvals[:, :-1]) / eigvals[:, -1:]).min() > NBODY_TERMS * EPS32 / MEANINGFUL


#: Rows also checked in float32: those whose worst-case float32 bound stays within MEANINGFUL. The CN rows'
#: learned frames (κ ~ 50 on these systems) and the layer-wise FA-GNN's four compounded re-framings
#: (Π (1 + κ_l) ~ 1e6) put theirs above 1 % of the scale, so they are checked in float64 only, where the same
#: bounds are ≤ ~1e-9 of the scale.
FLOAT32_ROWS = ["linear", "egnn", "fa_gnn_global", "radial_field"]


@pytest.mark.parametrize(
    ("row", "dtype"),
    [*((row, torch.float32) for row in FLOAT32_ROWS),
     *((row, torch.float64) for row in EQUIVARIANT_ROWS + TURNED_ROWS + VARIANTS)],
    ids=lambda v: {torch.float32: "float32", torch.float64: "float64"}.get(v, v),
)
def test_row_is_e3_equivariant(row, dtype, frames):
    error, tol, scale = equivariance_check(build_row(row, dtype), frames, dtype)
    assert tol < MEANINGFUL * scale, f"nbody/{row}: inputs too close to a degenerate frame (tolerance {tol:.3g})"
    assert error < tol, f"nbody/{row}: max error {error:.3g} vs tolerance {tol:.3g}"


def test_plain_gnn_row_is_not_equivariant(frames):
    """The same check fails for the GNN row: it can tell an equivariant model from one that is not. Its
    error is compared with the loosest float32 tolerance any equivariant row gets (MEANINGFUL)."""
    error, _, scale = equivariance_check(build_row("gnn"), frames, torch.float32)
    assert error > MEANINGFUL * scale


def test_canonicalized_rows_do_not_reduce_to_the_centroid(frames):
    """CN rows must use the predictor's output, or equivariance would hold vacuously (prediction = t)."""
    loc, vel, charges = frames
    model = build_row("cn_gnn_o3")
    out = model(loc, vel, charges)
    # O(1) away from the centroid (MEANINGFUL of the positions' scale), far beyond any rounding
    assert (out - loc.mean(dim=1, keepdim=True)).abs().max() > MEANINGFUL * loc.abs().max()


def test_test_mse_is_the_mean_over_all_coordinates(tiny_dir):
    # 16 test systems in batches of 6: the last batch is smaller and must not be over-weighted.
    model = build_row("cn_gnn")
    dm = NBodyDataModule(data_dir=str(tiny_dir), batch_size=6, **TINY)
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    logged = trainer.test(model, datamodule=dm, verbose=False)[0]["test/mse"]
    loc, vel, charges, target = dm.splits["test"].tensors
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(model(loc, vel, charges), target).item()
    # The same 240 squared errors summed in other groupings (positive terms: ≤ 240 eps relative) from
    # outputs computed in batches of 6 rather than 16 (a few eps of the scale apart, as the equivariance
    # errors of these rows are; ≪ 240 eps of the mse here): 2⁸ eps32 ≈ 3e-5. Over-weighting the smaller
    # last batch would be off by ~4e-2 on these systems; observed difference ~1e-7.
    assert logged == pytest.approx(expected, rel=2**8 * EPS32)


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
    written = read_results(tmp_path)
    assert written["experiment"] == experiment and written["status"] == "completed"
    assert math.isfinite(written["metrics"]["test/mse"]) and written["metrics"]["test/mse"] > 0
    assert set(written["best_val"]) == {"val/mse"}
    assert written["checkpoint"].endswith(".ckpt")
    assert results["metrics"] == written["metrics"]


def test_last_checkpoint_is_every_epoch_not_every_improvement(tiny_dir, tmp_path):
    """last.ckpt follows the epochs trained, also where validation does not improve or does not run.

    Lightning's ModelCheckpoint(save_last=True) rewrote last.ckpt only where it saved a best checkpoint, so a
    long N-body run on a plateau resumed from its last improvement (issue 32). Here validation runs only
    after epoch 4 (every 5 epochs), and 3 epochs are trained: the old callback wrote no last.ckpt at all.
    A rerun with a larger budget then trains exactly the missing epochs.
    """
    counts = [f"data.{k}={v}" for k, v in TINY.items()]
    overrides = ["experiment=nbody/gnn", f"data.data_dir={tiny_dir}", "data.batch_size=8", *counts,
                 "trainer.check_val_every_n_epoch=5"]
    def config(max_epochs: int) -> DictConfig:
        cfg = shrink(compose_config(overrides, tmp_path))
        with open_dict(cfg):
            cfg.trainer.max_epochs = max_epochs
        return cfg

    run(config(3))
    last = tmp_path / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert (state["epoch"], state["global_step"]) == (2, 6)  # 0-based epoch 2 done, 3 epochs x 2 batches

    (tmp_path / "results.json").unlink()
    resumed = run(config(6))
    assert record_path(resumed, "resumed_from") == last
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert (state["epoch"], state["global_step"]) == (5, 12)  # 3 more epochs, not 6
    # the record's fitting time is the whole fit's, not the tested (best, epoch 4) checkpoint's: testing
    # restores the callbacks' states from that checkpoint
    assert resumed["fit_time_s"] >= round(state["callbacks"]["FitClock"]["fit_time_s"], 2)
    assert resumed["best_val"]  # the validation after epoch 4 chose the tested checkpoint


def test_the_turned_row_turns_its_frames_in_lightning_training_and_not_in_validation(tiny_dir):
    """nbody/cn_gnn_turned under a real Trainer: Lightning sets its submodules' modes itself (the frozen
    canonicalizer's stays False), so the turn must follow the model's mode. In each training step the predictor's
    canonical inputs are the untrained frame's turned by a Haar element (never that frame's own); in validation
    they are the frame's own."""
    from lightning import Callback

    model = build_row("cn_gnn_turned").train()
    canon = model.network.canonicalizer
    seen = {"train": [], "val": []}

    def own_frame(batch) -> torch.Tensor:  # the canonical positions of the frame itself (no turn)
        with torch.no_grad():
            return canon.group_element(*batch[:3]).inverse_on_points(batch[0])

    class Watch(Callback):
        def record(self, split, pl_module, batch):
            with torch.no_grad():
                canonical, _ = canon.canonicalize(*batch[:3])
            turned = canonical[0]
            canon.frame_augmentation = False  # the same frame, unturned, for comparison
            try:
                seen[split].append(torch.allclose(turned, own_frame(batch), atol=1e-5))
            finally:
                canon.frame_augmentation = True

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.record("train", pl_module, batch)

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            self.record("val", pl_module, batch)

    dm = NBodyDataModule(data_dir=str(tiny_dir), batch_size=8, **TINY)
    trainer = Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[Watch()],
                      num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    assert seen["train"] and not any(seen["train"])  # every training batch turned (after a validation, too)
    assert seen["val"] and all(seen["val"])
