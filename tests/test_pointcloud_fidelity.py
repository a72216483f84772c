"""Fidelity of the point-cloud canonicalizer rows to the paper (§5.3, Appendix G.3) and the authors' code.

CN(L), built from the real experiment configs, is "a single linear layer of Vector Neurons followed by
pooling": one bias-free ``VNLinear`` on kNN edge features (k = 20 for ModelNet40, 40 for ShapeNet-part, as
``--n_knn`` in the authors' ``train_modelnet.py`` / ``train_shapenet.py``), mean pooling over neighbours and
points, no non-linearity and no normalisation module; its frame vectors are a linear function of the
(balanced) edge features and match an independent re-computation; and it is SO(3)-equivariant in float64 to
within a rounding-error bound derived below, a check that a plain PointNet fails by many orders of magnitude.
"""

from __future__ import annotations

import functools
import math

import hydra
import pytest
import torch
from torch import nn

from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer, channel_scales
from canonical_network.groups.euclidean import apply_rotation, random_rotations
from canonical_network.nn import vector_neurons as vn
from canonical_network.nn.knn import EXACT, graph_feature, knn
from canonical_network.utils.config import compose_experiment
from tests.helpers import EPS64, frame_condition, max_err, rel_tol, seeded_gen
from tests.test_canonicalizers3d import object_surface

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

#: unit roundoff of float64
U64 = 2.0**-53
#: the paper's neighbourhoods (the authors' --n_knn defaults)
K_PAPER = {"modelnet": 20, "shapenet": 40}
CN_L_ROWS = [f"{family}/cn_l_{backbone}" for family in K_PAPER for backbone in ("pointnet", "dgcnn")]

#: modules that make a network non-linear or normalise it; none may appear in CN(L)
ACTIVATIONS = tuple(
    cls
    for cls in vars(nn.modules.activation).values()
    if isinstance(cls, type)
    and issubclass(cls, nn.Module)
    and cls.__module__ == nn.modules.activation.__name__
)
FORBIDDEN = (
    vn.VNLeakyReLU,
    vn.VNBatchNorm,
    vn.VNLinearLeakyReLU,
    vn.VNMaxPool,  # a selection: piecewise linear at best
    vn.VNDropout,
    vn.VNInvariant,
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.dropout._DropoutNd,
    *ACTIVATIONS,
)
#: the only module types CN(L) may consist of (exact types: a subclass could add anything)
ALLOWED = (VNPointCloudCanonicalizer, vn.VNLinear, nn.Linear, vn.VNMeanPool, nn.Sequential, nn.Identity)


@functools.cache
def _config(experiment: str):
    # Composing is the slow part; callers only read the config.
    return compose_experiment([f"experiment={experiment}"])


def build_model(experiment: str, seed: int = 0) -> nn.Module:
    """The experiment's LightningModule, exactly as ``train`` builds it (``hydra.utils.instantiate``)."""
    torch.manual_seed(seed)
    return hydra.utils.instantiate(_config(experiment).model)


def offending_modules(module: nn.Module) -> list[str]:
    """Names and types of the sub-modules that are forbidden or not on the allowed list."""
    return [
        f"{name or '<root>'}: {type(m).__name__}"
        for name, m in module.named_modules()
        if isinstance(m, FORBIDDEN) or type(m) not in ALLOWED
    ]


# ------------------------------------------------------------------------------------------- structure
@pytest.mark.parametrize("experiment", CN_L_ROWS)
def test_cn_l_is_one_linear_vn_layer_on_edges_then_pooling(experiment):
    canon = build_model(experiment).canonicalizer
    family = experiment.split("/")[0]
    assert (canon.layers, canon.input, canon.k) == ("linear", "edges", K_PAPER[family])
    assert (canon.pooling, canon.group) == ("mean", "SO3")
    assert offending_modules(canon) == []
    assert all(m.bias is None for m in canon.modules() if isinstance(m, nn.Linear))  # linear, not affine
    # One VN layer: a single 3 × 3 channel mix, [x_j − x_i, x_i, x_j × x_i] → the three frame vectors.
    assert [tuple(p.shape) for p in canon.parameters()] == [(3, 3)]
    # The walk is not vacuous: it flags CN(NL) (and the old CN(L), VNLinear → VN BN → VN leaky ReLU).
    assert any("VNLinearLeakyReLU" in m for m in offending_modules(VNPointCloudCanonicalizer("nonlinear")))


