"""The point-cloud prediction networks of §5.3: PointNet, DGCNN, VN-PointNet, VN-DGCNN.

Shapes at the reference widths; rotation invariance of the VN baselines by construction (and plain
PointNet failing the same check); permutation invariance/equivariance of all four; the paper's
CN(NL)-PointNet and CN(NL)-DGCNN invariant under SO(3)/O(3); PointNet's feature-transform regulariser;
one optimiser step; argument checks. Small clouds and reduced widths keep this fast.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from canonical_network.canonicalization.base import CanonicalizedModel
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.groups.euclidean import apply_rotation, random_orthogonal, random_rotations
from canonical_network.nn.knn import graph_feature, knn
from canonical_network.prediction.dgcnn import DGCNN, _edge_layer, edge_conv
from canonical_network.prediction.pointnet import PointNet, feature_transform_regularizer
from canonical_network.prediction.vn_dgcnn import VNDGCNN, VNEdgeConv
from canonical_network.prediction.vn_pointnet import VNPointNet
from tests.helpers import DEEP64, EPS32, EPS64, assert_knn_stable, max_err, rel_tol, seeded_gen

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

# Exactness claims (invariance by construction, permutations) are checked in float64 against
# rel_tol(outputs, factor=DEEP64) ≈ 2.3e-10 of the outputs' scale (tests/helpers.py: ≤ 2¹³ accumulated terms
# × ≤ 2⁷ amplification by frames and batch norms; observed float64 errors are ≤ ~1e-12 of it).
#: Not a rounding tolerance: how far a model that is *not* invariant must miss (plain PointNet and DGCNN
#: are off by ~1.5 at these widths), ~9 orders of magnitude above the float64 tolerance.
FAIL = 0.1
B, P, K = 4, 96, 10
HEADS = ("classification", "segmentation")

#: small versions of every backbone: a quarter of the reference widths, k = 10
SMALL: dict[str, tuple[type[nn.Module], dict]] = {
    "pointnet": (PointNet, {"width": 0.25, "emb_dims": 64}),
    "dgcnn": (DGCNN, {"k": K, "width": 0.25, "emb_dims": 64}),
    "vn_pointnet": (VNPointNet, {"k": K, "width": 0.25, "emb_dims": 96}),
    "vn_dgcnn": (VNDGCNN, {"k": K, "width": 0.25, "emb_dims": 96}),
}


# ------------------------------------------------------------------------------------------------- clouds
#: (centre, half extents) of the boxes of a chair: seat, back, four legs of different lengths and one
#: armrest, so that no rotation or reflection maps the object onto itself (a symmetric object would make
#: any equivariant frame depend on sampling noise).
CHAIR_BOXES = torch.tensor(
    [
        [[0.00, 0.00, 0.00], [0.50, 0.45, 0.05]],
        [[0.00, -0.42, 0.50], [0.50, 0.04, 0.45]],
        [[0.45, 0.40, -0.40], [0.04, 0.04, 0.35]],
        [[-0.45, 0.40, -0.35], [0.04, 0.04, 0.30]],
        [[0.45, -0.40, -0.40], [0.04, 0.04, 0.35]],
        [[-0.45, -0.40, -0.45], [0.04, 0.04, 0.40]],
        [[0.50, 0.00, 0.30], [0.04, 0.40, 0.04]],
    ]
)


def chair_clouds(batch: int = B, points: int = P, seed: int = 0, proportions: float = 0.3) -> torch.Tensor:
    """``(batch, points, 3)`` points uniform on the surfaces of chairs, centred and scaled into the unit
    ball (as ModelNet40 clouds are), each in a random orientation.

    Each chair is stretched along its own axes by factors uniform in ``1 ± proportions``, so a batch holds
    different shapes, as real batches do. (Batch statistics of identical shapes would have near-zero
    variance for invariant features, and batch norm would then blow rounding errors up by ~300.) Random
    surface samples are generic: no exactly tied kNN distances.
    """
    gen = seeded_gen(seed)
    stretch = 1 + proportions * (2 * torch.rand(batch, 1, 3, generator=gen) - 1)
    centre, half = CHAIR_BOXES[:, 0], CHAIR_BOXES[:, 1]
    area = (half[:, 0] * half[:, 1] + half[:, 1] * half[:, 2] + half[:, 0] * half[:, 2]).repeat(batch, 1)
    box = torch.multinomial(area, points, replacement=True, generator=gen)  # (batch, points)
    centre, half = centre[box], half[box]
    inside = (2 * torch.rand(batch, points, 3, generator=gen) - 1) * half
    # pick a face with probability proportional to its area: axis a has area h_b h_c
    face_area = torch.stack(
        [half[..., 1] * half[..., 2], half[..., 0] * half[..., 2], half[..., 0] * half[..., 1]], -1
    )
    axis = torch.multinomial(face_area.view(-1, 3), 1, generator=gen).view(batch, points)
    side = 2 * torch.randint(0, 2, (batch, points, 1), generator=gen).float() - 1
    on_face = nn.functional.one_hot(axis, 3).bool()
    cloud = (centre + torch.where(on_face, side * half, inside)) * stretch
    cloud = cloud - cloud.mean(dim=1, keepdim=True)
    cloud = cloud / cloud.norm(dim=-1).amax(dim=1).view(-1, 1, 1)
    return apply_rotation(cloud, random_rotations(batch, gen))


def _category(seed: int) -> torch.Tensor:
    return torch.randint(0, 16, (B,), generator=seeded_gen(seed))


def _build(name: str, head: str, seed: int = 0, **overrides) -> nn.Module:
    cls, kwargs = SMALL[name]
    torch.manual_seed(seed)
    return cls(head=head, **{**kwargs, **overrides})


def _call(model: nn.Module, points: torch.Tensor, category: torch.Tensor | None) -> torch.Tensor:
    return model(points) if category is None else model(points, category)


def _settle(model: nn.Module, head: str, seed: int) -> nn.Module:
    """Give every batch norm the statistics of one training-mode pass over 8 other chairs, then eval mode.

    Why: with the initial running statistics (mean 0, variance 1) an untrained network barely reacts to
    its input (logits change by ~1e-4 when a cloud is stretched by half), which would make any invariance
    check pass; normalised with real statistics, the outputs depend on the shape at order 1e-1.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one pass, exactly that batch's statistics
    model.train()
    category = torch.randint(0, 16, (8,), generator=seeded_gen(seed)) if head == "segmentation" else None
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        _call(model, chair_clouds(batch=8, seed=seed).to(dtype), category)
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


