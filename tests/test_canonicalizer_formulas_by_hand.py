"""Canonicalizer formulas checked against values computed by hand (small explicit numbers, float64).

Each test pins one formula that the structural tests leave free:

* the continuous prior is the squared Frobenius distance ``‖R − I‖²_F = 4(1 − cos θ)`` for a rotation by θ;
* ``is_identity`` uses the documented tolerance (``‖R − I‖_F < 1e-3``, i.e. |θ| < 0.04° for a planar rotation);
* a frame's element for the prior is its top-weighted member (``top_member_rows``);
* ``softmax_gap`` weights are ``exp(s_i / T) − exp(b / T)``, normalised, with the temperature on both terms;
* the ``sampled`` law of each sample is ``softmax(s_b / T)`` of its own scores only;
* the straight-through gradients (sampled frames and the G-CNN's ``ste`` selection) reach the right sample
  with the softmax Jacobian ``(1/T)(diag p − p pᵀ) a``, sign included;
* an O(3) vector frame weighs Gram–Schmidt's ``e₃`` by ``σ(2 |ẑ| / T)`` and its flip ``−e₃`` by the rest;
* the PCA axis is that of the *centred* second moments, ``½ atan2(2 c_xy, c_xx − c_yy)``, oriented by the skew.
* CN(OPT) keeps the final angle of the start with the lowest final energy, wrapped into [−π, π).
"""

from __future__ import annotations

import math

import pytest
import torch

from canonical_network.canonicalization.base import IDENTITY_TOLERANCE
from canonical_network.canonicalization.image import GCNNCanonicalizer, PCACanonicalizer
from canonical_network.canonicalization.image_optimization import OptimizationCanonicalizer
from canonical_network.canonicalization.symmetrization import (
    FrameSpec,
    discrete_frame,
    top_k_weights,
    top_member_rows,
    vector_frame,
)
from canonical_network.groups.euclidean import EuclideanTransform, axis_rotation
from canonical_network.groups.image import PlanarElement

F64 = torch.float64
EPS64 = torch.finfo(F64).eps
#: float64 results of a handful of trig/exp/sum/divide roundings on O(1) values: each rounding is ≤ 1 ulp, so
#: 1e-12 (~4500 eps) is a wide margin that is still ten orders of magnitude below any mutant's change.
TOL64 = 1e-12


def _planar(angles_deg: list[float]) -> PlanarElement:
    angle = torch.tensor(angles_deg, dtype=F64)
    return PlanarElement(angle_deg=angle, reflect=torch.zeros_like(angle))


def _by_hand_prior(angle_deg: float) -> float:
    # R − I = [[c − 1, −s], [s, c − 1]]: 2(1 − c)² + 2s² = 2(1 − 2c + c² + s²) = 4(1 − c)
    return 4.0 * (1.0 - math.cos(math.radians(angle_deg)))


# ------------------------------------------------------------------------------------------- M08: the prior
@pytest.mark.parametrize("angle_deg", [30.0, 45.0, 170.0])
def test_the_prior_is_the_squared_frobenius_distance_of_a_planar_rotation(angle_deg):
    h = PCACanonicalizer()  # uses Canonicalizer.prior's default for continuous groups
    expected = _by_hand_prior(angle_deg)
    if angle_deg == 45.0:
        assert expected == pytest.approx(1.171573, abs=1e-6)  # 4 − 2√2; the L1 sum Σ|R − I| would be 2.0
    got = h.prior(_planar([angle_deg]))
    assert got.dtype == F64
    assert got.item() == pytest.approx(expected, rel=TOL64, abs=TOL64)


