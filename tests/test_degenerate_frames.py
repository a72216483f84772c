"""Degenerate frames are reported, not hidden: where no equivariant frame exists (the input is fixed by some
rotations or reflections: one particle, a collinear or planar system, a cloud symmetric about an axis), the 3-D
canonicalizers fall back to a fixed axis, their element says so (``EuclideanTransform.degenerate``), and
``diagnose`` reports the rate (``pose.degenerate_rate``)."""

from __future__ import annotations

import types

import pytest
import torch

from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.diagnostics.measures import pose
from canonical_network.groups.euclidean import gram_schmidt, gram_schmidt_frame, random_euclidean
from tests.helpers import seeded_gen

F64 = torch.float64


def test_gram_schmidt_says_where_it_fell_back():
    gen = seeded_gen(0)
    generic = torch.randn(8, 3, 3, generator=gen, dtype=F64)
    for group in ("O3", "SO3"):
        rotation, degenerate = gram_schmidt_frame(generic, group)
        assert not degenerate.any() and torch.equal(rotation, gram_schmidt(generic, group))
    axis = torch.randn(1, 3, 1, generator=gen, dtype=F64)
    parallel = axis * torch.tensor([[[1.0, -2.0, 0.5]]], dtype=F64)  # three columns along one axis
    plane = torch.randn(1, 3, 2, generator=gen, dtype=F64)
    planar = torch.cat([plane, plane @ torch.tensor([[0.3], [-0.7]], dtype=F64)], dim=2)  # v₃ in span(v₁, v₂)
    zero = torch.zeros(1, 3, 3, dtype=F64)
    for vectors, o3, so3 in ((parallel, True, True), (zero, True, True), (planar, True, False)):
        assert gram_schmidt_frame(vectors, "O3")[1].item() is o3  # a reflection through the plane fixes it
        assert gram_schmidt_frame(vectors, "SO3")[1].item() is so3  # SO(3): e₃ = e₁ × e₂ follows rotations


def _systems(batch: int, particles: int, seed: int, collinear: bool = False):
    gen = seeded_gen(seed)
    if collinear:  # particles on a line through the origin, moving along it: fixed by the rotations about it
        direction = torch.nn.functional.normalize(torch.randn(batch, 1, 3, generator=gen, dtype=F64), dim=-1)
        loc = torch.randn(batch, particles, 1, generator=gen, dtype=F64) * direction
        vel = torch.randn(batch, particles, 1, generator=gen, dtype=F64) * direction
    else:
        loc = torch.randn(batch, particles, 3, generator=gen, dtype=F64)
        vel = torch.randn(batch, particles, 3, generator=gen, dtype=F64)
    charges = (2 * torch.randint(0, 2, (batch, particles, 1), generator=gen) - 1).to(F64)
    return loc, vel, charges


def test_the_nbody_canonicalizer_marks_the_systems_without_an_equivariant_frame():
    torch.manual_seed(0)
    canonicalizer = VNDeepSetsCanonicalizer(dropout=0.0).double().eval()
    with torch.no_grad():
        _, generic = canonicalizer.canonicalize(*_systems(6, 5, 1))
        _, collinear = canonicalizer.canonicalize(*_systems(6, 5, 2, collinear=True))
        _, single = canonicalizer.canonicalize(*_systems(6, 1, 3))
    assert not generic.degenerate.any()
    assert collinear.degenerate.all() and single.degenerate.all()
    # the generic systems' elements stay equivariant: h(g·x) = g·h(x) (the control is the degenerate case below)
    x = _systems(6, 5, 1)
    g = random_euclidean(6, seeded_gen(4), group="O3", dtype=F64)
    with torch.no_grad():
        _, moved = canonicalizer.canonicalize(g.apply_to_points(x[0]), g.apply_to_vectors(x[1]), x[2])
    assert not moved.degenerate.any()
    assert torch.allclose(moved.rotation, g.rotation @ generic.rotation, atol=1e-9)
    y = _systems(6, 5, 2, collinear=True)
    with torch.no_grad():
        _, moved = canonicalizer.canonicalize(g.apply_to_points(y[0]), g.apply_to_vectors(y[1]), y[2])
    assert not torch.allclose(moved.rotation, g.rotation @ collinear.rotation, atol=1e-3)  # no equivariant frame


def _line_cloud(batch: int, points: int, seed: int) -> torch.Tensor:
    """Points on a line through the origin: every cloud is fixed by the rotations about that line (its neighbour
    offsets, and their cross products, lie on it or vanish, whatever the kNN graph's ties)."""
    gen = seeded_gen(seed)
    direction = torch.nn.functional.normalize(torch.randn(batch, 1, 3, generator=gen, dtype=F64), dim=-1)
    return torch.randn(batch, points, 1, generator=gen, dtype=F64) * direction


@pytest.mark.parametrize("group", ["SO3", "O3"])
def test_the_point_cloud_canonicalizer_marks_a_symmetric_cloud(group):
    torch.manual_seed(0)
    canonicalizer = VNPointCloudCanonicalizer(group=group, k=4, hidden_dim=8).double().eval()
    with torch.no_grad():
        _, symmetric = canonicalizer.canonicalize(_line_cloud(2, 24, 6))
        _, generic = canonicalizer.canonicalize(torch.randn(2, 24, 3, generator=seeded_gen(5), dtype=F64))
    assert symmetric.degenerate.all() and not generic.degenerate.any()


def test_diagnose_reports_the_rate_of_degenerate_frames():
    torch.manual_seed(0)
    canonicalizer = VNDeepSetsCanonicalizer(dropout=0.0).double().eval()
    generic, collinear = _systems(3, 5, 1), _systems(1, 5, 2, collinear=True)
    inputs = tuple(torch.cat([a, b]) for a, b in zip(generic, collinear, strict=True))
    with torch.no_grad():
        _, element = canonicalizer.canonicalize(*inputs)
        result, _ = pose(types.SimpleNamespace(canonicalizer=canonicalizer), inputs, element, 0.01, 12)
    assert result["degenerate_rate"] == pytest.approx(0.25) and "no equivariant frame" in result["degenerate_definition"]