def _setup(name: str, head: str, seed: int, dtype=torch.float32):
    """A settled model, clouds and categories; float64 builds the same float32 weights and clouds, cast."""
    points = chair_clouds(seed=100 + seed).to(dtype)
    category = _category(200 + seed) if head == "segmentation" else None
    return _settle(_build(name, head, seed).to(dtype), head, 700 + seed), points, category


# --------------------------------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("name", list(SMALL))
def test_output_shapes(name, head):
    model = _build(name, head).eval()
    points, category = chair_clouds(batch=3, points=64), torch.tensor([0, 7, 15])
    out = model(points) if head == "classification" else model(points, category)
    expected = (3, 40) if head == "classification" else (3, 64, 50)
    assert out.shape == expected and out.dtype == torch.float32 and torch.isfinite(out).all()


#: input width of the first layer of each head at the reference widths: the numbers of Deng et al.'s code
REFERENCE_HEAD_INPUT = {
    (PointNet, "classification"): 1024,
    (PointNet, "segmentation"): 4944,  # 2048 + 16 + 64 + 128 + 128 + 512 + 2048
    (DGCNN, "classification"): 2048,  # max and mean of 1024
    (DGCNN, "segmentation"): 1280,  # 1024 + 64 + 3 × 64
    (VNPointNet, "classification"): 2046,  # 3 × 682
    (VNPointNet, "segmentation"): 9025,  # 2046 + 16 + 3 × 275 + 3 × 1364
    (VNDGCNN, "classification"): 4092,  # 2 × 3 × 682
    (VNDGCNN, "segmentation"): 2299,  # 2046 + 64 + 3 × 63
}


