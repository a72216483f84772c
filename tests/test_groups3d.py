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
from tests.helpers import EPS32, EPS64, frame_condition, orthonormality_tol, rel_tol, seeded_gen

# Small tensors: one intra-op thread for every test here (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")

B = 16
EYE = torch.eye(3)
#: A sampled rotation is orthonormal to ≤ ~12 eps (a 3 × 3 Householder QR rounds ≤ ~9 times per entry, the
#: sign fix and normalisation a few more) and the check's 3-term products add ≤ 3 eps: 2⁵ eps bounds
#: ``max |RᵀR − I|`` (observed ≤ 5 eps); ``|det R − 1|`` is ≤ 3 times that. A matrix that is not a rotation
#: is off by O(1).
SAMPLED = 2**5


def _orthogonality_error(r: torch.Tensor) -> float:
    eye = torch.eye(3, dtype=r.dtype)
    return (r.transpose(-1, -2) @ r - eye).abs().max().item()


# --------------------------------------------------------------------------------------------- sampling
def test_random_rotations_are_proper_and_reproducible():
    r = random_rotations(B, seeded_gen(1))
    assert r.shape == (B, 3, 3) and r.dtype == torch.float32
    assert _orthogonality_error(r) < SAMPLED * EPS32
    assert (torch.linalg.det(r) - 1).abs().max() < 3 * SAMPLED * EPS32
    assert torch.equal(r, random_rotations(B, seeded_gen(1)))
    assert not torch.equal(r, random_rotations(B, seeded_gen(2)))
    assert random_rotations(2, seeded_gen(), dtype=torch.float64).dtype == torch.float64


def test_random_rotations_look_uniform():
    # Haar on SO(3): E[R] = 0 (every axis is sent everywhere alike).
    r = random_rotations(4000, seeded_gen(3), dtype=torch.float64)
    # A statistical, not a rounding, bound: each entry of a Haar rotation has mean 0 and variance 1/3, so
    # the mean of 4000 has standard deviation 1/sqrt(12000) ≈ 0.009; 0.05 is 5.5 of those.
    assert r.mean(dim=0).abs().max() < 0.05


def test_random_orthogonal_has_both_determinants():
    o = random_orthogonal(64, seeded_gen(4))
    assert _orthogonality_error(o) < SAMPLED * EPS32
    det = torch.linalg.det(o)
    assert (det.abs() - 1).abs().max() < 3 * SAMPLED * EPS32
    assert (det < 0).any() and (det > 0).any()


@pytest.mark.parametrize("axis, index", [("x", 0), ("y", 1), ("z", 2)])
def test_axis_rotations_fix_their_axis(axis, index):
    r = random_axis_rotations(B, seeded_gen(5), axis=axis)
    assert _orthogonality_error(r) < SAMPLED * EPS32
    assert (torch.linalg.det(r) - 1).abs().max() < 3 * SAMPLED * EPS32
    e = EYE[index].expand(B, 3)
    # The axis' row and column of r are exactly 0 and 1, so r e = e up to the 3-term product's rounding.
    assert (apply_rotation(e, r) - e).abs().max() < rel_tol(e, factor=4)


def test_axis_rotation_is_right_handed():
    quarter = axis_rotation(torch.tensor([math.pi / 2]), "z")
    # x̂ → ŷ: cos and sin of float32(π/2) (itself off by ≤ eps/2 · π/2) are 0 and 1 to ≤ ~2 eps
    assert (quarter[0] @ EYE[0] - EYE[1]).abs().max() < rel_tol(EYE, factor=4)
    with pytest.raises(ValueError, match="axis"):
        axis_rotation(torch.zeros(1), "w")  # type: ignore[arg-type]


def test_action_convention_and_inverse():
    g = random_euclidean(B, seeded_gen(6), group="O3")
    x = torch.randn(B, 7, 3, generator=seeded_gen(7))
    moved = apply_euclidean(x, g.rotation, g.translation)
    # x ↦ x Rᵀ + t is p ↦ R p + t on column vectors; both sides round a 3-term product and an addition
    # (≤ 4 eps of the scale each): 8 eps
    manual = torch.einsum("bij,bnj->bni", g.rotation, x) + g.translation[:, None]
    assert (moved - manual).abs().max() < rel_tol(moved, manual, factor=8)
    # Round trips: twice that, plus R's own departure from orthogonality (SAMPLED eps): 2⁵ eps of the
    # moved points' scale
    round_trip = rel_tol(moved, x, factor=2**5)
    assert (invert_euclidean(moved, g.rotation, g.translation) - x).abs().max() < round_trip
    assert (g.inverse_on_points(g.apply_to_points(x)) - x).abs().max() < round_trip
    assert (g.inverse_on_vectors(g.apply_to_vectors(x)) - x).abs().max() < round_trip
    assert isinstance(g, EuclideanTransform) and random_translations(3, seeded_gen()).shape == (3, 3)


