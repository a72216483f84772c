"""The N-body (E(3)) and point-cloud (SO(3)/O(3)) canonicalizers: h(g·x) = g·h(x), invariant canonical
inputs, an equivariant/invariant CanonicalizedModel around a non-equivariant predictor, freezing, and
degenerate inputs."""

from __future__ import annotations

import functools
import itertools
import pickle

import pytest
import torch
from torch import nn

import canonical_network.canonicalization.nbody as nbody_module
from canonical_network.canonicalization.base import CanonicalizedModel
from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.groups.euclidean import (
    EuclideanTransform,
    apply_rotation,
    random_euclidean,
    random_orthogonal,
    random_rotations,
    random_translations,
)
from canonical_network.nn.vector_neurons import vn_leaky_relu
from tests.helpers import (
    assert_close,
    assert_knn_stable,
    frame_condition,
    frame_factor,
    max_err,
    orthonormality_tol,
    rel_tol,
    seeded_gen,
)

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

# Equivariance is exact by construction, so it is checked in float64 with assert_close(..., factor): a
# tolerance of factor · eps64 of the outputs' scale, factor = frame_factor(κ) = 2¹³ accumulated terms × the
# amplification κ of the frame built from these inputs (at least 2⁷, so ≥ DEEP64 ≈ 2.3e-10 relative;
# tests/helpers.py). Observed errors are ≤ ~1e-4 of the tolerance.
#: Not a rounding tolerance: how far a non-equivariant predictor must miss (it is off by O(0.1..1)),
#: ~7 orders of magnitude above the float64 tolerance; the controls also assert > 1e6 × that tolerance.
FAIL = 1e-2
F64 = torch.float64


def _orthogonality_error(r: torch.Tensor) -> float:
    return max_err(r.transpose(-1, -2) @ r, torch.eye(3, dtype=r.dtype).expand_as(r))


# ================================================================================================ N-body
def nbody_inputs(batch: int = 6, particles: int = 5, seed: int = 0, dtype=torch.float32):
    """Positions ~ N(0, 1), velocities of norm 0.5 in random directions, charges ±1 (the §5.2 system)."""
    gen = seeded_gen(seed)
    loc = torch.randn(batch, particles, 3, generator=gen, dtype=dtype)
    direction = torch.randn(batch, particles, 3, generator=gen, dtype=dtype)
    vel = 0.5 * direction / direction.norm(dim=-1, keepdim=True)
    charges = (2 * torch.randint(0, 2, (batch, particles, 1), generator=gen) - 1).to(dtype)
    return loc, vel, charges


