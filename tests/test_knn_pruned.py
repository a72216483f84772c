"""The pruned exact kNN search (``canonical_network/nn/knn.py``) against the dense one it replaces.

The reference is the dense search's own distances (``torch.cdist`` in ``EXACT`` mode) sorted stably: nearest
first, exactly equidistant points by index, which is the order the pruned search promises. On rows without
exact ties the dense search's ``topk`` gives the same answer, so there the two searches must agree exactly;
the tests check that the inputs have such rows only where they say so.
"""

from __future__ import annotations

import pytest
import torch

from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.nn import knn as knn_module
from canonical_network.nn.knn import EXACT, _knn_pruned, _pruned_applies, knn
from tests.helpers import seeded_gen


def _clouds(kind: str, batch: int, points: int, seed: int) -> torch.Tensor:
    """Float32 clouds ``(B, P, 3)``: stretched sphere surfaces (ModelNet-like), a uniform cube, or tight
    clusters (many close neighbours, some leaves much denser than others)."""
    gen = seeded_gen(seed)
    if kind == "surface":
        x = torch.randn(batch, points, 3, generator=gen)
        x = x / x.norm(dim=-1, keepdim=True) * (0.5 + 0.5 * torch.rand(batch, 1, 3, generator=gen))
    elif kind == "cube":
        x = torch.rand(batch, points, 3, generator=gen) - 0.5
    else:
        centres = torch.randn(batch, 8, 3, generator=gen)
        which = torch.randint(0, 8, (batch, points), generator=gen)
        x = torch.gather(centres, 1, which.unsqueeze(-1).expand(batch, points, 3))
        x = x + 0.01 * torch.randn(batch, points, 3, generator=gen)
    return x - x.mean(dim=1, keepdim=True)