# --------------------------------------------------------------------------------------------- Gram–Schmidt
def test_gram_schmidt_matches_textbook_process():
    v = torch.randn(B, 3, 3, generator=seeded_gen(8), dtype=torch.float64)
    q, r = torch.linalg.qr(v)  # QR = Gram–Schmidt up to the signs of diag(r)
    reference = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    # Both compute the frame to ≤ ~8 eps · κ (κ: frame_condition of the columns), so they agree to 2⁴ eps κ.
    tol = 2**4 * EPS64 * frame_condition(v.transpose(1, 2))
    assert (gram_schmidt(v, "O3") - reference).abs().max() < tol
    so3 = gram_schmidt(v, "SO3")
    assert (so3[..., :2] - reference[..., :2]).abs().max() < tol
    assert (torch.linalg.det(so3) - 1).abs().max() < 3 * tol


@pytest.mark.parametrize(
    "group, sampler", [("O3", random_orthogonal), ("SO3", random_rotations)], ids=["O3", "SO3"]
)
def test_gram_schmidt_is_equivariant(group, sampler):
    v = torch.randn(64, 3, 3, generator=seeded_gen(9))
    q = sampler(64, seeded_gen(10))
    out = gram_schmidt(v, group)
    err = (gram_schmidt(q @ v, group) - q @ out).abs().max().item()
    # Rotating the input (3 eps) and the output (3 eps plus Q's SAMPLED eps) and Gram–Schmidt's own
    # ≤ 8 eps κ on both sides: 2⁵ eps κ, κ = frame_condition of the inputs.
    tol = 2**5 * EPS32 * frame_condition(v.transpose(1, 2), group)
    assert err < tol, (err, tol)
    assert _orthogonality_error(out) < orthonormality_tol(torch.float32)


def test_so3_gram_schmidt_is_not_reflection_equivariant():
    # documented: e₃ = e₁ × e₂ keeps det = +1, so a reflection of the input is not a reflection of the frame
    v = torch.randn(4, 3, 3, generator=seeded_gen(11))
    mirror = torch.diag(torch.tensor([1.0, 1.0, -1.0])).expand(4, 3, 3)
    # off by O(1) (e₃ flips), not by rounding
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
    # Degenerate inputs: Gram–Schmidt's worst case, the bound its parallel_tol admits
    assert _orthogonality_error(out) < orthonormality_tol(torch.float32)
    det = torch.linalg.det(out.detach())
    assert (det.abs() - 1).abs().max() < 3 * orthonormality_tol(torch.float32)
    if group == "SO3":
        assert (det - 1).abs().max() < 3 * orthonormality_tol(torch.float32)
    (out * torch.randn(out.shape, generator=seeded_gen(13))).sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all()


def test_gram_schmidt_zero_input_gives_identity():
    assert torch.equal(gram_schmidt(torch.zeros(2, 3, 3)), torch.eye(3).expand(2, 3, 3))


def test_gram_schmidt_stays_equivariant_when_only_one_vector_is_redundant():
    # v₂ ∥ v₁: the next input vector v₃ takes its place for e₂, so e₁, e₂ stay O(3)-equivariant; the input
    # spans a plane, is fixed by the mirror through it, and e₃ = e₁ × e₂ is equivariant under rotations.
    v = _degenerate_inputs()["v2_parallel_v3_free"].unsqueeze(0).repeat(8, 1, 1)
    # The tolerance of test_gram_schmidt_is_equivariant, κ of the two vectors actually used (v₁, v₃; the
    # largest norm, |v₂| = 3|v₁|, still counts): SO3 form of frame_condition, which skips a third residual.
    used = v[:, :, [0, 2, 1]].transpose(1, 2)
    tol = 2**5 * EPS32 * frame_condition(used, "SO3")
    q = random_orthogonal(8, seeded_gen(14))
    assert (gram_schmidt(q @ v, "O3")[..., :2] - (q @ gram_schmidt(v, "O3"))[..., :2]).abs().max() < tol
    r = random_rotations(8, seeded_gen(16))
    assert (gram_schmidt(r @ v, "O3") - r @ gram_schmidt(v, "O3")).abs().max() < tol
    # planar input: e₃ falls back to e₁ × e₂, equivariant under rotations
    p = _degenerate_inputs()["planar"].unsqueeze(0).repeat(8, 1, 1)
    tol = 2**5 * EPS32 * frame_condition(p.transpose(1, 2), "SO3")
    r = random_rotations(8, seeded_gen(15))
    assert (gram_schmidt(r @ p, "O3") - r @ gram_schmidt(p, "O3")).abs().max() < tol


def test_gram_schmidt_rejects_bad_arguments():
    with pytest.raises(ValueError, match="group"):
        gram_schmidt(torch.randn(1, 3, 3), "SE3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        gram_schmidt(torch.randn(1, 3, 2))
    with pytest.raises(ValueError, match="parallel_tol"):
        gram_schmidt(torch.randn(1, 3, 3), parallel_tol=0.9)