def test_the_prior_of_a_batch_is_the_mean_and_the_same_for_3d_rotations_about_z():
    h = PCACanonicalizer()
    angles = [30.0, 45.0, 170.0]
    expected = sum(_by_hand_prior(a) for a in angles) / len(angles)
    assert h.prior(_planar(angles)).item() == pytest.approx(expected, rel=TOL64, abs=TOL64)
    # a z-axis rotation in 3-D adds a diagonal 1 − 1 = 0, so the distance is the planar one
    rotation = axis_rotation(torch.tensor([math.radians(a) for a in angles], dtype=F64), "z")
    translation = torch.randn(len(angles), 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    got = h.prior(EuclideanTransform(rotation, translation))  # translations are not penalised
    assert got.item() == pytest.approx(expected, rel=TOL64, abs=TOL64)


def test_the_prior_of_the_reflection_diag_minus_one_one_one_is_four():
    h = PCACanonicalizer()
    reflection = torch.diag(torch.tensor([-1.0, 1.0, 1.0], dtype=F64)).unsqueeze(0)
    got = h.prior(EuclideanTransform(reflection, torch.zeros(1, 3, dtype=F64)))
    # R − I = diag(−2, 0, 0): squared Frobenius 4 (exact in binary floating point)
    assert got.item() == 4.0


# --------------------------------------------------------------------------------- M12: identity tolerance
def test_is_identity_follows_the_documented_tolerance():
    # planar ‖R − I‖_F = 2√2 |sin(θ/2)|: the boundary angle where it equals IDENTITY_TOLERANCE (1e-3)
    boundary_deg = math.degrees(2.0 * math.asin(1e-3 / (2.0 * math.sqrt(2.0))))
    assert boundary_deg == pytest.approx(0.0405, abs=1e-4)  # the docstring's "0.04°"
    angles = [0.02, 0.1, 1.0, 5.0]
    # every angle is at least a factor 2 from the boundary, so rounding cannot decide the answer
    assert all(a < boundary_deg / 2 or a > 2 * boundary_deg for a in angles)
    expected = [a < boundary_deg for a in angles]
    assert expected == [True, False, False, False]
    assert IDENTITY_TOLERANCE == 1e-3
    h = PCACanonicalizer()
    assert h.is_identity(_planar(angles), len(angles)).tolist() == expected
    rotation = axis_rotation(torch.tensor([math.radians(a) for a in angles], dtype=F64), "z")
    g3 = EuclideanTransform(rotation, torch.zeros(len(angles), 3, dtype=F64))
    assert h.is_identity(g3, len(angles)).tolist() == expected


# ------------------------------------------------------------------------------------ M14: the top member
def test_top_member_rows_are_each_samples_largest_weight_member_frame_major():
    weights = torch.tensor([[0.2, 0.8], [0.9, 0.1]], dtype=F64)
    # B = 2, frame-major rows i·B + b: sample 0's top member is i = 1 → row 2; sample 1's is i = 0 → row 1
    assert top_member_rows(weights).tolist() == [2, 1]


# ---------------------------------------------------------------------------- M16: softmax_gap temperature
def test_softmax_gap_weights_at_temperature_one_half_by_hand():
    scores = torch.tensor([[3.0, 1.0, 0.0]], dtype=F64)
    index, weights = top_k_weights(scores, 2, "softmax_gap", 0.5)
    assert index.tolist() == [[0, 1]]
    # w_i ∝ exp(s_i / T) − exp(b / T) with b = 0 the best score left out: [e⁶ − 1, e² − 1]
    raw = [math.exp(3.0 / 0.5) - 1.0, math.exp(1.0 / 0.5) - 1.0]
    expected = [r / sum(raw) for r in raw]
    assert expected == pytest.approx([0.98437, 0.01563], abs=1e-5)
    assert weights[0].tolist() == pytest.approx(expected, rel=TOL64, abs=TOL64)


@pytest.mark.parametrize("temperature", [0.25, 2.0])
def test_softmax_gap_gives_weight_zero_at_the_boundary_for_any_temperature(temperature):
    # the second member ties with the best left out (s_2 = b): its weight is exp(b/T) − exp(b/T) = 0
    scores = torch.tensor([[3.0, 1.0, 1.0, 0.0]], dtype=F64)
    _, weights = top_k_weights(scores, 2, "softmax_gap", temperature)
    assert weights[0].tolist() == pytest.approx([1.0, 0.0], abs=TOL64)


# ---------------------------------------------------------------------------------- M17: the sampled law
def _sampled_probabilities(monkeypatch, scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """The law ``discrete_frame`` hands to ``torch.multinomial`` for ``scores``, each row normalised (multinomial
    normalises its rows itself, so only the proportions within a row are the law)."""
    seen = []
    original = torch.multinomial

    def recording(probabilities, *args, **kwargs):
        seen.append(probabilities.detach().clone())
        return original(probabilities, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", recording)
    spec = FrameSpec.checked("sampled", 3, temperature, "gap")
    index, _, _ = discrete_frame(scores, spec)
    monkeypatch.setattr(torch, "multinomial", original)
    assert len(seen) == 1 and index.shape == (3, scores.shape[0])
    return seen[0] / seen[0].sum(dim=-1, keepdim=True)


def test_the_sampled_law_is_each_samples_own_softmax(monkeypatch):
    temperature = 1.0
    s0 = [2.0, 0.0, 0.0, 0.0]
    e2 = math.exp(2.0)
    expected0 = [e2 / (e2 + 3.0)] + [1.0 / (e2 + 3.0)] * 3  # softmax(s₀ / T) by hand: [0.711, 0.096, ...]
    assert expected0[0] == pytest.approx(0.7112, abs=1e-4)
    first = _sampled_probabilities(monkeypatch, torch.tensor([s0, [0.0, 0.0, 0.0, 5.0]], dtype=F64), temperature)
    assert first[0].tolist() == pytest.approx(expected0, rel=TOL64, abs=TOL64)
    e5 = math.exp(5.0)
    assert first[1].tolist() == pytest.approx([1 / (e5 + 3)] * 3 + [e5 / (e5 + 3)], rel=TOL64, abs=TOL64)
    # another sample's scores do not move sample 0's law
    second = _sampled_probabilities(monkeypatch, torch.tensor([s0, [4.0, -1.0, 0.0, 0.0]], dtype=F64), temperature)
    assert second[0].tolist() == pytest.approx(expected0, rel=TOL64, abs=TOL64)


# ------------------------------------------------------------ M18, M23: straight-through gradients by hand
def _softmax_jacobian_times(scores_row: list[float], temperature: float, a: list[float]) -> list[float]:
    """``(1/T)(diag p − p pᵀ) a`` with ``p = softmax(s / T)``, written out: ``(1/T) p_j (a_j − Σ_i p_i a_i)``."""
    exps = [math.exp(s / temperature) for s in scores_row]
    p = [e / sum(exps) for e in exps]
    mean = sum(pi * ai for pi, ai in zip(p, a, strict=True))
    return [pj * (aj - mean) / temperature for pj, aj in zip(p, a, strict=True)]


SCORES = [[0.3, -0.2, 1.1, 0.5], [2.0, 0.0, -1.0, 0.4], [0.0, 0.7, 0.1, -0.5]]
ANGLES = [0.0, 90.0, 180.0, 270.0]
#: float64 gradients of size ≲ 1e2 (angles in degrees): 1e-12 relative to the largest entry, i.e. ~4500 eps
#: of a few multiply-adds, well under the differences a wrong row or sign makes (O(1) or more).
GRAD_ABS = 1e-12 * 270.0


def test_sampled_straight_through_gradient_goes_to_its_own_sample():
    temperature = 0.5
    frame_size = 2
    scores = torch.tensor(SCORES, dtype=F64, requires_grad=True)
    spec = FrameSpec.checked("sampled", frame_size, temperature, "gap")
    torch.manual_seed(0)
    index, _, selection = discrete_frame(scores, spec, training_gradient=True)
    batch = scores.shape[0]
    assert selection.shape == (frame_size * batch, 4)
    # the angle of every member of sample 0 only (frame-major rows i·B + 0)
    angles = selection @ torch.tensor(ANGLES, dtype=F64)
    rows0 = torch.arange(frame_size) * batch
    # the forward is the hard pick (up to the rounding of ``+ soft − soft.detach()``, a few ulp of 270)
    assert angles[rows0].tolist() == pytest.approx([ANGLES[i] for i in index[:, 0].tolist()], abs=GRAD_ABS)
    angles[rows0].sum().backward()
    assert scores.grad[1:].abs().max().item() == 0.0
    one_member = _softmax_jacobian_times(SCORES[0], temperature, ANGLES)
    expected = [frame_size * g for g in one_member]  # each member carries the same soft row of sample 0
    assert scores.grad[0].tolist() == pytest.approx(expected, abs=GRAD_ABS)


def test_gcnn_straight_through_gradient_has_the_softmax_jacobian_sign(monkeypatch):
    temperature = 0.5
    h = GCNNCanonicalizer(num_rotations=4, temperature=temperature)
    h.train()
    assert h.element_angle_deg.tolist() == ANGLES
    scores = torch.tensor(SCORES, dtype=F64, requires_grad=True)
    monkeypatch.setattr(h, "scores", lambda images: scores)
    images = torch.zeros(3, 1, 28, 28, dtype=F64)
    _, g = h.canonicalize(images)
    assert g.index.tolist() == [2, 0, 1]  # argmax of each row
    g.angle_deg[0].backward()  # sample 0's angle only
    assert scores.grad[1:].abs().max().item() == 0.0
    expected = _softmax_jacobian_times(SCORES[0], temperature, ANGLES)
    assert scores.grad[0].tolist() == pytest.approx(expected, abs=GRAD_ABS)
    # sign by hand: raising the score of the 270° element raises the angle, of the 0° element lowers it
    assert expected[3] > 0 > expected[0]


# ------------------------------------------------------------- M19: the O(3) vector frame's ±e₃ weights
def test_the_o3_vector_frame_gives_the_gram_schmidt_e3_the_larger_weight():
    """``weighted_frame`` with ``group="O3"``: member ``e₃`` (the sign Gram–Schmidt takes from ``v₃``) weighs
    ``σ(2 |ẑ| / T)`` ≥ 1/2 and its flip ``−e₃`` weighs the rest, with ``ẑ`` the cosine of ``v₃`` and ``e₃``."""
    temperature = 0.5
    # rows v₁, v₂, v₃; the best pair is (v₁, v₂) (q ∝ ‖v₁ × v₂‖ ‖v₁‖ = 4, the next is (v₁, v₃) with 2.56), so
    # Gram–Schmidt gives e₁ = x̂, e₂ = ŷ and e₃ = ±ẑ with the sign of v₃'s z: +ẑ for sample 0, −ẑ for sample 1
    vectors = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.3, 0.4, 0.5]],
                            [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.3, 0.4, -0.5]]], dtype=F64)
    spec = FrameSpec.checked("weighted_frame", 1, temperature, "gap")
    rotations, weights = vector_frame(vectors, "O3", spec)
    cosine = 0.5 / math.sqrt(0.3**2 + 0.4**2 + 0.5**2)  # |ẑ| = 1/√2 for both samples
    kept = 1.0 / (1.0 + math.exp(-2.0 * cosine / temperature))
    assert kept == pytest.approx(0.94419, abs=1e-5)  # σ(2√2)
    eye = torch.eye(3, dtype=F64)
    flip = torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=F64))
    # frame-major rows i·B + b: members 0 (Gram–Schmidt's e₃) for both samples, then their flips
    expected = torch.stack([eye, flip, flip, eye])
    assert rotations.shape == (4, 3, 3)
    assert (rotations - expected).abs().max().item() < TOL64
    assert weights.tolist() == [pytest.approx([kept, 1.0 - kept], rel=TOL64, abs=TOL64)] * 2