class NBodyMLP(nn.Module):
    """A per-particle MLP on raw coordinates: the kind of predictor that is not equivariant."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(7, 32), nn.SiLU(), nn.Linear(32, 3))

    def forward(self, loc, vel, charges):
        return loc + self.net(torch.cat([loc, vel, charges], dim=-1))


def act(g: EuclideanTransform, loc, vel, charges):
    return g.apply_to_points(loc), g.apply_to_vectors(vel), charges


def _nbody(translation: str = "learned", seed: int = 1, **kwargs) -> VNDeepSetsCanonicalizer:
    torch.manual_seed(seed)
    return VNDeepSetsCanonicalizer(translation=translation, **kwargs)


@pytest.mark.parametrize(("translation", "features"), [("learned", "pvq"), ("centroid", "pvq"), ("learned", "p"),
                                                      ("centroid", "p"), ("learned", "pv")])
def test_nbody_canonicalizer_is_e3_equivariant(translation, features):
    canon = _nbody(translation, features=features).double().eval()
    x = nbody_inputs(dtype=F64)
    g = random_euclidean(6, seeded_gen(2), group="O3", dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(*x)[0][:, :3]))
        (canonical, h), (canonical_moved, h_moved) = canon.canonicalize(*x), canon.canonicalize(*act(g, *x))
    assert _orthogonality_error(h.rotation) < orthonormality_tol(F64)
    # h(g·x) = g·h(x): R ↦ Q R, t ↦ Q t + s
    assert_close(h_moved.rotation, g.rotation @ h.rotation, factor)
    assert_close(h_moved.translation, g.apply_to_points(h.translation.unsqueeze(1)).squeeze(1), factor)
    # canonical inputs are invariant
    for a, b in zip(canonical, canonical_moved, strict=True):
        assert_close(a, b, factor)
    if translation == "centroid":
        assert torch.equal(h.translation, x[0].mean(dim=1))  # the same operation on the same numbers


def test_nbody_canonicalized_model_is_equivariant_and_the_predictor_alone_is_not():
    torch.manual_seed(3)
    predictor = NBodyMLP()
    model = CanonicalizedModel(_nbody(), predictor).double().eval()
    x = nbody_inputs(seed=4, dtype=F64)
    g = random_euclidean(6, seeded_gen(5), group="O3", dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(model.canonicalizer.frame_vectors(*x)[0][:, :3]))
        moved, expected = model(*act(g, *x)), g.apply_to_points(model(*x))
        alone, alone_expected = predictor(*act(g, *x)), g.apply_to_points(predictor(*x))
    assert_close(moved, expected, factor)
    assert max_err(alone, alone_expected) > max(FAIL, 1e6 * rel_tol(alone, alone_expected, factor=factor))


def test_nbody_equivariance_in_float64():
    torch.manual_seed(6)
    model = CanonicalizedModel(_nbody(), NBodyMLP()).double().eval()
    x = nbody_inputs(seed=7, dtype=torch.float64)
    g = random_euclidean(6, seeded_gen(8), group="O3", dtype=torch.float64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(model.canonicalizer.frame_vectors(*x)[0][:, :3]))
        assert_close(model(*act(g, *x)), g.apply_to_points(model(*x)), factor)
        (c, h), (c_moved, h_moved) = model.canonicalize(*x), model.canonicalize(*act(g, *x))
    assert_close(h_moved.rotation, g.rotation @ h.rotation, factor)
    assert_close(c[0], c_moved[0], factor)


def test_nbody_dropout_keeps_equivariance_in_training():
    canon = _nbody(dropout=0.5).double().train()
    x = nbody_inputs(seed=9, dtype=F64)
    g = random_euclidean(6, seeded_gen(10), group="O3", dtype=F64)
    torch.manual_seed(11)
    factor = frame_factor(frame_condition(canon.frame_vectors(*x)[0][:, :3]))
    torch.manual_seed(11)  # the same dropout mask in every pass
    _, h = canon.canonicalize(*x)
    torch.manual_seed(11)
    _, h_moved = canon.canonicalize(*act(g, *x))
    assert_close(h_moved.rotation, g.rotation @ h.rotation, factor)


@pytest.mark.parametrize("seed", [1, 4])
def test_nbody_positions_alone_leave_no_frame_without_dropout(seed, monkeypatch):
    """features="p" is degenerate (canonicalization/nbody.py): the mean of the centred positions is 0 and VN
    layers on one channel only rescale each position by a factor shared by all particles, so the pooled frame
    vectors are 0 in exact arithmetic; the four-vector default is not."""
    x = nbody_inputs(dtype=F64)

    def relative_frame(canon) -> torch.Tensor:  # largest frame vector over the mean centred particle norm
        with torch.no_grad():
            vectors, centroid = canon.frame_vectors(*x)
        return vectors[:, :3].norm(dim=-1).amax(dim=-1) / (x[0] - centroid.unsqueeze(1)).norm(dim=-1).mean(dim=-1)

    positions, default = _nbody(features="p", seed=seed).double().eval(), _nbody(seed=seed).double().eval()
    assert relative_frame(default).min() > 2e-2  # O(0.1): the product of O(1) weights on unit-scale inputs
    # what is left is the VN-ReLU's guard: its projection keeps ε / (‖k‖² + ε) of a vector it should zero,
    # ε = VN_EPS = 1e-6, ‖k‖² ≥ ~1e-4 on unit-scale inputs: ≤ 1e-2 relative
    assert relative_frame(positions).max() < 1e-2
    # without the guard the frame is zero up to float64 rounding (sums of ~10² terms of O(1): 1e-12 spares 10⁴ ulp)
    monkeypatch.setattr(nbody_module, "vn_leaky_relu", functools.partial(vn_leaky_relu, eps=0.0))
    assert relative_frame(positions).max() < 1e-12
    # vector dropout (a mask per particle) breaks the symmetry in training: frames of random particle subsets
    torch.manual_seed(0)
    assert relative_frame(positions.train()).min() > 1e-2


def test_nbody_frame_augmentation_turns_the_frame_in_training_only():
    """frame_augmentation: R S with S Haar on O(3) while the model trains (a frozen canonicalizer included, whose
    module stays in eval mode), R itself in evaluation: there the model is exactly equivariant again."""
    x = nbody_inputs(dtype=F64)
    canon = _nbody(frame_augmentation=True, freeze=True).double()
    model = CanonicalizedModel(canon, NBodyMLP().double())
    model.eval()
    with torch.no_grad():
        plain = canon.group_element(*x)
    # Lightning restores the modes of submodules after validation by setting their flags, not through train():
    # what decides is the model's mode, also for a frozen canonicalizer, whose own flag stays False
    model.eval()
    frozen = set(map(id, canon.modules()))
    for module in model.modules():
        module.training = id(module) not in frozen  # the frozen canonicalizer's modules stay as they were
    assert not canon.training and canon.model_training
    turns = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        with torch.no_grad():
            turned = canon.group_element(*x)
        assert torch.equal(turned.translation, plain.translation)
        turns.append(plain.rotation.transpose(1, 2) @ turned.rotation)  # S = Rᵀ (R S)
    for s in turns:
        assert _orthogonality_error(s) < orthonormality_tol(F64)
        assert (torch.linalg.matrix_norm(s - torch.eye(3, dtype=F64)) > 0.1).all()  # Haar: never near I here
    assert not torch.allclose(turns[0], turns[1])
    model.eval()
    with torch.no_grad():
        assert torch.equal(canon.group_element(*x).rotation, plain.rotation)
    # a pickled (DDP spawn) or copied model's canonicalizer reads the copy's mode, not the original's
    clone = pickle.loads(pickle.dumps(model)).train()
    assert clone.canonicalizer.model_training and not canon.model_training
    with pytest.raises(ValueError, match="frame_augmentation.*canonical"):
        _nbody(frame_augmentation=True, symmetrization="sampled")


def test_nbody_frozen_dropout_drops_vectors_while_the_model_trains_and_stays_equivariant_per_mask():
    """frozen_dropout (the authors' code's frozen canonicalizer under Lightning 1.x): the frozen function's vector
    dropout acts while the model trains, its own flag staying False; in evaluation the frame is the plain frozen
    one's. For one dropout mask (the same RNG draw) h is still equivariant: the mask is per particle and vector."""
    x = nbody_inputs(dtype=F64)
    canon = _nbody(freeze=True, frozen_dropout=True).double()
    plain = _nbody(freeze=True).double()  # the same initial weights (seed)
    model = CanonicalizedModel(canon, NBodyMLP().double())
    model.eval()
    with torch.no_grad():
        assert torch.equal(canon.group_element(*x).rotation, plain.group_element(*x).rotation)
    model.train()
    assert not canon.training and canon.model_training
    assert not any(p.requires_grad for p in canon.parameters())
    g = random_euclidean(6, seeded_gen(2), group="O3", dtype=F64)
    frames = []
    for seed in (0, 1):
        with torch.no_grad():
            torch.manual_seed(seed)
            factor = frame_factor(frame_condition(canon.frame_vectors(*x)[0][:, :3]))  # this mask's frame
            torch.manual_seed(seed)
            h = canon.group_element(*x)
            torch.manual_seed(seed)  # the same mask on the moved system
            h_moved = canon.group_element(*act(g, *x))
        frames.append(h.rotation)
        assert_close(h_moved.rotation, g.rotation @ h.rotation, factor)  # h(g·x) = g·h(x) for the mask
    assert not torch.allclose(frames[0], frames[1])  # dropout acted: two masks, two frames
    with torch.no_grad():  # and differs from the frame without dropout
        assert not torch.allclose(frames[0], plain.group_element(*x).rotation)
    with pytest.raises(ValueError, match="frozen_dropout=true .* needs canonicalization.freeze=true"):
        _nbody(frozen_dropout=True)