@pytest.mark.parametrize("cls, head", list(REFERENCE_HEAD_INPUT))
def test_reference_widths(cls, head):
    torch.manual_seed(0)
    model = cls(head=head).eval()
    first = model.head.net[0]
    first = first[0] if isinstance(first, nn.Sequential) else first
    in_width = first.in_features if isinstance(first, nn.Linear) else first.in_channels
    assert in_width == REFERENCE_HEAD_INPUT[(cls, head)]
    if hasattr(model, "k"):
        assert model.k == (20 if head == "classification" else 40)
    points = chair_clouds(batch=2, points=48)  # at least k = 40 points
    with torch.no_grad():
        out = model(points) if head == "classification" else model(points, torch.tensor([1, 2]))
    assert out.shape == ((2, 40) if head == "classification" else (2, 48, 50))


# ---------------------------------------------------------------------------------------------- rotations
#: VN-PointNet uses cross products (SO(3) only); VN-DGCNN has none (O(3))
VN_GROUPS = {"vn_pointnet": ("SO3",), "vn_dgcnn": ("SO3", "O3")}


def _group_samples(group: str, seed: int, dtype=torch.float32) -> torch.Tensor:
    sampler = random_rotations if group == "SO3" else random_orthogonal
    return sampler(B, seeded_gen(seed), dtype=dtype)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("name", list(VN_GROUPS))
def test_vn_models_are_rotation_invariant_by_construction(name, head):
    """float64, so that only the construction is tested: the outputs of rotated clouds agree to the float64
    tolerance (DEEP64), and they do depend on the shape (a stretched cloud changes them by > FAIL)."""
    for seed in range(2):
        model, points, category = _setup(name, head, seed, torch.float64)
        assert_knn_stable(points, K)  # rotating cannot swap a neighbour of the input graph
        with torch.no_grad():
            out = _call(model, points, category)
            for group in VN_GROUPS[name]:
                moved = _call(
                    model, apply_rotation(points, _group_samples(group, 300 + seed, torch.float64)), category
                )
                tol = rel_tol(out, moved, factor=DEEP64)
                assert max_err(moved, out) < tol, (group, max_err(moved, out), tol)
            stretched = points * torch.tensor([1.0, 1.0, 1.5], dtype=torch.float64)
            assert max_err(_call(model, stretched, category), out) > FAIL


#: How many times the effect of a one-ulp random perturbation of the input a float32 rotation may have: the
#: rotated input carries up to 3 roundings per coordinate (3-term products, ≤ ~2.6 eps·|x| per point against
#: the perturbation's ~eps·|x|), so to first order ≤ ~2.6 times its effect; both passes then round
#: differently inside the network, which the perturbed pass includes too. Observed ratios are ≤ 0.75.
ROTATION_VS_ONE_ULP = 4


@pytest.mark.parametrize("head", HEADS)
def test_vn_pointnet_is_rotation_invariant_in_float32(head):
    """float32, eval mode: VN-PointNet is as invariant as float32 allows but no more: its VN batch norms map
    nearly-zero vectors (which VN-ReLU produces) to vectors of order one whose direction is rounding noise,
    so perturbing the *unrotated* input by its own float32 rounding already moves its logits by ~1e-3 with
    these statistics. The rotation may not move them more than the rounding of a rotation can
    (ROTATION_VS_ONE_ULP). Measured against that perturbation, the bound follows this machine's kernels.

    VN-DGCNN is checked in float64 only (above): its dynamic kNN graphs on 96-point clouds have neighbour
    gaps of ~10 float32 ulps, so another machine's rounding may swap a neighbour, an O(1) change no rounding
    tolerance covers. Seeds 0 and 5 give clouds whose input graph (VN-PointNet's) is clear of that."""
    worst, noise_effect = 0.0, 0.0
    for seed in (0, 5):
        model, points, category = _setup("vn_pointnet", head, seed)
        assert_knn_stable(points, K)
        with torch.no_grad():
            out = _call(model, points, category)
            for group in VN_GROUPS["vn_pointnet"]:
                moved = apply_rotation(points, _group_samples(group, 300 + seed))
                worst = max(worst, max_err(_call(model, moved, category), out))
            noise = torch.randn(points.shape, generator=seeded_gen(seed))
            rounding = EPS32 * points.abs() * noise  # relative size of one ulp
            noise_effect = max(noise_effect, max_err(_call(model, points + rounding, category), out))
    assert worst < ROTATION_VS_ONE_ULP * noise_effect, (worst, noise_effect)


