"""The point-cloud tasks (paper §5.3) as built from their real configs: CN-PointNet and CN-DGCNN logits and
part logits invariant under sampled rotations of realistic synthetic shapes while plain PointNet's are not,
the data-dependent sizes, the PointNet regulariser, and every modelnet/* and shapenet/* experiment run end to
end through ``canonical_network.train.run``.

Widths are reduced through command-line overrides (an eighth of the reference widths, 64-point clouds),
so everything here runs in well under a minute on two CPU cores.
"""

from __future__ import annotations

import functools
import itertools
import math

import hydra
import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from canonical_network import tables
from canonical_network.canonicalization.identity import IdentityCanonicalizer
from canonical_network.groups.euclidean import apply_rotation, random_orthogonal, random_rotations
from canonical_network.prediction.pointnet import feature_transform_regularizer
from canonical_network.records import read_results
from canonical_network.tasks.part_segmentation import PartSegmentationTask
from canonical_network.tasks.pointcloud_classification import PointCloudClassificationTask
from canonical_network.train import run
from tests.helpers import (
    DEEP_TERMS,
    EPS32,
    EPS64,
    EXPERIMENTS,
    MAX_FRAME_CONDITION,
    WORST_FRAME_CONDITION,
    assert_knn_stable,
    compose_config,
    frame_conditions,
    shrink,
)

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

# Invariance is exact by construction, so it is checked in float64 with a tolerance per cloud of
# DEEP_TERMS · max(κ, MAX_FRAME_CONDITION) · eps64 · max |logits| (tests/helpers.py: ≤ 2¹³ accumulated terms
# × the measured amplification κ of the cloud's canonical frame, at least 2⁷): ≥ 2.3e-10 of the logits'
# scale. In float32 the tiny canonicalizers' frames are conditioned enough that per-point logits moved by
# ~3e-4 with fewer points (see NUM_CLOUDS, NUM_POINTS).
#: Not a rounding tolerance: how far plain PointNet must miss (it is off by ~1 and more), ~9 orders of
#: magnitude above the float64 tolerance.
FAIL = 0.1
POINTCLOUD_EXPERIMENTS = [e for e in EXPERIMENTS if e.split("/")[0] in ("modelnet", "shapenet")]
ROWS = ["pointnet", "dgcnn", "vn_pointnet", "vn_dgcnn", "cn_frozen_pointnet", "cn_l_pointnet",
        "cn_nl_pointnet", "cn_frozen_dgcnn", "cn_l_dgcnn", "cn_nl_dgcnn"]
# Tiny data and networks, through the same overrides a user would type.
TINY_DATA = ["data.num_train=16", "data.num_val=8", "data.num_test=8", "data.num_points=64",
             "data.batch_size=8"]
TINY_NETWORK = ["prediction.width=0.125", "prediction.emb_dims=32"]
# Clouds and points per invariance check: the test split of the synthetic shapes (all 7 categories). With
# fewer points a mug's handle, the only part that fixes its orientation, is a handful of points, and its
# frame becomes sensitive enough to rounding to move per-point logits by ~3e-4.
NUM_CLOUDS, NUM_POINTS = 16, 128


#: the point Transformer rows (issue 36, tests/test_pointcloud_order_rows.py): one 16-channel layer, and an
#: 8-channel S_n scorer where the row has one, so that h stays under the end-to-end test's 1,000 parameters
#: (the scorer's key differs between the product and the S_n half)
TINY_TRANSFORMER = ["prediction.dim=16", "prediction.depth=1", "prediction.heads=2"]
TINY_SCORER = {"cn_transformer": "canonicalization.second.hidden_dim=8",
               "cn_transformer_sn": "canonicalization.hidden_dim=8"}


def network_overrides(experiment: str) -> list[str]:
    """The overrides that shrink an experiment's networks; kNN predictors (DGCNN, both VN nets) get k = 8."""
    row = experiment.split("/")[1]
    if "transformer" in row:
        return [*TINY_TRANSFORMER, *([TINY_SCORER[row]] if row in TINY_SCORER else [])]
    predictor = row.removeprefix("cn_frozen_").removeprefix("cn_l_").removeprefix("cn_nl_")
    return [*TINY_NETWORK, *([] if predictor == "pointnet" else ["prediction.k=8"])]