def test_a_product_canonicalizers_factors_read_the_models_mode():
    """A frozen E(3) factor with frame_augmentation inside an E(3)×S_n product turns its frame while the model
    trains, as it does alone: every canonicalizer inside h is bound to the model, not only the outer one."""
    from canonical_network.canonicalization.permutation import PermutationCanonicalizer
    from canonical_network.canonicalization.product import ProductCanonicalizer

    x = nbody_inputs(dtype=F64)
    first = _nbody(frame_augmentation=True, freeze=True).double()
    model = CanonicalizedModel(ProductCanonicalizer(first, PermutationCanonicalizer().double()), NBodyMLP().double())
    model.train()
    assert not first.training and first.model_training
    with torch.no_grad():
        torch.manual_seed(0)
        once = first.group_element(*x).rotation
        torch.manual_seed(1)
        assert not torch.equal(once, first.group_element(*x).rotation)
    model.eval()
    assert not first.model_training
    clone = pickle.loads(pickle.dumps(model)).train()
    assert clone.canonicalizer.first.model_training and not first.model_training


def test_nbody_authors_code_ablation_fails_the_rotation_check_and_keeps_translations():
    # the same inputs and check as the equivariance test above: the authors' biases on VN features and
    # Gram-Schmidt over coordinate rows must make h(Q x) differ from Q h(x) by O(0.1..1), not by rounding
    canon = _nbody(authors_code=True).double().eval()
    default = _nbody().double().eval()
    x = nbody_inputs(dtype=F64)
    g = random_euclidean(6, seeded_gen(2), group="O3", dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(*x)[0][:, :3]))
        (canonical, h), (canonical_moved, h_moved) = canon.canonicalize(*x), canon.canonicalize(*act(g, *x))
        _, h_default = default.canonicalize(*x)
    assert _orthogonality_error(h.rotation) < orthonormality_tol(F64)  # still a valid frame
    expected = g.rotation @ h.rotation
    assert max_err(h_moved.rotation, expected) > max(
        FAIL, 1e6 * rel_tol(h_moved.rotation, expected, factor=factor)
    )
    assert max_err(canonical_moved[0], canonical[0]) > FAIL
    # the flag changes the function, not only its name
    assert not torch.allclose(h.rotation, h_default.rotation)
    # translations: the inputs are centred, so a pure translation still moves t and leaves the canonical inputs
    shift = EuclideanTransform(
        torch.eye(3, dtype=F64).expand(6, 3, 3), random_translations(6, seeded_gen(3), dtype=F64)
    )
    with torch.no_grad():
        shifted, h_shifted = canon.canonicalize(*act(shift, *x))
    assert_close(h_shifted.rotation, h.rotation, factor)
    for a, b in zip(canonical, shifted, strict=True):
        assert_close(a, b, factor)


