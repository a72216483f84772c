"""Sampling of SO(3)/O(3)/axis rotations, the E(3) action convention, and the robust Gram–Schmidt."""

from __future__ import annotations

import math

import pytest
import torch

from canonical_network.groups.euclidean import (
    EuclideanTransform,
    apply_euclidean,
    apply_rotation,
    axis_rotation,
    gram_schmidt,
    invert_euclidean,
    random_axis_rotations,
    random_euclidean,
    random_orthogonal,
    random_rotations,
    random_translations,
)
from tests.conftest import seeded_gen

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

B = 16
EYE = torch.eye(3)


def _orthogonality_error(r: torch.Tensor) -> float:
    eye = torch.eye(3, dtype=r.dtype)
    return (r.transpose(-1, -2) @ r - eye).abs().max().item()


# --------------------------------------------------------------------------------------------- sampling
def test_random_rotations_are_proper_and_reproducible():
    r = random_rotations(B, seeded_gen(1))
    assert r.shape == (B, 3, 3) and r.dtype == torch.float32
    assert _orthogonality_error(r) < 1e-5
    assert torch.allclose(torch.linalg.det(r), torch.ones(B), atol=1e-5)
    assert torch.equal(r, random_rotations(B, seeded_gen(1)))
    assert not torch.equal(r, random_rotations(B, seeded_gen(2)))
    assert random_rotations(2, seeded_gen(), dtype=torch.float64).dtype == torch.float64


def test_random_rotations_look_uniform():
    # Haar on SO(3): E[R] = 0 (every axis is sent everywhere alike).
    r = random_rotations(4000, seeded_gen(3), dtype=torch.float64)
    assert r.mean(dim=0).abs().max() < 0.05


def test_random_orthogonal_has_both_determinants():
    o = random_orthogonal(64, seeded_gen(4))
    assert _orthogonality_error(o) < 1e-5
    det = torch.linalg.det(o)
    assert torch.allclose(det.abs(), torch.ones(64), atol=1e-5)
    assert (det < 0).any() and (det > 0).any()


@pytest.mark.parametrize("axis, index", [("x", 0), ("y", 1), ("z", 2)])
def test_axis_rotations_fix_their_axis(axis, index):
    r = random_axis_rotations(B, seeded_gen(5), axis=axis)
    assert _orthogonality_error(r) < 1e-5
    assert torch.allclose(torch.linalg.det(r), torch.ones(B), atol=1e-5)
    e = EYE[index].expand(B, 3)
    assert torch.allclose(apply_rotation(e, r), e, atol=1e-6)


def test_axis_rotation_is_right_handed():
    quarter = axis_rotation(torch.tensor([math.pi / 2]), "z")
    assert torch.allclose(quarter[0] @ EYE[0], EYE[1], atol=1e-6)  # x̂ → ŷ
    with pytest.raises(ValueError, match="axis"):
        axis_rotation(torch.zeros(1), "w")  # type: ignore[arg-type]


def test_action_convention_and_inverse():
    g = random_euclidean(B, seeded_gen(6), group="O3")
    x = torch.randn(B, 7, 3, generator=seeded_gen(7))
    moved = apply_euclidean(x, g.rotation, g.translation)
    # x ↦ x Rᵀ + t is p ↦ R p + t on column vectors
    manual = torch.einsum("bij,bnj->bni", g.rotation, x) + g.translation[:, None]
    assert torch.allclose(moved, manual, atol=1e-6)
    assert torch.allclose(invert_euclidean(moved, g.rotation, g.translation), x, atol=1e-5)
    assert torch.allclose(g.inverse_on_points(g.apply_to_points(x)), x, atol=1e-5)
    assert torch.allclose(g.inverse_on_vectors(g.apply_to_vectors(x)), x, atol=1e-5)
    assert isinstance(g, EuclideanTransform) and random_translations(3, seeded_gen()).shape == (3, 3)


# --------------------------------------------------------------------------------------------- Gram–Schmidt
def test_gram_schmidt_matches_textbook_process():
    v = torch.randn(B, 3, 3, generator=seeded_gen(8), dtype=torch.float64)
    q, r = torch.linalg.qr(v)  # QR = Gram–Schmidt up to the signs of diag(r)
    reference = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    assert torch.allclose(gram_schmidt(v, "O3"), reference, atol=1e-10)
    so3 = gram_schmidt(v, "SO3")
    assert torch.allclose(so3[..., :2], reference[..., :2], atol=1e-10)
    assert torch.allclose(torch.linalg.det(so3), torch.ones(B, dtype=torch.float64))


