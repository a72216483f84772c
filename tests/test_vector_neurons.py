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
from tests.helpers import DEEP64, orthonormality_tol, rel_tol, seeded_gen

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

B, C, N, K = 4, 5, 12, 3
F64 = torch.float64
# Equivariance is exact by construction: the layers are checked in float64 against
# rel_tol(outputs, factor=DEEP64) ≈ 2.3e-10 of the outputs' scale (tests/helpers.py). For one layer (≤ 2⁴
# terms per sum: C = 5 channels, 3-term rotations, K = 3 neighbours) that is generous; it covers the
# divisions by vector norms of VN ReLU and batch norm. Observed errors are ≤ ~1e-5 of it; an ordinary
# linear layer misses it by ~9 orders of magnitude (test_a_plain_linear_layer_fails_the_check).


def rotate(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Act with ``q`` ``(B, 3, 3)`` on the coordinate axis of a VN feature ``(B, C, 3, *S)``."""
    return torch.einsum("bij,bcj...->bci...", q, x)


def equivariance_error(layer, x: torch.Tensor, q: torch.Tensor) -> float:
    return (layer(rotate(x, q)) - rotate(layer(x), q)).abs().max().item()


def equivariance_ratio(layer, x: torch.Tensor, q: torch.Tensor) -> float:
    """:func:`equivariance_error` over the float64 tolerance ``rel_tol(outputs, factor=DEEP64)``."""
    moved, expected = layer(rotate(x, q)), rotate(layer(x), q)
    return (moved - expected).abs().max().item() / rel_tol(moved, expected, factor=DEEP64)


@pytest.fixture(scope="module")
def o3() -> torch.Tensor:
    return random_orthogonal(B, seeded_gen(0), dtype=F64)


@pytest.fixture(scope="module")
def features() -> dict[str, torch.Tensor]:
    gen = seeded_gen(1)
    return {
        "points": torch.randn(B, C, 3, N, generator=gen, dtype=F64),
        "edges": torch.randn(B, C, 3, N, K, generator=gen, dtype=F64),
    }


def _layers() -> dict[str, nn.Module]:
    """Every layer, float64 (see the tolerance above)."""
    torch.manual_seed(2)
    layers = {
        "linear": VNLinear(C, 7),
        "leaky_relu": VNLeakyReLU(C),
        "leaky_relu_shared": VNLeakyReLU(C, negative_slope=0.0, share_nonlinearity=True),
        "batch_norm": VNBatchNorm(C),
        "linear_leaky_relu": VNLinearLeakyReLU(C, 6),
        "linear_relu_no_bn": VNLinearLeakyReLU(C, 6, negative_slope=0.0, batch_norm=False),
        "max_pool": VNMaxPool(C),
        "mean_pool": VNMeanPool(-1),
    }
    return {name: layer.double() for name, layer in layers.items()}


@pytest.mark.parametrize("shape", ["points", "edges"])
@pytest.mark.parametrize("name", list(_layers()))
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_vn_layers_are_o3_equivariant(name, shape, mode, features, o3):
    layer = _layers()[name].train(mode == "train")
    x = features[shape]
    assert equivariance_ratio(layer, x, o3) < 1
    # and under proper rotations, the group the VN paper states
    assert equivariance_ratio(layer, x, random_rotations(B, seeded_gen(3), dtype=F64)) < 1


def test_batch_norm_without_set_dimension_and_zero_vectors(o3):
    bn = VNBatchNorm(C).double().train()
    x = torch.randn(B, C, 3, generator=seeded_gen(4), dtype=F64)
    assert equivariance_ratio(bn, x, o3) < 1
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
    expected = rotate(dropped, o3)
    assert (rotated_then_dropped - expected).abs().max() < rel_tol(
        rotated_then_dropped, expected, factor=DEEP64
    )
    # whole vectors are dropped: every (b, c, n) vector is either zero or scaled by 1 / (1 − p) = 2, exactly
    kept = (dropped != 0).any(dim=2)
    assert torch.equal(dropped, 2 * x * kept.unsqueeze(2))
    assert 0 < kept.float().mean() < 1
    assert torch.equal(drop.eval()(x), x)
    with pytest.raises(ValueError, match="p must"):
        VNDropout(1.0)


@pytest.mark.parametrize("normalize_frame", [False, True])
def test_invariant_layer_is_invariant(normalize_frame, features, o3):
    torch.manual_seed(6)
    layer = VNInvariant(C, normalize_frame=normalize_frame).double().eval()
    x = features["points"]
    inv, frame = layer(x)
    inv_rot, frame_rot = layer(rotate(x, o3))
    assert inv.shape == (B, C, 3, N) and frame.shape == (B, 3, 3, N)
    assert (inv_rot - inv).abs().max() < rel_tol(inv_rot, inv, factor=DEEP64)
    frame_moved = rotate(frame, o3)
    assert (frame_rot - frame_moved).abs().max() < rel_tol(frame_rot, frame_moved, factor=DEEP64)
    norms_rot, norms = vn_norms(rotate(x, o3)), vn_norms(x)
    assert (norms_rot - norms).abs().max() < rel_tol(norms_rot, norms, factor=DEEP64)
    if normalize_frame:  # rows of the frame are orthonormal at every point (Gram–Schmidt's bound)
        f = frame.permute(0, 3, 1, 2)
        eye = torch.eye(3, dtype=F64).expand_as(f)
        assert (f @ f.transpose(-1, -2) - eye).abs().max() < orthonormality_tol(F64)


def test_pools_are_permutation_invariant(features):
    x = features["points"]
    perm = torch.randperm(N, generator=seeded_gen(7))
    torch.manual_seed(8)
    max_pool = VNMaxPool(C).double()
    # The max pool selects an element: the same one after a permutation, bit for bit (the projections it
    # compares are computed per element, and a tie within float64 rounding is improbable for random data).
    assert torch.equal(max_pool(x[..., perm]), max_pool(x))
    # A mean over N = 12 elements in another order: ≤ N eps relative to the mean of the magnitudes; the
    # mean of |x| is ≤ max |x|, so N eps of the largest input bounds it (2N for the two orders).
    mean_perm, mean = vn_mean_pool(x[..., perm]), vn_mean_pool(x)
    assert (mean_perm - mean).abs().max() < rel_tol(x, factor=2 * N)
    # the max pool returns actual set elements (gathered, not recomputed)
    pooled = max_pool(x)
    assert (x == pooled.unsqueeze(-1)).all(dim=2).any(dim=-1).all()
    with pytest.raises(ValueError, match="set dimension"):
        vn_mean_pool(x, dim=2)


def test_a_plain_linear_layer_fails_the_check(features, o3):
    """The check is not vacuous: an ordinary linear map on xyz coordinates is not equivariant."""
    torch.manual_seed(9)
    linear = nn.Linear(3, 3).double()
    layer = lambda x: linear(x.transpose(2, -1)).transpose(2, -1)  # noqa: E731
    assert equivariance_error(layer, features["points"], o3) > 1e-2  # off by O(1), not by rounding
    assert equivariance_ratio(layer, features["points"], o3) > 1e6  # the float64 tolerance, by far


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
    # the same subtraction of the same numbers: exact
    assert torch.equal(feat[b, :4, i, j], x[b, :, idx[b, i, j]] - x[b, :, i])
    assert torch.equal(feat[b, 4:, i, j], x[b, :, i])
    vn = torch.randn(2, 4, 3, 10, generator=seeded_gen(14))
    assert gather_neighbours(vn, idx).shape == (2, 4, 3, 10, 3)
    # every entry, both layouts, against plain indexing: x[b, c, (a,) idx[b, i, j]]
    batch, channel = torch.arange(2).view(2, 1, 1, 1), torch.arange(4).view(1, 4, 1, 1)
    assert torch.equal(gather_neighbours(x, idx), x[batch, channel, idx.unsqueeze(1)])
    axis = torch.arange(3).view(1, 1, 3, 1, 1)
    assert torch.equal(gather_neighbours(vn, idx), vn[batch.unsqueeze(-1), channel.unsqueeze(-1), axis,
                                                      idx.view(2, 1, 1, 10, 3)])
    # one graph (batch 1) for a whole batch
    assert torch.equal(gather_neighbours(x, idx[:1]), gather_neighbours(x, idx[:1].expand(2, -1, -1)))
    assert graph_feature(vn, 3).shape == (2, 8, 3, 10, 3)
    assert graph_feature(vn, 3, cross=True).shape == (2, 12, 3, 10, 3)
    with pytest.raises(ValueError, match="cross"):
        graph_feature(x, 3, cross=True)


def test_vn_graph_feature_equivariance(features, o3):
    x = features["points"]
    edge = lambda y: graph_feature(y, K, compute_mode=EXACT)  # noqa: E731
    assert equivariance_ratio(edge, x, o3) < 1
    with_cross = lambda y: graph_feature(y, K, cross=True, compute_mode=EXACT)  # noqa: E731
    assert equivariance_ratio(with_cross, x, random_rotations(B, seeded_gen(15), dtype=F64)) < 1
    # the cross product is a pseudo-vector: it flips under a reflection (documented SO(3)-only)
    mirror = -torch.eye(3, dtype=F64).expand(B, 3, 3)
    assert equivariance_error(with_cross, x, mirror) > 1e-2  # off by O(1), not by rounding
    assert equivariance_ratio(with_cross, x, mirror) > 1e6