def test_nbody_authors_code_drops_single_coordinates_in_training():
    layer = _nbody(authors_code=True, dropout=0.5).layers[1].train()
    x = torch.randn(4, 32, 3, 5, generator=seeded_gen(4))
    torch.manual_seed(0)
    dropped = layer.dropout(x) == 0  # (B, C, 3, N): element-wise, so some vectors lose only some coordinates
    partly = dropped.any(dim=2) & ~dropped.all(dim=2)
    assert partly.any()


def test_nbody_frozen_canonicalizer_does_not_train():
    model = CanonicalizedModel(_nbody(freeze=True), NBodyMLP()).train()
    before = {k: v.clone() for k, v in model.canonicalizer.state_dict().items()}
    predictor_before = [p.clone() for p in model.predictor.parameters()]
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = nbody_inputs(seed=12)
    model(*x).square().mean().backward()
    optimiser.step()
    assert all(p.grad is None and not p.requires_grad for p in model.canonicalizer.parameters())
    assert all(torch.equal(v, model.canonicalizer.state_dict()[k]) for k, v in before.items())
    assert any(
        not torch.equal(a, b) for a, b in zip(predictor_before, model.predictor.parameters(), strict=True)
    )
    assert not model.canonicalizer.training  # dropout off: "frozen at initialisation" is one function


