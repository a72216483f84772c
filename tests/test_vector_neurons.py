"""Vector Neuron layers are O(3)-equivariant (the invariant layer invariant); kNN and edge features."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from canonical_network.groups.euclidean import random_orthogonal, random_rotations
from canonical_network.nn.knn import EXACT, FAST, gather_neighbours, graph_feature, knn
from canonical_network.nn.vector_neurons import (
    VNBatchNorm,
    VNDropout,
    VNInvariant,
    VNLeakyReLU,
    VNLinear,
    VNLinearLeakyReLU,
    VNMaxPool,
    VNMeanPool,
    vn_mean_pool,
    vn_norms,
)
from tests.conftest import seeded_gen

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

B, C, N, K = 4, 5, 12, 3
ATOL = 1e-5


def rotate(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Act with ``q`` ``(B, 3, 3)`` on the coordinate axis of a VN feature ``(B, C, 3, *S)``."""
    return torch.einsum("bij,bcj...->bci...", q, x)


def equivariance_error(layer, x: torch.Tensor, q: torch.Tensor) -> float:
    return (layer(rotate(x, q)) - rotate(layer(x), q)).abs().max().item()


@pytest.fixture(scope="module")
def o3() -> torch.Tensor:
    return random_orthogonal(B, seeded_gen(0))


@pytest.fixture(scope="module")
def features() -> dict[str, torch.Tensor]:
    gen = seeded_gen(1)
    return {
        "points": torch.randn(B, C, 3, N, generator=gen),
        "edges": torch.randn(B, C, 3, N, K, generator=gen),
    }


def _layers() -> dict[str, nn.Module]:
    torch.manual_seed(2)
    return {
        "linear": VNLinear(C, 7),
        "leaky_relu": VNLeakyReLU(C),
        "leaky_relu_shared": VNLeakyReLU(C, negative_slope=0.0, share_nonlinearity=True),
        "batch_norm": VNBatchNorm(C),
        "linear_leaky_relu": VNLinearLeakyReLU(C, 6),
        "linear_relu_no_bn": VNLinearLeakyReLU(C, 6, negative_slope=0.0, batch_norm=False),
        "max_pool": VNMaxPool(C),
        "mean_pool": VNMeanPool(-1),
    }


@pytest.mark.parametrize("shape", ["points", "edges"])
@pytest.mark.parametrize("name", list(_layers()))
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_vn_layers_are_o3_equivariant(name, shape, mode, features, o3):
    layer = _layers()[name].train(mode == "train")
    x = features[shape]
    assert equivariance_error(layer, x, o3) < ATOL
    # and under proper rotations, the group the VN paper states
    assert equivariance_error(layer, x, random_rotations(B, seeded_gen(3))) < ATOL


def test_batch_norm_without_set_dimension_and_zero_vectors(o3):
    bn = VNBatchNorm(C).train()
    x = torch.randn(B, C, 3, generator=seeded_gen(4))
    assert equivariance_error(bn, x, o3) < ATOL
    x[:, 0] = 0.0  # a zero vector stays zero, and nothing becomes NaN
    x.requires_grad_(True)
    out = bn(x)
    assert torch.isfinite(out).all() and (out[:, 0] == 0).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_vector_dropout_is_equivariant_for_a_fixed_mask(features, o3):
    drop = VNDropout(0.5).train()
    x = features["points"]
    torch.manual_seed(5)
    rotated_then_dropped = drop(rotate(x, o3))
    torch.manual_seed(5)
    dropped = drop(x)
    assert (rotated_then_dropped - rotate(dropped, o3)).abs().max() < ATOL
    # whole vectors are dropped: every (b, c, n) vector is either zero or scaled by 2
    kept = (dropped != 0).any(dim=2)
    assert torch.allclose(dropped, 2 * x * kept.unsqueeze(2))
    assert 0 < kept.float().mean() < 1
    assert torch.equal(drop.eval()(x), x)
    with pytest.raises(ValueError, match="p must"):
        VNDropout(1.0)


@pytest.mark.parametrize("normalize_frame", [False, True])
def test_invariant_layer_is_invariant(normalize_frame, features, o3):
    torch.manual_seed(6)
    layer = VNInvariant(C, normalize_frame=normalize_frame).eval()
    x = features["points"]
    inv, frame = layer(x)
    inv_rot, frame_rot = layer(rotate(x, o3))
    assert inv.shape == (B, C, 3, N) and frame.shape == (B, 3, 3, N)
    assert (inv_rot - inv).abs().max() < ATOL
    assert (frame_rot - rotate(frame, o3)).abs().max() < ATOL
    assert (vn_norms(rotate(x, o3)) - vn_norms(x)).abs().max() < ATOL
    if normalize_frame:  # rows of the frame are orthonormal at every point
        f = frame.permute(0, 3, 1, 2)
        assert torch.allclose(f @ f.transpose(-1, -2), torch.eye(3).expand_as(f), atol=1e-5)