def tiny_overrides(experiment: str) -> list[str]:
    """An experiment with tiny synthetic data and tiny networks."""
    return [f"experiment={experiment}", *TINY_DATA, *network_overrides(experiment)]


@functools.cache
def tiny_config(experiment: str, *extra: str) -> DictConfig:
    # Composing costs more than building the tiny models: once per (experiment, overrides); read-only.
    return compose_config([*tiny_overrides(experiment), *extra])


@functools.cache
def synthetic_split(task: str, split: str, num_points: int = NUM_POINTS) -> tuple[torch.Tensor, ...]:
    """A split of the synthetic shapes as the real data module makes it:
    ``(points, category[, part labels])``."""
    experiment = "modelnet/pointnet" if task == "classification" else "shapenet/pointnet"
    cfg = compose_config([f"experiment={experiment}", f"data.num_points={num_points}", "data.num_train=16",
                          f"data.num_val={NUM_CLOUDS}", f"data.num_test={NUM_CLOUDS}"])
    data = hydra.utils.instantiate(cfg.data)
    data.setup()
    return data.splits[split].tensors


def call(model: nn.Module, points: torch.Tensor, category: torch.Tensor | None) -> torch.Tensor:
    return model(points) if category is None else model(points, category)


def settled_model(experiment: str, *extra: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The experiment's LightningModule with every batch norm holding the statistics of one training-mode
    pass over other synthetic shapes (the validation split), then in eval mode.

    Why: with the initial running statistics (mean 0, variance 1) an untrained network barely reacts to its
    input, which would make any invariance check pass; with real statistics its logits spread over several
    units across the shapes (checked below).
    """
    cfg = tiny_config(experiment, *extra)
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model).to(dtype)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one pass, exactly that batch's statistics
    model.train()
    points, category, *_ = synthetic_split(cfg.data_info.task, "val")
    with torch.no_grad():
        call(model, points.to(dtype), category if cfg.data_info.task == "segmentation" else None)
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


def rotation_errors(
    model: nn.Module, task: str, group: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """Per cloud ``max |model(x Qᵀ) − model(x)|`` for one sampled ``Q`` per test cloud, the outputs, the
    rotated outputs, and the test clouds (in ``dtype``)."""
    points, category, *_ = synthetic_split(task, "test")
    points = points.to(dtype)
    category = category if task == "segmentation" else None
    sampler = random_rotations if group == "SO3" else random_orthogonal
    q = sampler(len(points), torch.Generator().manual_seed(1), dtype=dtype)
    with torch.no_grad():
        out = call(model, points, category)
        moved = call(model, apply_rotation(points, q), category)
    return (moved - out).abs().flatten(1).amax(dim=1), out, moved, points


# ------------------------------------------------------------------------------------------ invariance
@pytest.mark.parametrize(
    ("experiment", "group"),
    [
        *itertools.product(["modelnet/cn_nl_pointnet", "modelnet/cn_nl_dgcnn", "shapenet/cn_nl_pointnet",
                            "shapenet/cn_nl_dgcnn"], ["SO3", "O3"]),
        # CN(L) is SO(3) only: its mean-pooled linear frame spans a plane, completed by e₁ × e₂
        ("modelnet/cn_l_pointnet", "SO3"),
        ("shapenet/cn_l_dgcnn", "SO3"),
    ],
)
def test_canonicalized_models_are_invariant(experiment, group):
    model = settled_model(experiment, f"canonicalization.group={group}", dtype=torch.float64)
    task = "classification" if experiment.startswith("modelnet") else "segmentation"
    errors, out, moved, points = rotation_errors(model, task, group, torch.float64)
    # Not trivially flat: the outputs differ between shapes by ~1, nine orders above the tolerance.
    assert (out - out.mean(dim=0)).abs().max() > FAIL
    # The same neighbours after the rotation, for the canonicalizer's graph and a DGCNN's first one.
    for k in {model.canonicalizer.k, 8} - {None}:
        assert_knn_stable(points, k)
    with torch.no_grad():
        kappa = frame_conditions(model.canonicalizer.frame_vectors(points), group)  # (clouds,)
    scale = torch.maximum(out.abs().flatten(1).amax(dim=1), moved.abs().flatten(1).amax(dim=1))
    tolerance = DEEP_TERMS * kappa.clamp_min(MAX_FRAME_CONDITION) * torch.finfo(torch.float64).eps * scale
    # A shape with a mirror plane has no O(3)-equivariant frame (paper Appendix A): its third pooled vector
    # is decided by noise, and κ shows it. The synthetic shapes are mirror-symmetric up to their sampling
    # noise, so the check runs on the clouds whose frame is not that close to degenerate (κ below
    # WORST_FRAME_CONDITION, a tolerance ≤ 1.2e-7 of the scale), which must be all of them for SO(3) (its
    # third axis is e₁ × e₂) and most of them for O(3).
    defined = kappa < WORST_FRAME_CONDITION
    assert defined.sum() >= (len(defined) if group == "SO3" else 0.75 * len(defined)), kappa
    assert (errors[defined] < tolerance[defined]).all(), (errors / tolerance)[defined].max()


@pytest.mark.parametrize("experiment", ["modelnet/pointnet", "shapenet/pointnet"])
def test_plain_pointnet_is_not_invariant(experiment):
    model = settled_model(experiment, dtype=torch.float64)
    task = "classification" if experiment.startswith("modelnet") else "segmentation"
    errors, out, moved, _ = rotation_errors(model, task, "SO3", torch.float64)
    # the same float64 check as the canonicalized models', with their smallest factor (DEEP64): missed
    # by ~9 orders of magnitude
    scale = torch.maximum(out.abs().flatten(1).amax(dim=1), moved.abs().flatten(1).amax(dim=1))
    tolerance = DEEP_TERMS * MAX_FRAME_CONDITION * torch.finfo(torch.float64).eps * scale
    assert errors.min() > FAIL and (errors > 1e6 * tolerance).all()


# ---------------------------------------------------------------------------------------------- configs
def test_every_table_row_has_an_experiment_and_a_paper_row():
    paper = tables.paper_tables()
    for family, table in (("modelnet", "modelnet_table"), ("shapenet", "shapenet_table")):
        experiments = {f"{family}/{row}" for row in ROWS}
        assert experiments <= set(EXPERIMENTS)
        assert experiments == {row["experiment"] for row in paper[table]["rows"]}


@pytest.mark.parametrize(
    ("experiment", "data", "expected"),
    [
        ("modelnet/cn_nl_pointnet", "synthetic_shapes", {"num_classes": 7}),
        ("modelnet/cn_nl_dgcnn", "modelnet40", {"num_classes": 40}),
        ("shapenet/cn_nl_pointnet", "synthetic_shapes", {"num_parts": 20, "num_categories": 7}),
        ("shapenet/cn_nl_dgcnn", "shapenet_part", {"num_parts": 50, "num_categories": 16}),
    ],
)
def test_sizes_follow_the_data(experiment, data, expected):
    # Synthetic shapes have 7 classes / 7 categories / 20 parts, the real datasets 40 / 16 / 50: the
    # predictor and the task take them from the data config, whichever data is chosen.
    cfg = compose_config([f"experiment={experiment}", f"data={data}", *network_overrides(experiment)])
    model = hydra.utils.instantiate(cfg.model)
    for key, value in expected.items():
        assert getattr(model.network.predictor, key) == value
    if "num_parts" in expected:
        assert model.metrics["test/miou"].num_parts == expected["num_parts"]
        assert model.metrics["test/miou"].num_categories == expected["num_categories"]
    else:
        assert model.metrics["test/acc"].num_classes == expected["num_classes"]


def test_protocol_is_one_override_and_the_schedule_follows_the_paper():
    cfg = compose_config(["experiment=modelnet/cn_l_dgcnn", "data.rotation=z/so3"])
    assert cfg.data.rotation == "z/so3"
    # Table 5b's first column is the shapenet/* default
    assert compose_config(["experiment=shapenet/cn_l_dgcnn"]).data.rotation == "z/so3"
    # Appendix G.3: SGD from lr 0.1, cosine annealing to 0.001 over the 200 epochs, batch 32.
    assert cfg.trainer.max_epochs == 200 and cfg.data.batch_size == 32
    model = hydra.utils.instantiate(tiny_config("modelnet/cn_l_dgcnn").model)
    optimizers = model.configure_optimizers()
    optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["momentum"] == 0.9
    lrs = [optimizer.param_groups[0]["lr"]]
    for _ in range(200):
        optimizer.step()  # no gradients: parameters stay, only the schedule moves the learning rate
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    # float64 rates from torch's recursive cosine update: ≤ ~10 roundings per step over 200 steps ≈ 2¹¹ eps64
    # relative (a wrong schedule is off by O(1)); twice that.
    rel = 2**12 * EPS64
    assert lrs[0] == pytest.approx(0.1, rel=rel) and lrs[100] == pytest.approx(0.0505, rel=rel)
    assert lrs[200] == pytest.approx(1e-3, rel=rel)


def test_frozen_rows_differ_from_their_learned_row_by_freeze_only():
    for family, backbone in itertools.product(("modelnet", "shapenet"), ("pointnet", "dgcnn")):
        learned = compose_config([f"experiment={family}/cn_nl_{backbone}"])
        frozen = compose_config([f"experiment={family}/cn_frozen_{backbone}"])
        linear = compose_config([f"experiment={family}/cn_l_{backbone}"])
        assert frozen.canonicalization.freeze and not learned.canonicalization.freeze
        assert (learned.canonicalization.layers, linear.canonicalization.layers) == ("nonlinear", "linear")
        for other in (frozen, linear):
            other.canonicalization.freeze, other.canonicalization.layers = False, "nonlinear"
            other.experiment_name = learned.experiment_name
            assert other == learned


# ------------------------------------------------------------------------------------------------ losses
def smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
    """``(1 − ε) · NLL + ε · mean_c(−log p_c)`` averaged over the rows of ``logits`` ``(N, C)``, written out
    in float64 (log-softmax by hand) so that it checks torch's ``label_smoothing`` rather than reusing it."""
    z = logits.double()
    shifted = z - z.max(dim=1, keepdim=True).values
    log_p = shifted - shifted.exp().sum(dim=1, keepdim=True).log()
    nll = -log_p.gather(1, labels.view(-1, 1)).squeeze(1)
    uniform = -log_p.mean(dim=1)  # the mean over all C logits: ε / C on every class
    return ((1 - eps) * nll + eps * uniform).mean()


def test_smoothed_cross_entropy_by_hand():
    # A tiny example worked out on paper: logits (0, ln 3) → p = (1/4, 3/4); label 0; ε = 0.2:
    # 0.8 · ln 4 + 0.2 · (ln 4 + ln(4/3)) / 2.
    logits, labels = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64), torch.tensor([0])
    by_hand = 0.8 * math.log(4) + 0.2 * (math.log(4) + math.log(4 / 3)) / 2
    # float64 on both sides, ≤ ~10 roundings each (logs, exps, 2-term sums) of positive terms: 2⁶ eps64.
    rel = 2**6 * EPS64
    assert smoothed_cross_entropy(logits, labels, 0.2).item() == pytest.approx(by_hand, rel=rel)
    assert F.cross_entropy(logits, labels, label_smoothing=0.2).item() == pytest.approx(by_hand, rel=rel)