@pytest.mark.parametrize(
    "group, sampler", [("O3", random_orthogonal), ("SO3", random_rotations)], ids=["O3", "SO3"]
)
def test_gram_schmidt_is_equivariant(group, sampler):
    v = torch.randn(64, 3, 3, generator=seeded_gen(9))
    q = sampler(64, seeded_gen(10))
    out = gram_schmidt(v, group)
    err = (gram_schmidt(q @ v, group) - q @ out).abs().max().item()
    assert err < 1e-5, err
    assert _orthogonality_error(out) < 1e-5


def test_so3_gram_schmidt_is_not_reflection_equivariant():
    # documented: e₃ = e₁ × e₂ keeps det = +1, so a reflection of the input is not a reflection of the frame
    v = torch.randn(4, 3, 3, generator=seeded_gen(11))
    mirror = torch.diag(torch.tensor([1.0, 1.0, -1.0])).expand(4, 3, 3)
    assert (gram_schmidt(mirror @ v, "SO3") - mirror @ gram_schmidt(v, "SO3")).abs().max() > 0.1


def _degenerate_inputs() -> dict[str, torch.Tensor]:
    gen = seeded_gen(12)
    a, b = torch.randn(3, generator=gen), torch.randn(3, generator=gen)
    cols = lambda *vs: torch.stack(vs, dim=-1)  # noqa: E731  (columns are the input vectors)
    return {
        "zeros": torch.zeros(3, 3),
        "tiny": 1e-9 * cols(a, b, a + b),
        "parallel": cols(a, 2 * a, -a),
        "duplicate": cols(a, a, a),
        "v1_zero": cols(torch.zeros(3), a, b),
        "v2_parallel_v3_free": cols(a, 3 * a, b),
        "planar": cols(a, b, a - 2 * b),
        "near_parallel": cols(a, a + 1e-7 * b, a - 1e-7 * b),
        "only_v3": cols(torch.zeros(3), torch.zeros(3), b),
        "huge": 1e6 * cols(a, b, a - b + torch.ones(3)),
    }


@pytest.mark.parametrize("group", ["O3", "SO3"])
@pytest.mark.parametrize("name", list(_degenerate_inputs()))
def test_gram_schmidt_degenerate_inputs_are_finite_and_orthogonal(group, name):
    v = _degenerate_inputs()[name].unsqueeze(0).repeat(2, 1, 1).requires_grad_(True)
    out = gram_schmidt(v, group)
    assert torch.isfinite(out).all()
    assert _orthogonality_error(out) < 1e-5
    det = torch.linalg.det(out.detach())
    assert torch.allclose(det.abs(), torch.ones(2), atol=1e-5)
    if group == "SO3":
        assert torch.allclose(det, torch.ones(2), atol=1e-5)
    (out * torch.randn(out.shape, generator=seeded_gen(13))).sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all()


def test_gram_schmidt_zero_input_gives_identity():
    assert torch.equal(gram_schmidt(torch.zeros(2, 3, 3)), torch.eye(3).expand(2, 3, 3))


def test_gram_schmidt_stays_equivariant_when_only_one_vector_is_redundant():
    # v₂ ∥ v₁: the next input vector v₃ takes its place for e₂, so e₁, e₂ stay O(3)-equivariant; the input
    # spans a plane, is fixed by the mirror through it, and e₃ = e₁ × e₂ is equivariant under rotations.
    v = _degenerate_inputs()["v2_parallel_v3_free"].unsqueeze(0).repeat(8, 1, 1)
    q = random_orthogonal(8, seeded_gen(14))
    assert (gram_schmidt(q @ v, "O3")[..., :2] - (q @ gram_schmidt(v, "O3"))[..., :2]).abs().max() < 1e-5
    r = random_rotations(8, seeded_gen(16))
    assert (gram_schmidt(r @ v, "O3") - r @ gram_schmidt(v, "O3")).abs().max() < 1e-5
    # planar input: e₃ falls back to e₁ × e₂, equivariant under rotations
    p = _degenerate_inputs()["planar"].unsqueeze(0).repeat(8, 1, 1)
    r = random_rotations(8, seeded_gen(15))
    assert (gram_schmidt(r @ p, "O3") - r @ gram_schmidt(p, "O3")).abs().max() < 1e-5


def test_gram_schmidt_rejects_bad_arguments():
    with pytest.raises(ValueError, match="group"):
        gram_schmidt(torch.randn(1, 3, 3), "SE3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        gram_schmidt(torch.randn(1, 3, 2))
    with pytest.raises(ValueError, match="parallel_tol"):
        gram_schmidt(torch.randn(1, 3, 3), parallel_tol=0.9)