@pytest.mark.parametrize("name", list(VN_GROUPS))
def test_vn_models_are_rotation_invariant_in_training_mode(name):
    """Batch statistics are of vector norms (VN) or of invariants (heads), so training mode is invariant too
    when every cloud of the batch is rotated (each by its own rotation); dropout is switched off."""
    model = _build(name, "classification", dropout=0.0).double().train()
    points, q = chair_clouds(seed=7).double(), random_rotations(B, seeded_gen(8), dtype=torch.float64)
    assert_knn_stable(points, K)
    with torch.no_grad():
        moved, out = model(apply_rotation(points, q)), model(points)
    assert max_err(moved, out) < rel_tol(moved, out, factor=DEEP64)  # float64: see DEEP64


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("name", ["pointnet", "dgcnn"])
def test_plain_backbones_fail_the_rotation_check(name, head):
    """The same float64 check as the invariant models', failed by ~9 orders of magnitude."""
    model, points, category = _setup(name, head, 0, torch.float64)
    q = random_rotations(B, seeded_gen(300), dtype=torch.float64)
    with torch.no_grad():
        moved, out = _call(model, apply_rotation(points, q), category), _call(model, points, category)
    assert max_err(moved, out) > max(FAIL, 1e6 * rel_tol(moved, out, factor=DEEP64))


# ------------------------------------------------------------------------------------------- permutations
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("name", list(SMALL))
def test_permutations_of_the_points(name, head):
    """Exact up to the order of sums (pooling, batch statistics, kNN distances): float64, DEEP64."""
    model, points, category = _setup(name, head, 1, torch.float64)
    assert_knn_stable(points, K)  # the same neighbours whatever order the distances are computed in
    perm = torch.randperm(P, generator=seeded_gen(9))
    with torch.no_grad():
        out = _call(model, points, category)
        permuted = _call(model, points[:, perm], category)
    if head == "segmentation":
        out = out[:, perm]  # per-point logits follow their points
    assert max_err(permuted, out) < rel_tol(permuted, out, factor=DEEP64)


# ------------------------------------------------------------------------------------- canonicalized models
@pytest.mark.parametrize("group", ["SO3", "O3"])
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("name", ["pointnet", "dgcnn"])
def test_canonicalized_backbones_are_invariant(name, head, group):
    """Invariant by construction: float64 and DEEP64 (in float32 the canonicalizer's frame, a deep VN network
    with batch norms, is conditioned enough that the error reached 1.4e-4 on an AVX-512 machine)."""
    sampler = random_rotations if group == "SO3" else random_orthogonal
    for seed in range(2):
        torch.manual_seed(seed)
        canonicalizer = VNPointCloudCanonicalizer(layers="nonlinear", k=K, hidden_dim=8, group=group)
        points = chair_clouds(seed=400 + seed).double()
        assert_knn_stable(points, K)
        category = _category(500 + seed) if head == "segmentation" else None
        model = CanonicalizedModel(canonicalizer, _build(name, head, seed)).double()
        model = _settle(model, head, 800 + seed)
        q = sampler(B, seeded_gen(600 + seed), dtype=torch.float64)
        with torch.no_grad():
            out = _call(model, points, category)
            moved = _call(model, apply_rotation(points, q), category)
        tol = rel_tol(out, moved, factor=DEEP64)
        assert max_err(moved, out) < tol, (seed, max_err(moved, out), tol)