def _step_off_orthogonal(*overrides: str):
    """``modelnet/pointnet``'s task with its feature T-Net moved off orthogonal, and its training loss on the
    synthetic validation split (dropout seeded 3): ``(model, points, labels, loss)``."""
    model = hydra.utils.instantiate(tiny_config("modelnet/pointnet", *overrides).model).train()
    tnet = model.network.predictor.encoder.feature_tnet
    with torch.no_grad():
        tnet.to_matrix.bias.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(2))  # not orthogonal
    points, labels = synthetic_split("classification", "val")
    torch.manual_seed(3)
    return model, points, labels, model.training_step((points, labels), 0)


def test_classification_loss_is_label_smoothed_and_adds_pointnets_regulariser():
    # Paper recipe (DGCNN, the authors' models/pointcloud_classification_models.py): ε = 0.2 by default.
    model, points, labels, loss = _step_off_orthogonal()
    assert model.label_smoothing == 0.2
    torch.manual_seed(3)  # the same dropout mask
    logits = model(points)
    penalty = feature_transform_regularizer(model.network.predictor.last_feature_transform)
    assert penalty > 1.0
    expected = smoothed_cross_entropy(logits, labels, 0.2) + 1e-3 * penalty
    # The float32 loss sums positive terms: 40 exponentials per cloud, 16 clouds, the regulariser's 8² squared
    # entries of 8-term products (feature T-Net at width 1/8): ≤ ~2⁷ roundings, relative; twice that.
    assert loss.item() == pytest.approx(expected.item(), rel=2**8 * EPS32)