def test_pools_are_permutation_invariant(features):
    x = features["points"]
    perm = torch.randperm(N, generator=seeded_gen(7))
    torch.manual_seed(8)
    max_pool = VNMaxPool(C)
    assert torch.allclose(max_pool(x[..., perm]), max_pool(x), atol=ATOL)
    assert torch.allclose(vn_mean_pool(x[..., perm]), vn_mean_pool(x), atol=ATOL)
    # the max pool returns actual set elements
    pooled = max_pool(x)
    assert ((x - pooled.unsqueeze(-1)).abs().amax(dim=2) < 1e-7).any(dim=-1).all()
    with pytest.raises(ValueError, match="set dimension"):
        vn_mean_pool(x, dim=2)


def test_a_plain_linear_layer_fails_the_check(features, o3):
    """The check is not vacuous: an ordinary linear map on xyz coordinates is not equivariant."""
    torch.manual_seed(9)
    linear = nn.Linear(3, 3)
    layer = lambda x: linear(x.transpose(2, -1)).transpose(2, -1)  # noqa: E731
    assert equivariance_error(layer, features["points"], o3) > 1e-2


# ------------------------------------------------------------------------------------------------- kNN
def _brute_force_knn(points: torch.Tensor, k: int) -> torch.Tensor:
    """``(B, N, 3)`` → ``(B, N, k)`` by explicit loops over pairs."""
    b, n, _ = points.shape
    out = torch.empty(b, n, k, dtype=torch.long)
    for bi in range(b):
        for i in range(n):
            d = torch.tensor([float(((points[bi, i] - points[bi, j]) ** 2).sum()) for j in range(n)])
            out[bi, i] = torch.argsort(d)[:k]
    return out


@pytest.mark.parametrize("mode", [FAST, EXACT])
def test_knn_matches_brute_force(mode):
    points = torch.randn(2, 20, 3, generator=seeded_gen(10), dtype=torch.float64)
    idx = knn(points.transpose(1, 2), 5, compute_mode=mode)
    assert idx.shape == (2, 20, 5)
    assert torch.equal(idx, _brute_force_knn(points, 5))
    assert torch.equal(idx[..., 0], torch.arange(20).expand(2, 20))  # self first
    no_self = knn(points.transpose(1, 2), 4, include_self=False)
    assert torch.equal(no_self, idx[..., 1:])


def test_knn_is_permutation_equivariant():
    x = torch.randn(3, 4, 16, generator=seeded_gen(11))
    perm = torch.randperm(16, generator=seeded_gen(12))
    inverse = torch.argsort(perm)
    idx = knn(x, 6, compute_mode=EXACT)
    idx_perm = knn(x[..., perm], 6, compute_mode=EXACT)
    # new point a is old point perm[a]; its neighbours, relabelled, are the old neighbours of perm[a]
    expected = inverse[idx[:, perm]]
    assert torch.equal(idx_perm.sort(-1).values, expected.sort(-1).values)


def test_knn_validates_k():
    with pytest.raises(ValueError, match="k must"):
        knn(torch.randn(1, 3, 5), 6)
    with pytest.raises(ValueError, match="k must"):
        knn(torch.randn(1, 3, 5), 5, include_self=False)


def test_graph_feature_content_and_shapes():
    x = torch.randn(2, 4, 10, generator=seeded_gen(13))
    idx = knn(x, 3)
    feat = graph_feature(x, idx=idx)
    assert feat.shape == (2, 8, 10, 3)
    b, i, j = 1, 7, 2
    assert torch.allclose(feat[b, :4, i, j], x[b, :, idx[b, i, j]] - x[b, :, i])
    assert torch.allclose(feat[b, 4:, i, j], x[b, :, i])
    vn = torch.randn(2, 4, 3, 10, generator=seeded_gen(14))
    assert gather_neighbours(vn, idx).shape == (2, 4, 3, 10, 3)
    assert graph_feature(vn, 3).shape == (2, 8, 3, 10, 3)
    assert graph_feature(vn, 3, cross=True).shape == (2, 12, 3, 10, 3)
    with pytest.raises(ValueError, match="cross"):
        graph_feature(x, 3, cross=True)


def test_vn_graph_feature_equivariance(features, o3):
    x = features["points"]
    edge = lambda y: graph_feature(y, K, compute_mode=EXACT)  # noqa: E731
    assert equivariance_error(edge, x, o3) < ATOL
    with_cross = lambda y: graph_feature(y, K, cross=True, compute_mode=EXACT)  # noqa: E731
    assert equivariance_error(with_cross, x, random_rotations(B, seeded_gen(15))) < ATOL
    # the cross product is a pseudo-vector: it flips under a reflection (documented SO(3)-only)
    mirror = -torch.eye(3).expand(B, 3, 3)
    assert equivariance_error(with_cross, x, mirror) > 1e-2