# -------------------------------------------------------------------------------------------- regulariser
def test_feature_transform_regularizer():
    # ‖I − Q Qᵀ‖²_F of a sampled orthogonal Q: each of the d² entries is off by ≤ ~(d + d) eps (Q is
    # orthogonal to ~d eps from its QR, and Q Qᵀ sums d products), so the loss is ≤ d² (2 d eps)².
    d = 3
    assert (
        feature_transform_regularizer(random_orthogonal(3, seeded_gen(10))).item()
        < d**2 * (2 * d * EPS32) ** 2
    )
    q, _ = torch.linalg.qr(torch.randn(4, 64, 64, generator=seeded_gen(11), dtype=torch.float64))
    d = 64
    assert feature_transform_regularizer(q).item() < d**2 * (2 * d * EPS64) ** 2
    # ‖I − (2I)(2I)ᵀ‖² = 9 d
    assert feature_transform_regularizer(2 * torch.eye(4).expand(2, 4, 4)).item() == pytest.approx(36.0)
    assert feature_transform_regularizer(1.1 * q).item() > 1.0
    with pytest.raises(ValueError, match="transform"):
        feature_transform_regularizer(torch.eye(3))


def test_the_frobenius_regularizer_is_the_square_root_and_trains_from_an_orthogonal_start():
    # ‖I − (2I)(2I)ᵀ‖_F = 3 √d, the square root of the squared form's 9 d, per cloud
    two = 2 * torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
    assert feature_transform_regularizer(two, "frobenius").item() == pytest.approx(6.0, rel=4 * EPS64)
    a = torch.randn(5, 8, 8, generator=seeded_gen(12), dtype=torch.float64)
    per_cloud = [feature_transform_regularizer(a[i : i + 1]).sqrt() for i in range(5)]
    assert feature_transform_regularizer(a, "frobenius").item() == pytest.approx(
        torch.stack(per_cloud).mean().item(), rel=64 * EPS64)
    # PointNet's feature T-Net starts at the identity: the unsquared norm's gradient there must be 0, not NaN
    eye = torch.eye(6, dtype=torch.float64).repeat(3, 1, 1).requires_grad_(True)
    feature_transform_regularizer(eye, "frobenius").backward()
    assert torch.equal(eye.grad, torch.zeros_like(eye))
    # far from orthogonal the squared form's gradient grows as ‖A‖³, the unsquared one's as ‖A‖
    big = (10 * a).requires_grad_(True)
    feature_transform_regularizer(big, "frobenius").backward()
    grad_fro = big.grad.norm().item()
    big.grad = None
    feature_transform_regularizer(big).backward()
    assert big.grad.norm().item() > 100 * grad_fro
    with pytest.raises(ValueError, match="feature_transform_norm.*squared.*frobenius"):
        feature_transform_regularizer(a, "l1")


@pytest.mark.parametrize("head", HEADS)
def test_pointnet_exposes_its_feature_transform(head):
    model = _build("pointnet", head).eval()
    points = chair_clouds()
    _call(model, points, _category(0) if head == "segmentation" else None)
    d = 16 if head == "classification" else 32  # 64 or 128 at a quarter width
    assert model.last_feature_transform.shape == (B, d, d)
    assert model.last_input_transform.shape == (B, 3, 3)
    # a fresh T-Net is the identity (a zero last layer plus an identity bias), hence orthogonal: exactly
    assert feature_transform_regularizer(model.last_feature_transform).item() == 0.0
    plain = _build("pointnet", head, input_transform=False, feature_transform=False)
    _call(plain, points, _category(0) if head == "segmentation" else None)
    assert plain.last_feature_transform is None and plain.last_input_transform is None


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("name", list(SMALL))
def test_one_optimiser_step(name, head):
    model = _build(name, head).train()
    points = chair_clouds(seed=12)
    category = _category(13) if head == "segmentation" else None
    before = [p.detach().clone() for p in model.parameters()]
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    out = _call(model, points, category)
    if head == "classification":
        loss = nn.functional.cross_entropy(out, torch.randint(0, 40, (B,), generator=seeded_gen(14)))
    else:
        target = torch.randint(0, 50, (B, P), generator=seeded_gen(14))
        loss = nn.functional.cross_entropy(out.reshape(-1, 50), target.reshape(-1))
    if name == "pointnet":
        loss = loss + 1e-3 * feature_transform_regularizer(model.last_feature_transform)
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    assert torch.isfinite(loss)
    params = list(model.parameters())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in params)
    changed = [not torch.equal(p, b) for p, b in zip(params, before, strict=True)]
    # Every parameter with a real gradient moved. (Biases right before a batch norm get a gradient of
    # rounding size only: exactly zero in exact arithmetic, a sum over the B·P = 384 points of terms that
    # cancel, so ≤ ~384 eps of the largest gradient; 2¹⁰ eps bounds it. A fresh T-Net's zero last layer
    # passes no gradient to the layers before it.)
    rounding = rel_tol(*[p.grad for p in params if p.grad is not None], factor=2**10)
    assert all(
        c
        for p, c in zip(params, changed, strict=True)
        if p.grad is not None and p.grad.abs().max() > rounding
    )
    assert changed[-1] and sum(changed) > len(changed) // 3
    fresh = _build(name, head).eval()  # the same seed: the weights before the step
    with torch.no_grad():
        assert max_err(_call(model.eval(), points, category), _call(fresh, points, category)) > 0