@pytest.mark.parametrize("family", list(K_PAPER))
def test_paper_rows_use_the_edge_input_with_the_papers_k(family):
    for row in ("cn_l", "cn_nl", "cn_frozen"):
        for backbone in ("pointnet", "dgcnn"):
            cfg = _config(f"{family}/{row}_{backbone}").canonicalization
            assert (cfg.input, cfg.k) == ("edges", K_PAPER[family]), f"{family}/{row}_{backbone}"
            assert cfg.layers == ("linear" if row == "cn_l" else "nonlinear")


def test_cn_l_frame_is_linear_in_the_edge_features():
    canon = build_model("modelnet/cn_l_pointnet").canonicalizer.double().eval()
    gen = seeded_gen(1)
    a, b = (torch.randn(2, 3, 3, 16, 20, generator=gen, dtype=torch.float64) for _ in range(2))
    alpha, beta = 0.7, -2.3
    f = canon.frame_from_features
    combined, separate = f(alpha * a + beta * b), alpha * f(a) + beta * f(b)
    # Each side sums n = 16 · 20 = 320 edges per channel (≤ n eps of their magnitudes) and mixes 3 channels;
    # α a + β b and α f(a) + β f(b) add two roundings and may cancel: 2¹² eps64 of the scale (≈ 9e-13).
    assert max_err(combined, separate) < rel_tol(separate, factor=2**12)
    assert max_err(f(torch.zeros_like(a)), torch.zeros(2, 3, 3, dtype=torch.float64)) == 0.0


def test_cn_l_frame_matches_an_independent_computation():
    """``v_o = Σ_c W_oc · mean_{i, j ∈ kNN(i)} e_c(i, j) / s_c``, with ``e = [x_j − x_i, x_i, x_j × x_i]`` of the
    centred cloud and ``s_c`` the mean norm of channel ``c`` (the per-sample, positive and rotation-invariant
    scale of ``balance_channels``), recomputed here with plain torch."""
    canon = build_model("modelnet/cn_l_pointnet").canonicalizer.double().eval()
    k = K_PAPER["modelnet"]
    points = object_surface(batch=3, points=64, seed=2, dtype=torch.float64)
    x = points - points.mean(dim=1, keepdim=True)
    distances = (x.unsqueeze(2) - x.unsqueeze(1)).square().sum(-1).sqrt()  # (B, P, P)
    neighbours = distances.argsort(dim=-1, stable=True)[..., :k]  # self first (distance 0), as DGCNN
    x_j = x[torch.arange(3).view(-1, 1, 1), neighbours]  # (B, P, k, 3)
    x_i = x.unsqueeze(2).expand_as(x_j)
    edges = torch.stack([x_j - x_i, x_i, torch.linalg.cross(x_j, x_i, dim=-1)], dim=1)  # (B, 3, P, k, 3)
    # Norms clamped at VN_EPS, as every VN norm (the gradient of √ at a zero vector, here the self-edge
    # offsets x_i − x_i, would be infinite).
    scales = edges.square().sum(-1).clamp_min(vn.VN_EPS**2).sqrt().mean(dim=(2, 3))  # (B, 3)
    assert (scales > 0).all()
    pooled = edges.mean(dim=(2, 3)) / scales.unsqueeze(-1)  # (B, 3 channels, 3)
    expected = torch.einsum("oc,bcd->bod", canon.input_layer.weight, pooled)
    # Both sum the same n = 64 · 20 = 1,280 edge features in other orders (≤ n eps each of their
    # magnitudes, ≤ 2¹¹ eps): 2¹² eps64 of the scale.
    assert max_err(canon.frame_vectors(points), expected) < rel_tol(expected, factor=2**12)