# ------------------------------------------------------------------- M26, M27: the PCA axis by hand
def _pixel_image(points_xy: list[tuple[int, int]], size: int = 11) -> torch.Tensor:
    """A (1, size, size) float64 image with mass 1 at the given display coordinates (x right, y up, origin
    at the centre pixel: column x + c, row c − y with c = (size − 1)/2)."""
    image = torch.zeros(1, size, size, dtype=F64)
    c = (size - 1) // 2
    for x, y in points_xy:
        image[0, c - y, x + c] = 1.0
    return image


def test_pca_axis_and_skewness_by_hand_for_three_collinear_pixels_off_the_centre():
    """Three unit pixels at ``(2t, t − 3)``, ``t ∈ {−1, 0, 2}``: collinear along ``d = (2, 1)/√5``, so the
    principal axis of the *centred* covariance is ``atan2(1, 2)`` = 26.57° (an uncentred second moment would
    see the offset −3 and a wrong formula ``½ atan2(c_xy, c_xx − c_yy)`` gives 16.85°). The centred positions
    along ``d`` are ``√5 (t − 1/3)``, so the skew ``Σ u³ ∝ (−64 − 1 + 125)/27 > 0`` keeps ``+d`` and the
    skewness is ``60/190 = 6/19``. The mirror set ``t ∈ {1, 0, −2}`` has the opposite skew: ``d + 180°``."""
    line = [(2 * t, t - 3) for t in (-1, 0, 2)]
    mirror = [(2 * t, t - 3) for t in (1, 0, -2)]
    images = torch.stack([_pixel_image(line), _pixel_image(mirror)])
    angle, skewness = PCACanonicalizer().oriented_axis(images)
    axis = math.degrees(math.atan2(1.0, 2.0))
    assert axis == pytest.approx(26.56505, abs=1e-5)
    # sums of three O(10) terms, an atan2 and a rad2deg: a few ulp of 206° (~3e-14 each); the tolerance,
    # 3.6e-10°, is ~1e4 ulp, while an uncentred or mis-scaled covariance moves the axis by ≥ 9°
    assert angle.tolist() == pytest.approx([axis, axis + 180.0], abs=TOL64 * 360.0)
    assert skewness.tolist() == pytest.approx([6.0 / 19.0] * 2, rel=TOL64, abs=TOL64)


# ------------------------------------------------------------- M30: CN(OPT) keeps its lowest-energy start
def test_opt_keeps_the_final_angle_of_the_start_with_the_lowest_final_energy(monkeypatch):
    """θ* is the final angle of the start whose *final* energy is lowest (not the highest, not the lowest energy
    seen along the way), wrapped into [−π, π)."""
    h = OptimizationCanonicalizer(steps=2, num_starts=3).double()
    theta = torch.tensor([[0.1, 0.2, 0.3], [3.5, -0.4, 1.0]], dtype=F64)
    # (steps + 1, B, starts): sample 0's start 0 is lowest at step 0 but not at the end
    history = torch.tensor([[[-9.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
                            [[1.0, 0.0, 3.0], [0.0, 1.0, 2.0]],
                            [[5.0, -1.0, 2.0], [-2.0, 4.0, 0.5]]], dtype=F64)
    monkeypatch.setattr(h, "descend", lambda images: (theta, history))
    with torch.no_grad():
        chosen = h.optimal_angle_rad(torch.zeros(2, 1, 28, 28, dtype=F64))
    assert chosen.tolist() == pytest.approx([0.2, 3.5 - 2 * math.pi], abs=TOL64)