# ------------------------------------------------------------------------------------------ EdgeConv's form
def _edge_mlp(c_in: int, widths: tuple[int, ...], seed: int, bias: bool) -> nn.Sequential:
    """Edge layers with random batch-norm affines, half of the scales negative (the max is then taken
    where the convolution's output is smallest), and optionally a bias on the first convolution."""
    torch.manual_seed(seed)
    layers, c = [], 2 * c_in
    for width in widths:
        layers.append(_edge_layer(c, width, 0.2))
        c = width
    gen = seeded_gen(seed + 1)
    for _, norm, _ in layers:
        norm.weight.data = torch.randn(norm.num_features, generator=gen)
        norm.bias.data = torch.randn(norm.num_features, generator=gen)
    if bias:
        first = layers[0][0]
        first.bias = nn.Parameter(torch.randn(first.out_channels, generator=gen))
    return nn.Sequential(*layers).double()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("c_in, widths", [(3, (16,)), (6, (8, 12))])
def test_edge_conv_is_the_plain_form(c_in, widths, bias):
    """``edge_conv`` (factorised first layer, activation after the max) computes what the plain form
    ``edge_mlp(graph_feature(x)).amax(-1)`` computes, in training and evaluation mode: outputs, gradients of
    the input and of every parameter, and the batch norms' running statistics, in float64 against
    rel_tol(·, DEEP64) of each quantity's scale (the two forms differ in rounding only)."""
    gen = seeded_gen(30 + c_in)
    x = chair_clouds(seed=31).transpose(1, 2).double() if c_in == 3 else torch.randn(B, c_in, P, generator=gen).double()
    idx = knn(x, K)
    upstream = torch.randn(B, widths[-1], P, generator=gen).double()
    results = []
    for form in ("plain", "edge_conv"):
        mlp = _edge_mlp(c_in, widths, seed=32, bias=bias).train()
        inputs = x.clone().requires_grad_(True)
        if form == "plain":
            out = mlp(graph_feature(inputs, idx=idx)).amax(dim=-1)
        else:
            out = edge_conv(inputs, idx, mlp)
        (out * upstream).sum().backward()
        stats = [t for _, norm, _ in mlp for t in (norm.running_mean, norm.running_var)]
        with torch.no_grad():
            evaluated = mlp.eval()(graph_feature(x, idx=idx)).amax(-1) if form == "plain" else edge_conv(x, idx, mlp.eval())
        results.append({"outputs": [out.detach()], "input gradient": [inputs.grad],
                        "parameter gradients": [p.grad for p in mlp.parameters()], "running statistics": stats,
                        "evaluation outputs": [evaluated]})
    plain, fast = results
    # a tolerance per group, from the group's scale: the first convolution's bias has a gradient of
    # rounding size (exactly zero in exact arithmetic: a batch norm follows it)
    for group, values in plain.items():
        tol = rel_tol(*values, factor=DEEP64)
        for a, b in zip(values, fast[group], strict=True):
            assert max_err(a, b) <= tol, f"{group}: {max_err(a, b):.3g} > {tol:.3g}"
    # the check has teeth: the activation before the max matters where batch-norm scales are negative
    mlp = _edge_mlp(c_in, widths, seed=32, bias=bias).train()
    wrong = mlp(graph_feature(x, idx=idx)).amin(dim=-1)
    assert max_err(wrong, plain["outputs"][0]) > FAIL


