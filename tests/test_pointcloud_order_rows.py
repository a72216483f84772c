"""The point-cloud rows of issue 36 (the symmetric group): a point Transformer that depends on the order of the
points (canonical_network/prediction/point_transformer.py), alone (``modelnet/transformer``), behind SO(3) × S_n
canonicalization (``modelnet/cn_transformer``), and behind either half (``cn_transformer_so3``,
``cn_transformer_sn``), built from their real configs on synthetic-shape clouds of the CPU budget's size.

What is checked, and why this way:

* invariance is exact by construction, so it is checked in float64 through ``cn.check_equivariance`` with its
  derived tolerance ``rtol = n · κ · eps`` (``n``: the accumulated terms, counted by the check plus the
  attention sums it cannot see; ``κ``: the conditioning of the learned frames at these clouds, at least
  MAX_FRAME_CONDITION), as tests/test_canonicalizer_contract.py checks every canonicalizer;
* the discontinuous choices must be far from a tie at these inputs, or a rotation's rounding could flip them
  and move the logits by O(1), which no rounding tolerance covers: the kNN graph of the VN canonicalizer's edge
  input (``assert_knn_stable``) and the sorted scores of the S_n scorer (:func:`assert_clear_order`);
* each model that should not be invariant to a group misses the same check by far (the contract test's CONTROL_MARGIN times its
  tolerance): the bare Transformer under SO(3) × S_n, the SO(3) half under S_n, the S_n half under SO(3);
* gradients reach the parameters of both factors of the product (the frame through the rotated points, the
  scorer through the straight-through Sinkhorn term), and a few training steps run end to end.
"""

from __future__ import annotations

import functools

import hydra
import lightning as L
import pytest
import torch
from torch import nn

import canonical_network as cn
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.canonicalization.product import ProductCanonicalizer
from canonical_network.equivariance import accumulation_length
from canonical_network.prediction.point_transformer import PointTransformer
from canonical_network.records import read_results
from canonical_network.train import run
from tests.helpers import (
    DEEP_TERMS,
    MAX_FRAME_CONDITION,
    assert_knn_stable,
    compose_config,
    frame_condition,
    shrink,
)
from tests.test_canonicalizer_contract import _assert_fails_by_far, _assert_passes
from tests.test_pointcloud_tasks import tiny_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

#: the CPU budget's clouds (scripts/reproduce.sh pointclouds-cpu: data.num_points=256); the validation and
#: test splits of 16 clouds hold every one of the 7 categories
NUM_POINTS, NUM_CLOUDS = 256, 16
ROWS = ("modelnet/transformer", "modelnet/cn_transformer", "modelnet/cn_transformer_so3",
        "modelnet/cn_transformer_sn")


def _overrides(experiment: str) -> list[str]:
    return [f"experiment={experiment}", f"data.num_points={NUM_POINTS}", "data.num_train=16",
            f"data.num_val={NUM_CLOUDS}", f"data.num_test={NUM_CLOUDS}"]