def _reference(points: torch.Tensor, k: int, include_self: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, tie-free rows)``: the dense search's distances sorted stably (ties by index) and, per row,
    whether its k + 1 nearest distances are all different (where ``topk``'s choice is the same)."""
    dist = torch.cdist(points, points, compute_mode=EXACT)
    if not include_self:
        dist = dist.masked_fill(torch.eye(points.shape[1], dtype=torch.bool), float("inf"))
    values, indices = torch.sort(dist, dim=-1, stable=True)
    head = values[..., : k + 1]
    return indices[..., :k], (head[..., 1:] != head[..., :-1]).all(dim=-1)


def _dense(points: torch.Tensor, k: int, include_self: bool = True) -> torch.Tensor:
    dist = torch.cdist(points, points, compute_mode=EXACT)
    if not include_self:
        dist = dist.masked_fill(torch.eye(points.shape[1], dtype=torch.bool), float("inf"))
    return dist.topk(k, dim=-1, largest=False, sorted=True).indices


@pytest.mark.parametrize(("kind", "points", "k"), [("surface", 1024, 20), ("surface", 2048, 40),
                                                   ("cube", 512, 1), ("clusters", 1024, 20)])
@pytest.mark.parametrize("include_self", [True, False])
def test_pruned_search_is_the_dense_search(kind, points, k, include_self):
    x = _clouds(kind, 4, points, seed=points + k)
    assert _pruned_applies(x, k)  # knn() takes the pruned search for these inputs
    pruned = knn(x.transpose(1, 2), k, include_self=include_self, compute_mode=EXACT)
    reference, tie_free = _reference(x, k, include_self)
    assert torch.equal(pruned, reference)  # every row, ties by index
    assert tie_free.float().mean() > 0.9  # the inputs are (mostly) without ties, so the next line says much
    assert torch.equal(pruned[tie_free], _dense(x, k, include_self)[tie_free])


@pytest.mark.parametrize(("leaf_size", "leaves_searched"), [(16, 2), (8, 3), (64, 2)])
def test_points_the_candidates_do_not_cover_are_searched_again(leaf_size, leaves_searched):
    """Few leaves searched: many points fail the covering test (and some the separation test) and are redone
    exactly; the answer stays the reference's."""
    x = _clouds("surface", 2, 1024, seed=5)
    reference, _ = _reference(x, 20)
    assert torch.equal(_knn_pruned(x, 20, leaf_size=leaf_size, leaves_searched=leaves_searched), reference)


def test_duplicate_points_are_ordered_by_index():
    """Exact ties everywhere: every point appears three times (the dense ``topk`` orders such ties as its
    selection algorithm leaves them; the pruned search by index)."""
    base = _clouds("surface", 2, 512, seed=6)
    x = base.repeat(1, 3, 1)[:, torch.randperm(1536, generator=seeded_gen(7))]
    reference, tie_free = _reference(x, 20)
    assert not tie_free.any()
    assert torch.equal(knn(x.transpose(1, 2), 20, compute_mode=EXACT), reference)


def test_pruned_search_is_permutation_equivariant():
    x = _clouds("surface", 2, 1024, seed=8)
    perm = torch.randperm(1024, generator=seeded_gen(9))
    idx = knn(x.transpose(1, 2), 20, compute_mode=EXACT)
    idx_perm = knn(x[:, perm].transpose(1, 2), 20, compute_mode=EXACT)
    # point a of the permuted cloud is old point perm[a]; its neighbours, relabelled, are perm[a]'s
    assert torch.equal(perm[idx_perm].sort(-1).values, idx[:, perm].sort(-1).values)


@pytest.mark.parametrize("layers", ["linear", "nonlinear"])
def test_canonicalizer_frames_do_not_change(layers, monkeypatch):
    """CN(L) and CN(NL) at the benchmark's size (1,024 points, k = 20): the same frame vectors with the pruned
    and the dense search, bit for bit (same neighbours in the same order: the inputs have no tie at any
    point's 21 nearest distances, checked). CN(L) through its reference path (materialised edges, sorted
    neighbours); its pooled path sums over unordered neighbour sets, the same sets (the test below), so it
    differs from the reference by summation order only: tests/test_pointcloud_fast_linear.py bounds that."""
    x = _clouds("surface", 4, 1024, seed=10)
    centred = x - x.mean(dim=1, keepdim=True)
    _, tie_free = _reference(centred, 20)
    assert tie_free.all()
    torch.manual_seed(0)
    canon = VNPointCloudCanonicalizer(layers=layers, input="edges", k=20).eval()
    with torch.no_grad():
        pruned = canon.reference_frame_vectors(x)
        monkeypatch.setattr(knn_module, "PRUNED_MIN_POINTS", 10**9)  # the dense search
        assert not _pruned_applies(centred, 20)
        dense = canon.reference_frame_vectors(x)
    assert torch.equal(pruned, dense)


def test_dense_search_is_kept_where_pruning_does_not_pay():
    small = _clouds("surface", 1, 256, seed=11)
    assert not _pruned_applies(small, 20)  # too few points
    assert not _pruned_applies(small.double(), 20)  # float64: its keys are float32 bits
    assert not _pruned_applies(torch.randn(1, 1024, 4), 20)  # feature-space graphs (DGCNN)
    assert _pruned_applies(_clouds("surface", 1, 1024, seed=11), 20)


@pytest.mark.parametrize(("kind", "points", "k"), [("surface", 1024, 20), ("clusters", 1024, 20), ("surface", 128, 10)])
@pytest.mark.parametrize("include_self", [True, False])
def test_unordered_rows_hold_the_same_neighbour_sets(kind, points, k, include_self):
    """``ordered=False`` (the pooled CN(L) path, which only sums over neighbours) skips the final sort: every
    row holds the ordered search's set, on the pruned search (1,024 points) and the dense one (128)."""
    x = _clouds(kind, 3, points, seed=7 + points)
    ordered = knn(x.transpose(1, 2), k, include_self=include_self, compute_mode=EXACT)
    unordered = knn(x.transpose(1, 2), k, include_self=include_self, compute_mode=EXACT, ordered=False)
    assert unordered.shape == ordered.shape
    assert torch.equal(unordered.sort(dim=-1).values, ordered.sort(dim=-1).values)


def test_int32_sort_keys_order_like_the_floats():
    """The k-d order sorts coordinates by ``_sort_keys``: int32 keys that must order exactly as the float32
    values do (negative and positive, tiny and huge, infinities), or the leaves would not be k-d leaves."""
    from canonical_network.nn.knn import _sort_keys

    gen = torch.Generator().manual_seed(0)
    values = torch.cat([torch.randn(4000, generator=gen) * 10.0 ** torch.randint(-30, 30, (4000,), generator=gen),
                        torch.tensor([float("inf"), float("-inf"), 1e-45, -1e-45, 3.4e38, -3.4e38, 0.0])])
    keys = _sort_keys(values)
    assert keys.dtype == torch.int32
    assert torch.equal(values[keys.argsort(stable=True)], values.sort(stable=True).values)
    # strictly monotone: distinct values get distinct keys in the same order
    order = values.argsort(stable=True)
    assert bool((keys[order][1:] > keys[order][:-1]).all())