@pytest.mark.parametrize("pooling", ["mean", "max"])
@pytest.mark.parametrize("c_in, widths", [(1, (5,)), (4, (3, 5))])
def test_vn_edge_conv_is_the_plain_form(c_in, widths, pooling):
    """VN EdgeConv's first layer applied before the gather (``edge_linear``) computes what the plain form
    ``pool(edge_mlp(graph_feature(x)))`` computes: outputs, gradients, VN batch-norm statistics, training and
    evaluation mode, float64, rel_tol(·, DEEP64) of each group's scale."""
    gen = seeded_gen(40 + c_in)
    if c_in == 1:
        x = chair_clouds(seed=41).transpose(1, 2).unsqueeze(1).double()
    else:
        x = torch.randn(B, c_in, 3, P, generator=gen).double()
    upstream = torch.randn(B, widths[-1], 3, P, generator=gen).double()
    results = []
    for form in ("plain", "edge_linear"):
        torch.manual_seed(42)
        block = VNEdgeConv(c_in, widths, K, pooling).double().train()
        norms = [m for m in block.modules() if isinstance(m, nn.BatchNorm1d)]
        weights = torch.Generator().manual_seed(43)
        for norm in norms:
            norm.weight.data = torch.randn(norm.num_features, generator=weights).double()
            norm.bias.data = torch.randn(norm.num_features, generator=weights).double()
        inputs = x.clone().requires_grad_(True)

        def run(features, block=block, form=form):
            if form == "plain":
                return block.pool(block.edge_mlp(graph_feature(features, K)))
            return block(features)

        out = run(inputs)
        (out * upstream).sum().backward()
        stats = [t for norm in norms for t in (norm.running_mean, norm.running_var)]
        with torch.no_grad():
            block.eval()
            evaluated = run(x)
        results.append({"outputs": [out.detach()], "input gradient": [inputs.grad],
                        # (VN max pooling's direction map gets no gradient: it only selects)
                        "parameter gradients": [torch.zeros_like(p) if p.grad is None else p.grad
                                                for p in block.parameters()],
                        "running statistics": stats, "evaluation outputs": [evaluated]})
    plain, fast = results
    for group, values in plain.items():
        tol = rel_tol(*values, factor=DEEP64)
        for a, b in zip(values, fast[group], strict=True):
            assert max_err(a, b) <= tol, f"{group}: {max_err(a, b):.3g} > {tol:.3g}"


# ------------------------------------------------------------------------------------------------ checks
@pytest.mark.parametrize(
    "cls, kwargs, key",
    [
        (PointNet, {"head": "regression"}, "prediction.head"),
        (PointNet, {"num_classes": 1}, "prediction.num_classes"),
        (PointNet, {"emb_dims": 0}, "prediction.emb_dims"),
        (PointNet, {"width": 0}, "prediction.width"),
        (PointNet, {"dropout": 1.0}, "prediction.dropout"),
        (DGCNN, {"k": 0}, "prediction.k"),
        (DGCNN, {"num_parts": 1.5}, "prediction.num_parts"),
        (DGCNN, {"negative_slope": -0.1}, "prediction.negative_slope"),
        (VNPointNet, {"pooling": "sum"}, "prediction.pooling"),
        (VNPointNet, {"num_categories": 0}, "prediction.num_categories"),
        (VNDGCNN, {"emb_dims": 2}, "prediction.emb_dims"),
        (VNDGCNN, {"k": True}, "prediction.k"),
    ],
)
def test_rejects_bad_arguments(cls, kwargs, key):
    with pytest.raises(ValueError, match=key):
        cls(**kwargs)


@pytest.mark.parametrize("name", list(SMALL))
def test_rejects_bad_inputs(name):
    model = _build(name, "segmentation").eval()
    points = chair_clouds()
    with pytest.raises(ValueError, match="category"):
        model(points)
    with pytest.raises(ValueError, match="category"):
        model(points, torch.zeros(B + 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(B, P, 3\)"):
        model(points.transpose(1, 2), _category(0))