def test_nbody_degenerate_system_is_finite():
    # all particles at one point, at rest: no direction to canonicalize on
    loc = torch.tensor([0.3, -1.2, 2.0]).expand(2, 5, 3).clone()
    vel = torch.zeros(2, 5, 3)
    charges = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0]).view(1, 5, 1).expand(2, 5, 1)
    model = CanonicalizedModel(_nbody(), NBodyMLP()).train()
    (canonical, h) = model.canonicalize(loc, vel, charges)
    assert _orthogonality_error(h.rotation) < orthonormality_tol(torch.float32)
    assert all(torch.isfinite(t).all() for t in canonical)
    out = model(loc, vel, charges)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"translation": "mean"}, "canonicalization.translation"),
        ({"hidden_dim": 0}, "canonicalization.hidden_dim"),
        ({"num_layers": 0}, "canonicalization.num_layers"),
        ({"dropout": 1.0}, "canonicalization.dropout"),
        ({"negative_slope": True}, "canonicalization.negative_slope"),
        ({"authors_code": "yes"}, "canonicalization.authors_code"),
        ({"features": "pq"}, "canonicalization.features"),
    ],
)
def test_nbody_rejects_bad_arguments(kwargs, key):
    with pytest.raises(ValueError, match=key):
        VNDeepSetsCanonicalizer(**kwargs)


def test_nbody_rejects_bad_shapes():
    loc, vel, charges = nbody_inputs()
    with pytest.raises(ValueError, match="charges"):
        _nbody().canonicalize(loc, vel, charges[..., :0])
    with pytest.raises(ValueError, match="loc and vel"):
        _nbody().canonicalize(loc, vel[:, :3], charges)