def test_the_regularizers_norm_is_a_config_key_that_reaches_the_loss():
    # model.feature_transform_norm=frobenius: the training loss adds 1e-3 ‖I − A Aᵀ‖_F, not its square
    model, points, labels, loss = _step_off_orthogonal("model.feature_transform_norm=frobenius")
    transform = model.network.predictor.last_feature_transform
    squared, unsquared = feature_transform_regularizer(transform), feature_transform_regularizer(transform, "frobenius")
    assert squared > 1.5 * unsquared  # the check below tells them apart
    torch.manual_seed(3)  # the same dropout mask
    expected = smoothed_cross_entropy(model(points), labels, 0.2) + 1e-3 * unsquared
    # float32, as the test above: ≤ ~2⁷ roundings of positive terms, relative; twice that
    assert loss.item() == pytest.approx(expected.item(), rel=2**8 * EPS32)
    # part segmentation reads the same key; a bad value is refused naming the key and the choices
    segmentation = hydra.utils.instantiate(tiny_config("shapenet/pointnet", "model.feature_transform_norm=frobenius").model)
    assert segmentation.feature_transform_norm == "frobenius"
    with pytest.raises(Exception, match="feature_transform_norm.*squared.*frobenius.*cubed"):
        hydra.utils.instantiate(tiny_config("modelnet/pointnet", "model.feature_transform_norm=cubed").model)