# ------------------------------------------------------------------------------------------ equivariance
def rotation_error_bound(
    canon: VNPointCloudCanonicalizer, points: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    """Per cloud, a first-order bound on ``max |h(x Qᵀ) − Q h(x)|`` from float64 rounding, for CN(L) with
    mean pooling and SO(3) Gram–Schmidt (``u = 2⁻⁵³``; ``R = max_i |x_i|``; ``n = P k`` edges per channel).

    Derivation, step by step (each bound in terms of quantities of the cloud, so the bound is precision ×
    the conditioning of this cloud's frame):

    1. Input. Rotating (3-term dot products) and centring (a mean over ``P`` points) move each point by
       ``≤ a R`` with ``a = (P + 4) u + ‖QᵀQ − I‖`` (the sampled ``Q`` is orthogonal only to rounding).
    2. Edges. Offsets ``x_j − x_i`` and centres move by ``≤ ε R``, cross products ``x_j × x_i`` by
       ``≤ ε R²``, with ``ε = 2a + 4u``; write ``U_c = R, R, R²`` for the three channels.
    3. Mean over the ``n`` edges (worst-case recursive summation, ``γ_n ≈ n u``; ``mean |e_c| ≤ 2 U_c``):
       the pooled ``ē_c`` moves by ``≤ (ε + 2 n u) U_c``; the scale ``s_c`` (a mean of norms, no
       cancellation) by ``≤ ε U_c + (n + 2) u s_c``. With ``|ē_c| ≤ s_c`` and ``U_c / s_c ≥ 1/2``, the
       balanced ``ê_c = ē_c / s_c`` moves by ``≤ δ U_c / s_c``, ``δ = 2ε + 4 (n + 3) u``.
    4. The linear layer ``v_o = Σ_c W_oc ê_c`` (3 terms): ``|Δv_o| ≤ ρ_o = (δ + 6u) Σ_c |W_oc| U_c / s_c``.
    5. Gram–Schmidt: ``e₁ = v₁/|v₁|`` moves by ``≤ 2ρ₁/|v₁| + 2u``; the residual ``r₂ = v₂ − ⟨v₂, e₁⟩ e₁``
       by ``≤ ρ₂ + 2|v₂| Δe₁ + 4u|v₂|``, so ``e₂`` by ``≤ 2 Δr₂ / |r₂| + 2u``; ``e₃ = e₁ × e₂`` by
       ``≤ Δe₁ + Δe₂ + 2u``. The conditioning is in ``Σ|W| U/s / |v|`` (cancellation in the pooled means and
       in the linear mix) and ``|v₂| / |r₂| = 1 / sin ∠(v₁, v₂)``.
    6. Both sides are computed, ``Q h(x)`` with one more 3-term product and ``Q``'s own error:
       ``|h(x Qᵀ) − Q h(x)| ≤ 2 Δe₃ + 3u + ‖QᵀQ − I‖``.
    """
    u = U64
    batch, num_points, _ = points.shape
    n = num_points * min(canon.k, num_points)
    eye = torch.eye(3, dtype=points.dtype)
    orth = (q.transpose(1, 2) @ q - eye).abs().amax().item()
    radius = points.norm(dim=-1).amax(dim=1)  # (B,)
    a = (num_points + 4) * u + orth  # step 1
    eps = 2 * a + 4 * u  # step 2
    centred = (points - points.mean(dim=1, keepdim=True)).transpose(1, 2).unsqueeze(1)
    scales = channel_scales(graph_feature(centred, min(canon.k, num_points), cross=True, compute_mode=EXACT))
    units = torch.stack([radius, radius, radius**2], dim=1)  # (B, 3): U_c
    delta = 2 * eps + 4 * (n + 3) * u  # step 3
    rho = (delta + 6 * u) * (units / scales) @ canon.input_layer.weight.abs().T  # step 4: (B, 3 outputs)
    with torch.no_grad():
        v = canon.frame_vectors(points)  # (B, 3 vectors, 3)
    v1, v2 = v[:, 0], v[:, 1]
    e1 = v1 / v1.norm(dim=-1, keepdim=True)
    r2 = v2 - (v2 * e1).sum(-1, keepdim=True) * e1
    de1 = 2 * rho[:, 0] / v1.norm(dim=-1) + 2 * u  # step 5
    dr2 = rho[:, 1] + 2 * v2.norm(dim=-1) * de1 + 4 * u * v2.norm(dim=-1)
    de2 = 2 * dr2 / r2.norm(dim=-1) + 2 * u
    de3 = de1 + de2 + 2 * u
    return 2 * de3 + 3 * u + orth  # step 6


#: The conditioning this test accepts: a bound of at most 1e9 u ≈ 1e-7 (worst-case summation over
#: n = 96 · 20 edges contributes ~4e3; cancellation in the pooled means, the linear mix and Gram–Schmidt the
#: rest). Far below float32 rounding (~6e-8 relative per operation, ~1e-5 on R) and any real failure.
MAX_CONDITIONING = 1e9


def jacobian_inf_norm(predictor: nn.Module, points: torch.Tensor) -> torch.Tensor:
    """Per cloud, ``max_o Σ_{p,d} |∂f_o / ∂x_{pd}|`` of logits ``(B, C)`` at ``points`` ``(B, P, 3)``: the
    first-order bound on how much a perturbation of max-norm 1 can move any logit (eval mode: clouds are
    independent, so the gradient of a batch sum is the per-cloud gradient)."""
    x = points.clone().requires_grad_(True)
    logits = predictor(x)
    norms = []
    for o in range(logits.shape[1]):
        (grad,) = torch.autograd.grad(logits[:, o].sum(), x, retain_graph=True)
        norms.append(grad.abs().flatten(1).sum(dim=1))
    return torch.stack(norms, dim=1).amax(dim=1)


def test_cn_l_is_so3_equivariant_in_float64_and_pointnet_alone_is_not():
    model = build_model("modelnet/cn_l_pointnet").double().eval()
    canon, predictor = model.canonicalizer, model.network.predictor
    points = object_surface(batch=4, points=96, seed=3, dtype=torch.float64)
    q = random_rotations(4, seeded_gen(4), dtype=torch.float64)
    moved = apply_rotation(points, q)
    # A precondition, not a rounding matter: the same kNN graph (no tie at the k-th neighbour).
    k = canon.k
    assert torch.equal(
        knn(points.transpose(1, 2), k, compute_mode=EXACT).sort(dim=-1).values,
        knn(moved.transpose(1, 2), k, compute_mode=EXACT).sort(dim=-1).values,
    )
    bound = rotation_error_bound(canon, points, q)  # (B,)
    assert (bound / U64).max() < MAX_CONDITIONING, bound
    with torch.no_grad():
        r, r_moved = canon.group_element(points), canon.group_element(moved)
    # Gram–Schmidt's frame is orthonormal to ≤ ~8 eps κ (κ: the frame vectors' conditioning); det ≤ 3× that
    kappa = frame_condition(canon.frame_vectors(points), "SO3")
    assert (torch.linalg.det(r) - 1).abs().max() < 3 * 8 * EPS64 * kappa
    errors = (r_moved - q @ r).abs().flatten(1).amax(dim=1)
    assert (errors <= bound).all(), (errors, bound)

    # Canonical clouds x R: |Δ(x R)| ≤ 3 R |ΔR| + 3u R (a 3-term product per coordinate).
    radius = points.norm(dim=-1).amax(dim=1)
    canonical_bound = 3 * radius * bound + 3 * U64 * radius
    with torch.no_grad():
        (canonical,), _ = canon.canonicalize(points)
        (canonical_moved,), _ = canon.canonicalize(moved)
    assert ((canonical_moved - canonical).abs().flatten(1).amax(dim=1) <= canonical_bound).all()

    # Logits: first order, |Δf| ≤ ‖J_f‖_∞ · |Δ(x R)|_max. The predictor's own rounding (~1e-13 relative:
    # sums of ≤ 1,024 terms) is orders below and left out; the factor 2 covers the second order.
    tolerance = 2 * jacobian_inf_norm(predictor, canonical) * canonical_bound  # (B,)
    with torch.no_grad():
        invariance = (model(moved) - model(points)).abs().amax(dim=1)
        backbone_alone = (predictor(moved) - predictor(points)).abs().amax(dim=1)
    assert (invariance <= tolerance).all(), (invariance, tolerance)
    # The same check fails for the non-equivariant backbone alone, by many orders of magnitude.
    assert (backbone_alone > 1e4 * tolerance).all(), (backbone_alone, tolerance)
    assert math.isfinite(tolerance.max().item())