@functools.cache
def _split(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(points (16, 256, 3) float64, labels (16,))`` of a split of the synthetic shapes, as the data module
    makes it."""
    data = hydra.utils.instantiate(compose_config(_overrides("modelnet/transformer")).data)
    data.setup()
    points, labels = data.splits[name].tensors
    return points.double(), labels


def _model(experiment: str) -> nn.Module:
    """The row's LightningModule (seed 0) in float64, eval mode, with every batch norm (the VN canonicalizer's)
    holding the statistics of one training-mode pass over the validation clouds. With the initial running
    statistics (mean 0, variance 1) an untrained canonicalizer barely reacts to its input, which would make
    the frames, and so the checks, close to degenerate."""
    cfg = compose_config(_overrides(experiment))
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model).double()
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one pass, exactly that batch's statistics
    model.train()
    with torch.no_grad():
        model(_split("val")[0])
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


def _factors(model: nn.Module) -> tuple[VNPointCloudCanonicalizer | None, cn.PermutationCanonicalizer | None]:
    """The SO(3) and S_n canonicalizers of a row (``None`` where it has none)."""
    h = model.network.canonicalizer
    if isinstance(h, ProductCanonicalizer):
        return h.first, h.second
    return (h if isinstance(h, VNPointCloudCanonicalizer) else None,
            h if isinstance(h, cn.PermutationCanonicalizer) else None)


def _terms(model: nn.Module, points: torch.Tensor) -> int:
    """``n`` of the tolerance: what ``accumulation_length`` counts (the ``nn.Linear`` fan-ins, the input's size)
    plus what it cannot see in the Transformer: per layer the attention's input projection (a fused parameter,
    fan-in ``dim``) and its sums over the ``P`` keys (softmax and weighted values)."""
    f = model.network.predictor
    assert isinstance(f, PointTransformer)
    dim, depth = f.position.shape[1], len(f.encoder.layers)
    extra = depth * (dim + 2 * points.shape[1])
    return 2 ** (accumulation_length(model, (points,)) + extra - 1).bit_length()


def _conditioning(model: nn.Module, points: torch.Tensor) -> float:
    """``κ``: the measured Gram–Schmidt conditioning of the learned frames at ``points`` (tests/helpers.py),
    at least MAX_FRAME_CONDITION; the S_n factor adds none (a sort reorders numbers, it does not round them)."""
    so3, _ = _factors(model)
    if so3 is None:
        return MAX_FRAME_CONDITION
    with torch.no_grad():
        return max(frame_condition(so3.frame_vectors(points), so3.group), MAX_FRAME_CONDITION)


def assert_clear_order(scores: torch.Tensor, factor: float) -> None:
    """Every gap between consecutive sorted scores ``(B, n)`` exceeds their rounding error,
    ``factor · eps · max |score|`` of the cloud: only then is the order the same for the rotated cloud (whose
    canonical points differ from these by rounding) and on another machine's kernels."""
    gaps = scores.sort(dim=-1).values.diff(dim=-1).amin(dim=-1)
    needed = factor * torch.finfo(scores.dtype).eps * scores.abs().amax(dim=-1)
    assert (gaps > needed).all(), f"scores within rounding of a tie: gap {gaps.min():.3g} vs {needed.max():.3g}"


def _assert_stable_inputs(model: nn.Module, points: torch.Tensor, kappa: float) -> None:
    """The discontinuous choices of the row's canonicalizers are far from a tie at ``points`` (module docstring)."""
    so3, sn = _factors(model)
    assert_knn_stable(points, so3.k if so3 is not None else 20)
    if sn is not None:
        with torch.no_grad():
            canonical = so3.canonicalize(points)[0][0] if so3 is not None else points
            assert_clear_order(sn.scores(canonical), DEEP_TERMS * kappa)


def _check(experiment: str, group: str) -> cn.EquivarianceResult:
    model = _model(experiment)
    points = _split("test")[0]
    kappa = _conditioning(model, points)
    _assert_stable_inputs(model, points, kappa)
    return cn.check_equivariance(model, (points,), group, terms=_terms(model, points), conditioning=kappa)




# ------------------------------------------------------------------------------------------------ the backbone
def test_the_transformer_depends_on_the_order_and_refuses_other_sizes():
    """Reordering the points changes the logits (the index encodings), and a cloud of another size than
    prediction.num_points is refused with that key named."""
    f = PointTransformer(num_classes=7, num_points=NUM_POINTS, dropout=0.0).double().eval()
    points = _split("test")[0]
    with torch.no_grad():
        out = f(points)
        shuffled = f(points[:, torch.randperm(NUM_POINTS, generator=torch.Generator().manual_seed(0))])
    assert (shuffled - out).abs().amax() > 1e-3 * out.abs().amax()
    with pytest.raises(ValueError, match="clouds of 128 points, but prediction.num_points is 256"):
        f(points[:, :128])
    with pytest.raises(ValueError, match="prediction.heads must divide prediction.dim; got heads=3, dim=64"):
        PointTransformer(num_classes=7, num_points=8, heads=3)
    with pytest.raises(ValueError, match="prediction.head"):
        PointTransformer(head="segmentation", num_classes=7, num_points=8)