# ============================================================================================ point clouds
def _box_surface(n: int, half: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``n`` points uniform on the faces of a centred box with half-extents ``half`` ``(3,)``."""
    u = (2 * torch.rand(n, 3, generator=gen, dtype=half.dtype) - 1) * half
    axis = torch.randint(0, 3, (n,), generator=gen)
    side = (2 * torch.randint(0, 2, (n,), generator=gen) - 1).to(half.dtype)
    on_face = torch.nn.functional.one_hot(axis, 3).bool()
    return torch.where(on_face, side.unsqueeze(-1) * half, u)


def object_surface(batch: int = 4, points: int = 96, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """A chair-like object: an anisotropic slab plus a block on one corner, surfaces sampled uniformly per
    box, then rotated at random. Unlike a single box or ellipsoid it has no symmetry: an exactly symmetric input
    forces equivariant vectors into the fixed space of its symmetries (zero for a box under SO(3)), so the
    frame would be decided by sampling noise (the paper's relaxed equivariance, Appendix A)."""
    gen = seeded_gen(seed)
    seat = torch.tensor([1.0, 0.5, 0.2], dtype=dtype)
    back = torch.tensor([0.25, 0.25, 0.4], dtype=dtype)
    n_back = points // 3
    clouds = []
    for _ in range(batch):
        main = _box_surface(points - n_back, seat, gen)
        block = _box_surface(n_back, back, gen) + torch.tensor([0.75, 0.25, 0.6], dtype=dtype)
        clouds.append(torch.cat([main, block]))
    cloud = torch.stack(clouds)
    cloud = cloud - cloud.mean(dim=1, keepdim=True)  # the data pipeline centres clouds
    return apply_rotation(cloud, random_rotations(batch, gen, dtype=dtype))


class PointMLP(nn.Module):
    """A PointNet-like predictor on raw coordinates (not rotation invariant): logits (B, classes)."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.point = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, classes)

    def forward(self, points):
        return self.head(self.point(points).amax(dim=1))


class PartMLP(nn.Module):
    """Per-point part logits (B, P, parts) from coordinates and the object category (B,)."""

    def __init__(self, categories: int = 3, parts: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(categories, 16)
        self.net = nn.Sequential(nn.Linear(3 + 16, 32), nn.ReLU(), nn.Linear(32, parts))

    def forward(self, points, category):
        cat = self.embed(category).unsqueeze(1).expand(-1, points.shape[1], -1)
        return self.net(torch.cat([points, cat], dim=-1))


#: the two input stages: kNN edges (the paper's, the default) and pointwise (second-moment context, ours);
#: k = 8 neighbours keeps the edge tests small (the paper rows use 20 and 40)
INPUTS = ("edges", "pointwise")
K = 8


def valid(layers: str, inputs: str, group: str = "SO3", pooling: str = "mean") -> bool:
    """The combinations the canonicalizer accepts: CN(L) needs the edge input, and with mean pooling SO(3)
    (a mean-pooled linear frame spans a plane only; see the module docstring)."""
    if layers == "linear" and inputs == "pointwise":
        return False
    return not (layers == "linear" and group == "O3" and pooling == "mean")


def combinations(groups=("SO3", "O3"), poolings=("mean", "max")) -> list[tuple[str, str, str, str]]:
    """Every accepted ``(layers, pooling, group, inputs)``."""
    every = itertools.product(("linear", "nonlinear"), poolings, groups, INPUTS)
    return [
        (layers, pooling, group, inputs)
        for layers, pooling, group, inputs in every
        if valid(layers, inputs, group, pooling)
    ]


def _pointcloud(layers="nonlinear", seed: int = 20, inputs="edges", **kwargs) -> VNPointCloudCanonicalizer:
    torch.manual_seed(seed)
    kwargs.setdefault("hidden_dim", 8)
    return VNPointCloudCanonicalizer(layers=layers, input=inputs, k=K, **kwargs)


def _sample(group: str, batch: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    sampler = random_rotations if group == "SO3" else random_orthogonal
    return sampler(batch, seeded_gen(seed), dtype=dtype)


@pytest.mark.parametrize(("layers", "pooling", "group", "inputs"), combinations())
def test_pointcloud_canonicalizer_is_equivariant(layers, pooling, group, inputs):
    canon = _pointcloud(layers, pooling=pooling, group=group, inputs=inputs).double().eval()
    points = object_surface(seed=21, dtype=F64)
    assert_knn_stable(points, K)  # the same neighbours after the rotation
    q = _sample(group, 4, 22, F64)
    shift = random_translations(4, seeded_gen(23), dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(points), group))
        r = canon.group_element(points)
        assert _orthogonality_error(r) < orthonormality_tol(F64)
        if group == "SO3":
            assert (torch.linalg.det(r) - 1).abs().max() < 3 * orthonormality_tol(F64)
        # h(x Qᵀ + s) = Q h(x): rotation-equivariant and translation-invariant
        assert_close(canon.group_element(apply_rotation(points, q) + shift.unsqueeze(1)), q @ r, factor)
        # canonical clouds are invariant to rotations (the tasks rotate about the origin)
        (canonical,), _ = canon.canonicalize(points)
        (canonical_moved,), _ = canon.canonicalize(apply_rotation(points, q))
    assert_close(canonical, canonical_moved, factor)


@pytest.mark.parametrize("inputs", list(INPUTS))
def test_pointcloud_canonicalized_classifier_is_invariant_and_the_predictor_alone_is_not(inputs):
    torch.manual_seed(24)
    predictor = PointMLP()
    model = CanonicalizedModel(_pointcloud(inputs=inputs), predictor).double().eval()
    points = object_surface(seed=25, dtype=F64)
    assert_knn_stable(points, K)
    q = random_rotations(4, seeded_gen(26), dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(model.canonicalizer.frame_vectors(points), "SO3"))
        assert_close(model(apply_rotation(points, q)), model(points), factor)
        alone, alone_before = predictor(apply_rotation(points, q)), predictor(points)
    assert max_err(alone, alone_before) > max(FAIL, 1e6 * rel_tol(alone, alone_before, factor=factor))


def test_pointcloud_part_segmentation_passes_the_category_through():
    torch.manual_seed(27)
    predictor = PartMLP()
    canon = _pointcloud("linear")
    model = CanonicalizedModel(canon, predictor).double().eval()
    points, category = object_surface(seed=28, dtype=F64), torch.tensor([0, 2, 1, 2])
    assert_knn_stable(points, K)
    (canonical_points, canonical_category), r = model.canonicalize(points, category)
    assert torch.equal(canonical_category, category) and r.matrix().shape == (4, 3, 3)
    assert torch.equal(r.translation, torch.zeros(4, 3, dtype=F64))  # a rotation about the origin
    logits = torch.randn(4, 96, 4)
    assert canon.invert(logits, r) is logits  # invariant outputs: h' = identity
    q = random_rotations(4, seeded_gen(29), dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(points), "SO3"))
        out = model(points, category)
        assert out.shape == (4, 96, 4)
        assert_close(model(apply_rotation(points, q), category), out, factor)
        alone, alone_before = predictor(apply_rotation(points, q), category), predictor(points, category)
    assert max_err(alone, alone_before) > max(FAIL, 1e6 * rel_tol(alone, alone_before, factor=factor))


@pytest.mark.parametrize(("layers", "pooling", "group", "inputs"), combinations(groups=("SO3",)))
def test_pointcloud_canonicalizer_is_permutation_invariant(layers, pooling, group, inputs):
    canon = _pointcloud(layers, pooling=pooling, group=group, inputs=inputs).double().eval()
    points = object_surface(seed=30, dtype=F64)
    assert_knn_stable(points, K)  # the same neighbours whatever order the distances are computed in
    perm = torch.randperm(96, generator=seeded_gen(31))
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(points), group))
        assert_close(canon.group_element(points[:, perm]), canon.group_element(points), factor)


@pytest.mark.parametrize("inputs", list(INPUTS))
def test_pointcloud_equivariance_in_float64(inputs):
    torch.manual_seed(32)
    model = CanonicalizedModel(_pointcloud(inputs=inputs), PointMLP()).double().eval()
    points = object_surface(seed=33, dtype=torch.float64)
    assert_knn_stable(points, K)
    q = random_rotations(4, seeded_gen(34), dtype=torch.float64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(model.canonicalizer.frame_vectors(points), "SO3"))
        r = model.canonicalizer.group_element(points)
        assert_close(model.canonicalizer.group_element(apply_rotation(points, q)), q @ r, factor)
        assert_close(model(apply_rotation(points, q)), model(points), factor)


@pytest.mark.parametrize("inputs", list(INPUTS))
def test_pointcloud_equivariance_with_batch_statistics(inputs):
    # training mode: VN batch norm uses batch statistics of (invariant) norms
    canon = _pointcloud(inputs=inputs).double().train()
    points = object_surface(seed=35, dtype=F64)
    assert_knn_stable(points, K)
    q = random_rotations(4, seeded_gen(36), dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(points), "SO3"))
        assert_close(canon.group_element(apply_rotation(points, q)), q @ canon.group_element(points), factor)


def test_pointcloud_frozen_canonicalizer_does_not_train():
    model = CanonicalizedModel(_pointcloud(freeze=True), PointMLP()).train()
    before = {k: v.clone() for k, v in model.canonicalizer.state_dict().items()}  # incl. BN running stats
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss = nn.functional.cross_entropy(model(object_surface(seed=37)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    optimiser.step()
    assert all(p.grad is None and not p.requires_grad for p in model.canonicalizer.parameters())
    assert all(torch.equal(v, model.canonicalizer.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize(("layers", "pooling", "group", "inputs"), combinations(poolings=("mean",)))
@pytest.mark.parametrize("cloud", ["planar", "duplicates", "one_point"])
def test_pointcloud_degenerate_clouds_are_finite(cloud, layers, pooling, group, inputs):
    points = object_surface(batch=2, points=32, seed=38)
    if cloud == "planar":
        points = points * torch.tensor([1.0, 1.0, 0.0])
    elif cloud == "duplicates":
        points = torch.cat([points[:, :8]] * 4, dim=1)
    else:
        points = torch.tensor([0.2, -0.4, 0.9]).expand(2, 32, 3).clone()
    points.requires_grad_(True)
    model = CanonicalizedModel(
        _pointcloud(layers, pooling=pooling, group=group, inputs=inputs), PointMLP()
    ).train()
    (canonical,), g = model.canonicalize(points)
    r = g.rotation
    assert torch.isfinite(canonical).all() and _orthogonality_error(r) < orthonormality_tol(torch.float32)
    if group == "SO3":
        assert (torch.linalg.det(r) - 1).abs().max() < 3 * orthonormality_tol(torch.float32)
    out = model(points)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(points.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"layers": "deep"}, "canonicalization.layers"),
        ({"input": "knn"}, "canonicalization.input"),
        ({"pooling": "sum"}, "canonicalization.pooling"),
        ({"group": "SE3"}, "canonicalization.group"),
        ({"k": 0}, "canonicalization.k"),
        ({"k": None}, "canonicalization.k"),  # k: null used to mean pointwise; now input=pointwise says so
        ({"hidden_dim": 2.5}, "canonicalization.hidden_dim"),
        ({"negative_slope": 1.0}, "canonicalization.negative_slope"),
    ],
)
def test_pointcloud_rejects_bad_arguments(kwargs, key):
    with pytest.raises(ValueError, match=key) as error:
        VNPointCloudCanonicalizer(**kwargs)
    if "input" in kwargs:
        assert "edges" in str(error.value) and "pointwise" in str(error.value)  # the valid choices


@pytest.mark.parametrize(
    "kwargs",
    [
        {"layers": "linear", "input": "pointwise"},  # every pointwise channel mean-pools to zero
        {"layers": "linear", "input": "edges", "group": "O3", "pooling": "mean"},  # a plane, no cross product
    ],
)
def test_pointcloud_rejects_collapsing_combinations(kwargs):
    with pytest.raises(ValueError, match="canonicalization.layers=linear") as error:
        VNPointCloudCanonicalizer(**kwargs)
    assert "canonicalization.input" in str(error.value) or "canonicalization.group" in str(error.value)


def test_pointcloud_pointwise_input_builds_no_knn_graph(monkeypatch):
    # The pointwise input is the cheap one (O(P)), and ignores k; the paper's edge input is the default.
    import canonical_network.canonicalization.pointcloud as pointcloud

    assert VNPointCloudCanonicalizer().input == "edges" and VNPointCloudCanonicalizer().k == 20

    def no_graph(*args, **kwargs):
        raise AssertionError("the pointwise canonicalizer must not build a kNN graph")

    monkeypatch.setattr(pointcloud, "graph_feature", no_graph)
    canon = VNPointCloudCanonicalizer(input="pointwise", k=None).double().eval()
    assert canon.k is None and canon.neighbour_pool is None
    points = object_surface(seed=40, dtype=F64)
    q = random_rotations(4, seeded_gen(41), dtype=F64)
    with torch.no_grad():
        factor = frame_factor(frame_condition(canon.frame_vectors(points), "SO3"))
        r = canon.group_element(points)
        assert_close(canon.group_element(apply_rotation(points, q)), q @ r, factor)


def test_nbody_position_features_ignore_velocities_and_charges():
    """features="p" (the authors' canonicalizer input): the frame depends on the centred positions alone."""
    canon = _nbody(features="p").double().eval()
    loc, vel, charges = nbody_inputs(dtype=F64)
    with torch.no_grad():
        h = canon.group_element(loc, vel, charges)
        h_other = canon.group_element(loc, torch.randn(vel.shape, generator=seeded_gen(9), dtype=F64), -charges)
        h_pvq = _nbody(features="pvq").double().eval().group_element(loc, vel, charges)
        h_pvq_other = _nbody(features="pvq").double().eval().group_element(loc, vel, -charges)
    assert torch.equal(h.rotation, h_other.rotation) and torch.equal(h.translation, h_other.translation)
    assert max_err(h_pvq.rotation, h_pvq_other.rotation) > FAIL  # the default reads the charges