@pytest.mark.parametrize("eps", [0.0, 0.2, 0.5])
def test_classification_loss_matches_the_smoothed_cross_entropy(eps):
    # Settled batch norms: logits that differ between shapes, so smoothed and plain losses differ clearly.
    model = settled_model("modelnet/dgcnn", f"model.label_smoothing={eps}")
    points, labels = synthetic_split("classification", "test")
    loss = model.training_step((points, labels), 0)  # eval mode: no dropout; DGCNN: no regulariser
    logits = model(points)
    plain = F.cross_entropy(logits, labels).item()
    # float32 sums of positive terms, 40 logits per cloud and 16 clouds: ≤ ~2⁷ roundings; twice that.
    rel = 2**8 * EPS32
    assert loss.item() == pytest.approx(smoothed_cross_entropy(logits, labels, eps).item(), rel=rel)
    if eps == 0.0:
        assert loss.item() == pytest.approx(plain, rel=rel)
    else:
        # not silently plain cross-entropy: smoothing moves the loss by O(10 %), not by rounding
        assert abs(loss.item() - plain) > 1e-2 * plain


@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_segmentation_loss_is_per_point_smoothed_cross_entropy_over_all_parts(eps):
    cfg = tiny_config("shapenet/dgcnn", f"model.label_smoothing={eps}")
    model = hydra.utils.instantiate(cfg.model).eval()  # no regulariser: DGCNN
    points, category, labels = synthetic_split("segmentation", "val")
    loss = model.training_step((points, category, labels), 0)
    logits = model(points, category)
    num_parts = cfg.data_info.num_parts
    assert logits.shape == (*labels.shape, num_parts) and num_parts == 20
    # ε spread over all num_parts logits (ε / 20 each here, ε / 50 on ShapeNet), not over 16 categories
    expected = smoothed_cross_entropy(logits.reshape(-1, num_parts), labels.flatten(), eps)
    # float32 sums of positive terms: 20 parts per point, a mean over 8 · 128 points: ≤ ~2¹⁰ roundings; ×2.
    rel = 2**11 * EPS32
    assert loss.item() == pytest.approx(expected.item(), rel=rel)
    if eps == 0.0:
        plain = F.cross_entropy(logits.reshape(-1, num_parts), labels.flatten())
        assert loss.item() == pytest.approx(plain.item(), rel=rel)