def test_the_rows_follow_the_data_and_their_canonicalizers():
    cfgs = {row: compose_config(_overrides(row)) for row in ROWS}
    assert {row: cfg.prediction.num_points for row, cfg in cfgs.items()} == dict.fromkeys(ROWS, NUM_POINTS)
    assert cfgs["modelnet/cn_transformer"].canonicalization.first.k == 20
    assert cfgs["modelnet/cn_transformer_sn"].canonicalization.in_features == 3
    for row in ROWS[1:]:
        cfg = cfgs[row]
        assert cfg.canonicalization.get("second", cfg.canonicalization).get("output", "invariant") == "invariant"
        cfg.canonicalization = cfgs[ROWS[0]].canonicalization
        cfg.experiment_name = ROWS[0]
        assert cfg == cfgs[ROWS[0]], f"{row} differs from {ROWS[0]} by more than its canonicalizer"


# ------------------------------------------------------------------------------------------------- invariance
def test_cn_transformer_is_invariant_to_rotations_and_permutations():
    _assert_passes(_check("modelnet/cn_transformer", "SO(3)×S_n"))


def test_the_bare_transformer_fails_the_same_check_by_far():
    _assert_fails_by_far(_check("modelnet/transformer", "SO(3)×S_n"))


@pytest.mark.parametrize(("experiment", "own", "other"), [("modelnet/cn_transformer_so3", "SO(3)", "S_n"),
                                                          ("modelnet/cn_transformer_sn", "S_n", "SO(3)")])
def test_each_half_is_invariant_to_its_own_group_only(experiment, own, other):
    _assert_passes(_check(experiment, own))
    _assert_fails_by_far(_check(experiment, other))


# ------------------------------------------------------------------------------------------------- training
def test_gradients_reach_both_factors():
    """One training-mode loss of cn_transformer: every trainable parameter of the SO(3) factor (through the
    rotated points), of the S_n scorer (through the straight-through term of its Sinkhorn matrix) and of the
    Transformer gets a finite gradient, not all zero in any of the three."""
    cfg = compose_config(_overrides("modelnet/cn_transformer"))
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model).double().train()
    points, labels = _split("val")
    model.training_step((points, labels), 0).backward()
    h = model.network.canonicalizer
    for name, part in (("SO(3) factor", h.first), ("S_n scorer", h.second), ("Transformer", model.network.predictor)):
        grads = [p.grad for p in part.parameters() if p.requires_grad]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert any(g.abs().max() > 0 for g in grads), f"no gradient reaches the {name}"
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in h.second.parameters()), "S_n scorer"


def test_cn_transformer_trains_end_to_end(tmp_path):
    """A few training steps through ``canonical_network.train.run`` (tiny data, a one-layer Transformer), the
    test loop and the record; the canonicalizer's weights move (both factors are trained, not only f)."""
    cfg = shrink(compose_config(tiny_overrides("modelnet/cn_transformer"), tmp_path))
    L.seed_everything(cfg.seed, workers=True)  # the initial weights as run() builds them: seed, data, model
    hydra.utils.instantiate(cfg.data)
    before = hydra.utils.instantiate(cfg.model).network.canonicalizer.state_dict()
    results = run(cfg)
    written = read_results(tmp_path)
    assert written["experiment"] == "modelnet/cn_transformer" and written["status"] == "completed"
    assert 0.0 <= written["metrics"]["test/acc"] <= 1.0
    assert results["params"]["canonicalizer"] > 0
    after = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for factor in ("first", "second"):
        moved = [not torch.equal(after[f"network.canonicalizer.{k}"], v) for k, v in before.items()
                 if k.startswith(f"{factor}.") and v.is_floating_point() and "running" not in k]
        assert any(moved), f"the {factor} factor's weights did not change in training"
