"""CN(L)'s pooled fast path (``VNPointCloudCanonicalizer.pooled_edge_frame_vectors``) against the reference
path through the materialised ``(B, 3, 3, P, k)`` edge features (``reference_frame_vectors``).

Tolerance (both paths compute ``v_o = Σ_c W_oc ē_c / s_c`` from the same kNN graph and the same per-edge
values; only the order of the sums and of the scaling differ). Per channel ``c`` every coordinate of an
edge term is at most its vector norm, and ``s_c`` is the mean of those norms, so the ``n = P k`` terms of
``ē_c / s_c`` have ``Σ |term| / n ≤ 1`` per coordinate. Worst-case recursive summation then moves a pooled
coordinate by ``≤ γ_n ≈ n u`` (fast path: one sum over ``n``; reference: ``k`` then ``P`` terms, less),
the scale ``s_c`` (a mean of ``n`` positive norms) by ``≤ n u`` relative, and the few divisions,
products and the 3-term mix add ``≤ 16 u``: ``|Δv_o| ≤ 2 (2n + 16) u Σ_c |W_oc|`` between the two paths
(``u``: unit roundoff of the dtype). In float64 that is ~1e-11 and the paths agree to ~1e-17; in float32
(~5e-3) the bound is loose, so a second check compares each float32 path with the float64 reference: the
fast path must be no farther from it than the reference path is, up to a factor 8 and ``16 u Σ|W|``.
"""

from __future__ import annotations

import pytest
import torch

from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.nn.knn import EXACT, knn
from tests.helpers import max_err, seeded_gen
from tests.test_canonicalizers3d import object_surface


def cn_l(k: int = 20, dtype: torch.dtype = torch.float64, seed: int = 0) -> VNPointCloudCanonicalizer:
    torch.manual_seed(seed)  # the VNLinear's initial weights
    return VNPointCloudCanonicalizer("linear", k=k).to(dtype)


def path_bound(canon: VNPointCloudCanonicalizer, points: torch.Tensor) -> torch.Tensor:
    """``(3,)``: the bound ``2 (2n + 16) u Σ_c |W_oc|`` per frame vector (module docstring)."""
    num_points = points.shape[1]
    n = num_points * min(canon.k, num_points)
    u = torch.finfo(points.dtype).eps / 2
    return 2 * (2 * n + 16) * u * canon.input_layer.weight.detach().abs().sum(dim=1)


def row_errors(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(3,)``: the largest coordinate error of each frame vector over the batch."""
    return (a - b).abs().amax(dim=(0, 2))


@pytest.mark.parametrize(("points", "k"), [(96, 20), (200, 40), (12, 20)])
def test_fast_path_equals_the_reference_in_float64(points, k):
    canon = cn_l(k).eval()
    clouds = object_surface(batch=3, points=points, seed=points, dtype=torch.float64)
    with torch.no_grad():
        fast, reference = canon.pooled_edge_frame_vectors(clouds), canon.reference_frame_vectors(clouds)
        assert torch.equal(canon.frame_vectors(clouds), fast)  # the default dispatch
    assert (row_errors(fast, reference) <= path_bound(canon, clouds)).all()
    assert max_err(fast, reference) > 0 or points == 12  # not one path run twice (rounding differs)


def test_fast_path_in_float32_at_the_benchmark_size():
    """1,024 points, k = 20 (the pruned kNN search applies): the same graph in both paths, as both make the
    same call; float32 within the worst-case bound, and as close to float64 as the reference is."""
    canon32 = cn_l(20, torch.float32).eval()
    canon64 = cn_l(20, torch.float64).eval()
    clouds64 = object_surface(batch=4, points=1024, seed=7, dtype=torch.float64)
    clouds32 = clouds64.float()
    with torch.no_grad():
        fast, reference = canon32.pooled_edge_frame_vectors(clouds32), canon32.reference_frame_vectors(clouds32)
        exact = canon64.reference_frame_vectors(clouds64)
    assert (row_errors(fast, reference) <= path_bound(canon32, clouds32)).all()
    # precondition of the float64 comparison: the float32 and float64 clouds have the same graph
    graph32 = knn(clouds32.transpose(1, 2), 20, compute_mode=EXACT).sort(dim=-1).values
    graph64 = knn(clouds64.transpose(1, 2), 20, compute_mode=EXACT).sort(dim=-1).values
    assert torch.equal(graph32, graph64)
    floor = 16 * torch.finfo(torch.float32).eps / 2 * canon32.input_layer.weight.abs().sum(dim=1)
    fast_error, reference_error = row_errors(fast.double(), exact), row_errors(reference.double(), exact)
    assert (fast_error <= 8 * reference_error + floor.double()).all(), (fast_error, reference_error)


def test_gradients_equal_in_training():
    """Train mode, float64: the gradients of a loss of the frame vectors with respect to the weights and to
    the points agree (the same function; the backward sums differ in order as the forward ones do)."""
    clouds = object_surface(batch=3, points=128, seed=5, dtype=torch.float64)
    weights = torch.randn(3, 3, 3, generator=seeded_gen(6), dtype=torch.float64)
    grads = []
    for fast in (True, False):
        canon = cn_l(20).train()
        canon.collapse_linear = fast
        x = clouds.clone().requires_grad_(True)
        (canon.frame_vectors(x) * weights).sum().backward()
        grads.append((canon.input_layer.weight.grad, x.grad))
    (w_fast, x_fast), (w_ref, x_ref) = grads
    n = 128 * 20
    u = torch.finfo(torch.float64).eps / 2
    # each gradient is a sum of n (weights) or ≤ 2(k + 1) (points) chained terms through the pooled means
    # and the scales, each ≤ (2n + 16) u relative off between the paths (forward bound), times 8 for the
    # products of the chain rule
    assert max_err(w_fast, w_ref) <= 8 * (2 * n + 16) * u * w_ref.abs().max().item()
    assert max_err(x_fast, x_ref) <= 8 * (2 * n + 16) * u * x_ref.abs().max().item()
    assert x_ref.abs().max() > 0 and w_ref.abs().max() > 0


def test_dispatch_only_for_the_linear_mean_pooled_edge_input():
    assert VNPointCloudCanonicalizer("linear", k=20).pools_linearly
    assert not VNPointCloudCanonicalizer("linear", k=20, pooling="max").pools_linearly
    assert not VNPointCloudCanonicalizer("nonlinear", k=20).pools_linearly
    assert not VNPointCloudCanonicalizer("nonlinear", input="pointwise").pools_linearly
    canon = VNPointCloudCanonicalizer("nonlinear", k=20)
    with pytest.raises(ValueError, match="pooled_edge_frame_vectors needs"):
        canon.pooled_edge_frame_vectors(torch.randn(2, 30, 3))
    # the reference path stays selectable, and is what frame_vectors gives with the flag off
    linear = cn_l(8, torch.float32)
    linear.collapse_linear = False
    clouds = object_surface(batch=2, points=40, seed=1)
    with torch.no_grad():
        assert torch.equal(linear.frame_vectors(clouds), linear.reference_frame_vectors(clouds))