def test_vn_part_segmentation_rows_train_with_their_authors_recipe():
    """Table 5b's VN rows are Deng et al.'s numbers, trained by vnn's train_partseg.py: Adam 1e-3, weight decay
    1e-4, the rate halved every 20 epochs; the other rows (and Table 4's VN rows) keep App. G.3's SGD."""
    for experiment in ("shapenet/vn_pointnet", "shapenet/vn_dgcnn"):
        model = hydra.utils.instantiate(tiny_config(experiment).model)
        optimizers = model.configure_optimizers()
        optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        assert type(optimizer) is torch.optim.Adam, experiment
        assert optimizer.param_groups[0]["weight_decay"] == 1e-4
        lrs = [optimizer.param_groups[0]["lr"]]
        for _ in range(45):
            optimizer.step()  # no gradients: only the schedule moves the rate
            scheduler.step()
            lrs.append(optimizer.param_groups[0]["lr"])
        # a step schedule multiplies by exactly 0.5 (one rounding at most, well inside rel 1e-12)
        assert lrs[0] == lrs[19] == pytest.approx(1e-3, rel=1e-12)
        assert lrs[20] == lrs[39] == pytest.approx(5e-4, rel=1e-12) and lrs[40] == pytest.approx(2.5e-4, rel=1e-12)
    for experiment in ("shapenet/dgcnn", "shapenet/cn_nl_pointnet", "modelnet/vn_dgcnn", "modelnet/vn_pointnet"):
        cfg = compose_config([f"experiment={experiment}"])
        assert cfg.model.optimizer._target_ == "torch.optim.SGD", experiment
        assert cfg.model.scheduler._target_ == "torch.optim.lr_scheduler.CosineAnnealingLR", experiment


def test_label_smoothing_defaults_follow_the_reference_recipe():
    for experiment in ("modelnet/cn_l_pointnet", "shapenet/cn_l_dgcnn", "shapenet/vn_dgcnn"):
        assert compose_config([f"experiment={experiment}"]).model.label_smoothing == 0.2
    # vnn's VN-PointNet part segmentation trains on plain NLL (models/vn_pointnet_partseg.py)
    assert compose_config(["experiment=shapenet/vn_pointnet"]).model.label_smoothing == 0.0


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5, True, "0.2"])
@pytest.mark.parametrize("task", [PointCloudClassificationTask, PartSegmentationTask])
def test_label_smoothing_is_validated(task, eps):
    with pytest.raises(ValueError, match="model.label_smoothing"):
        task(IdentityCanonicalizer(), nn.Identity(), optimizer=None, label_smoothing=eps)


# -------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("experiment", POINTCLOUD_EXPERIMENTS)
def test_experiment_runs_end_to_end(experiment, tmp_path):
    cfg = shrink(compose_config(tiny_overrides(experiment), tmp_path))
    results = run(cfg)
    written = read_results(tmp_path)
    assert written["experiment"] == experiment and written["status"] == "completed"
    if experiment.startswith("modelnet"):
        expected = {"test/acc", "test/class_acc", "test/loss"}
        assert cfg.optimized_metric in written["best_val"] and cfg.optimized_metric == "val/acc"
    else:
        expected = {"test/acc", "test/instance_miou", "test/class_miou", "test/loss"}
        assert cfg.optimized_metric in written["best_val"] and cfg.optimized_metric == "val/instance_miou"
    assert set(written["metrics"]) == expected | {"test/identity_rate"}  # the rate: every task, tasks/base.py
    assert all(0.0 <= written["metrics"][k] <= 1.0 for k in expected - {"test/loss"})
    assert written["config"]["data"]["rotation"] == cfg.data.rotation  # what the tables match columns on
    canonicalizer = results["params"]["canonicalizer"]
    assert (0 < canonicalizer < 1000) if "/cn_" in experiment else canonicalizer == 0  # h is small
