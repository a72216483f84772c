"""Symmetrization over a small weighted set of group elements: the frames φ sums over (issue 38).

:class:`~canonical_network.canonicalization.base.CanonicalizedModel` computes, in one place,

    φ(x) = Σ_i w_i(x) · h_i'(x) · f(h_i(x)⁻¹ · x),      Σ_i w_i(x) = 1,

over the ``k`` pairs ``(h_i(x), w_i(x))`` of a :class:`Frame`. ``canonicalization.symmetrization`` says which
pairs a canonicalizer gives:

* ``canonical`` (default): the one element ``h(x)`` with weight 1 — the paper's Eq. (1), the same code path
  and the same numbers as before frames existed. 1 predictor pass.
* ``weighted_frame``: the ``k`` best elements (``frame_size``) with weights that are continuous in x and
  vanish where an element leaves the set — a *weighted frame* (Dym, Lawrence & Siegel, ICML 2024,
  "Equivariant Frames and the Impossibility of Continuous Canonicalization"). Where a canonicalization jumps
  (two candidates swap places), the weighted sum moves continuously. ``k`` predictor passes.
* ``sampled``: ``k`` elements drawn from the canonicalizer's distribution, equal weights ``1/k``
  (probabilistic symmetrization, Kim et al., NeurIPS 2023). Equivariant in distribution: the law of
  ``h(g·x)`` is ``g`` times the law of ``h(x)``, so ``E[φ(g·x)] = ρ(g) E[φ(x)]`` and one evaluation differs
  from its mean by ``O(σ / √k)``. ``k`` predictor passes.
* ``full``: every element of a finite group with weight ``1/|G|`` — frame averaging. Invariant (equivariant)
  whatever ``f`` and whatever the canonicalizer's weights. ``|G|`` predictor passes.

Each pass is one predictor call on a batch of ``k·B`` inputs (the frame's members stacked frame-major:
member ``i`` of sample ``b`` is row ``i·B + b``), so the cost of a mode is ``k`` times the predictor's, plus
what the canonicalizer needs to build its candidates (one network pass in every mode).

This module holds what the canonicalizers share to build their frames: the options (:class:`FrameSpec`),
the frame itself (:class:`Frame`), the continuous top-``k`` weights of a scored candidate set
(:func:`top_k_weights`) and the frames of the discrete (:func:`discrete_frame`) and vector-neuron
(:func:`vector_frame`) canonicalizers. Which modes each canonicalizer supports, and why the others are
refused, is in ``docs/symmetrization.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from canonical_network.utils.checks import check_choice, check_int, check_positive

#: ``canonicalization.symmetrization``
SYMMETRIZATIONS = ("canonical", "weighted_frame", "sampled", "full")
#: ``canonicalization.frame_weights``: how the weights of a weighted frame are built from candidate scores
FRAME_WEIGHTS = ("gap", "softmax_gap")

Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class FrameSpec:
    """The symmetrization options of a canonicalizer (the config keys of the same names, checked here).

    Attributes:
        mode: ``canonicalization.symmetrization``, one of :data:`SYMMETRIZATIONS`.
        size: ``canonicalization.frame_size``, ``k``: the candidates of ``weighted_frame``, the draws of
            ``sampled`` (``full`` takes the whole group; ``canonical`` one element).
        temperature: ``canonicalization.frame_temperature`` ``T``: ``sampled`` draws from
            ``softmax(scores / T)`` (discrete groups) or perturbs the vector-neuron frame by noise of ``T``
            times its vectors' mean norm; ``weighted_frame`` uses it in ``softmax_gap`` weights and in the
            O(3) handedness weights (:func:`vector_frame`).
        weights: ``canonicalization.frame_weights``, one of :data:`FRAME_WEIGHTS` (:func:`top_k_weights`).
    """

    mode: str = "canonical"
    size: int = 2
    temperature: float = 1.0
    weights: str = "gap"

    @classmethod
    def checked(cls, mode: Any, size: Any, temperature: Any, weights: Any) -> FrameSpec:
        return cls(
            mode=check_choice("canonicalization.symmetrization", mode, SYMMETRIZATIONS),
            size=check_int("canonicalization.frame_size", size, low=1),
            temperature=check_positive("canonicalization.frame_temperature", temperature),
            weights=check_choice("canonicalization.frame_weights", weights, FRAME_WEIGHTS),
        )

    def with_mode(self, mode: str, size: int | None = None) -> FrameSpec:
        return dataclasses.replace(self, mode=mode, size=self.size if size is None else size)


@dataclass
class Frame:
    """``k`` weighted members ``(h_i(x), w_i(x))`` per sample and the inputs each member maps to its pose.

    Attributes:
        canonical: the predictor's inputs, each ``(k·B, ...)`` frame-major (row ``i·B + b`` is
            ``h_i(x_b)⁻¹ · x_b``); inputs the group leaves alone are repeated.
        elements: the ``k·B`` group elements in the same order (what ``invert`` maps the outputs back by);
            ``None`` for the trivial group.
        weights: ``(B, k)``, ≥ 0, rows summing to 1.
        element: one element per sample, ``B`` of them: the member of largest weight (the first on ties), the
            one the canonicalization prior and the identity rate are read from (``tasks/base.py``).
    """

    canonical: Inputs
    elements: Any
    weights: torch.Tensor
    element: Any

    @property
    def size(self) -> int:
        """``k``: members per sample, i.e. the predictor passes the frame costs."""
        return self.weights.shape[1]


def repeat_inputs(inputs: Inputs, k: int) -> Inputs:
    """Every input ``(B, ...)`` repeated ``k`` times along the batch, frame-major: ``(k·B, ...)``."""
    return tuple(x.repeat(k, *([1] * (x.dim() - 1))) for x in inputs)


def select_elements(elements: Any, rows: torch.Tensor) -> Any:
    """The elements at ``rows`` (int64 indices into the batch of ``elements``): every tensor field indexed
    along dim 0, nested elements (a product's factors) recursively, ``None`` kept."""
    if elements is None:
        return None
    if torch.is_tensor(elements):
        return elements[rows.to(elements.device)]
    if dataclasses.is_dataclass(elements):
        return dataclasses.replace(elements, **{f.name: select_elements(getattr(elements, f.name), rows)
                                               for f in dataclasses.fields(elements)})
    if isinstance(elements, tuple) and hasattr(elements, "_fields"):  # NamedTuple (EuclideanTransform)
        return type(elements)(*(select_elements(value, rows) for value in elements))
    raise TypeError(f"cannot select from a group element of type {type(elements).__name__}")


def top_member_rows(weights: torch.Tensor) -> torch.Tensor:
    """``(B,)`` rows of the frame-major ``k·B`` batch holding each sample's largest-weight member."""
    batch = weights.shape[0]
    return weights.argmax(dim=1) * batch + torch.arange(batch, device=weights.device)


def uniform_weights(batch: int, k: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full((batch, k), 1.0 / k, dtype=like.dtype, device=like.device)


def top_k_weights(
    scores: torch.Tensor, k: int, construction: str, temperature: float, floor: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The continuous weights of the ``k`` best candidates: ``(index (B, k), weights (B, k))``.

    ``scores`` ``(B, M)``: one score per candidate, higher is better. With ``s_(j)`` the ``j``-th largest
    score and ``b = s_(k+1)`` the best score left out (``floor`` when every candidate is in, ``k ≥ M``):

    * ``gap``: ``w_i ∝ s_i − b`` — linear in the scores;
    * ``softmax_gap``: ``w_i ∝ exp(s_i / T) − exp(b / T)`` — the selection probabilities minus the one left
      out; close to the top candidate alone for small ``T``.

    Continuity. Each ``w_i`` is a continuous function of the scores (order statistics are continuous, and a
    candidate ranked ``j ≤ k`` has ``s_i ≥ b``), and it is 0 when ``s_i = b``: a candidate enters or leaves the
    set with weight 0, so the weighted sum over the set does not jump when two candidates swap ranks ``k``
    and ``k + 1``. The normalised weights are continuous wherever ``s_(1) > b``, i.e. except where the
    ``k + 1`` best scores all tie; there (a set of codimension ``k``) they fall back to ``1/k`` each. For
    ``k = 1`` that is the set where the top two tie — the canonicalization's own discontinuity: a single
    element cannot move continuously between two candidates.

    Equivariance. If ``g`` permutes the candidates and their scores, the same values come out of
    :func:`torch.topk`, so the members and weights are permuted alike; a tie at the boundary picks either
    candidate, both with weight 0. With ``floor=None`` and ``k ≥ M`` every candidate gets ``1/M`` (the full
    frame), ordered by score so that the first member is the canonical element.
    """
    count = scores.shape[1]
    if k >= count and floor is None:  # every candidate, best first (so the first member is the argmax)
        return scores.topk(count, dim=1).indices, uniform_weights(scores.shape[0], count, scores)
    taken = min(k, count)
    top = scores.topk(min(taken + 1, count), dim=1)
    index = top.indices[:, :taken]
    best = top.values[:, :taken]
    left_out = top.values[:, taken:taken + 1] if taken < count else torch.full_like(best[:, :1], float(floor))
    if construction == "gap":
        raw = best - left_out
    else:  # softmax_gap, shifted by the top score so that nothing overflows
        shift = best[:, :1]
        raw = ((best - shift) / temperature).exp() - ((left_out - shift) / temperature).exp()
    raw = raw.clamp_min(0)
    total = raw.sum(dim=1, keepdim=True)
    positive = total > 0
    weights = torch.where(positive, raw / torch.where(positive, total, torch.ones_like(total)), 1.0 / taken)
    return index, weights


def discrete_frame(
    scores: torch.Tensor, spec: FrameSpec, training_gradient: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The members of a frame over a finite group scored element by element (C_N, D_N).

    Args:
        scores: ``(B, |G|)``, one per group element, permuted by the group's action on the input.
        spec: the mode and its options (``canonical`` is not built here).
        training_gradient: ``sampled`` only: give the drawn elements the straight-through gradient of
            ``softmax(scores / T)`` (the estimator of the ``ste`` selection).

    Returns:
        ``(index, weights, selection)``: ``index`` ``(k, B)`` int64, the members' element indices,
        frame-major; ``weights`` ``(B, k)``; ``selection`` ``(k·B, |G|)`` one-hot rows selecting each member
        (with the straight-through term for ``sampled`` in training), which the canonicalizer turns into
        elements (``weights @ angles``).

    * ``full``: every element, weight ``1/|G|``;
    * ``weighted_frame``: :func:`top_k_weights` of the scores;
    * ``sampled``: ``k`` independent draws from ``softmax(scores / T)``.
    """
    batch, order = scores.shape
    if spec.mode == "full":
        index, weights = top_k_weights(scores, order, spec.weights, spec.temperature)
    elif spec.mode == "weighted_frame":
        index, weights = top_k_weights(scores, spec.size, spec.weights, spec.temperature)
    elif spec.mode == "sampled":
        probabilities = (scores / spec.temperature).softmax(dim=-1)
        index = torch.multinomial(probabilities.detach(), spec.size, replacement=True)
        weights = uniform_weights(batch, spec.size, scores)
    else:
        raise ValueError(f"discrete_frame builds weighted_frame, sampled or full frames, not {spec.mode!r}")
    index = index.t().contiguous()  # (k, B)
    selection = torch.nn.functional.one_hot(index.reshape(-1), order).to(scores.dtype)
    if spec.mode == "sampled" and training_gradient:
        soft = (scores / spec.temperature).softmax(dim=-1).repeat(index.shape[0], 1)
        selection = selection + soft - soft.detach()
    return index, weights, selection


#: ordered pairs (first axis, second axis, remaining vector) of the three frame vectors, the candidates of a
#: vector-neuron weighted frame
VECTOR_PAIRS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))


def pair_qualities(vectors: torch.Tensor) -> torch.Tensor:
    """``(B, 6)``: how well each ordered pair ``(a, b)`` of :data:`VECTOR_PAIRS` defines the first two axes.

    ``q_ab = ‖v_a × v_b‖ · ‖v_a‖ / (Σ_j ‖v_j‖)³`` for ``vectors`` ``(B, 3, 3)`` (rows): invariant to O(3) and
    to the vectors' common scale, in ``[0, 1]``, and 0 exactly where Gram–Schmidt on ``(v_a, v_b)`` is
    undefined (``v_a = 0`` or ``v_b ∥ v_a``). The factor ``‖v_a‖`` breaks the tie between ``(a, b)`` and
    ``(b, a)``: the pair led by the longer vector ranks first.
    """
    norms = vectors.norm(dim=-1)  # (B, 3)
    total = norms.sum(dim=-1).clamp_min(torch.finfo(vectors.dtype).tiny)
    columns = []
    for a, b, _ in VECTOR_PAIRS:
        columns.append(torch.linalg.cross(vectors[:, a], vectors[:, b], dim=-1).norm(dim=-1) * norms[:, a])
    return torch.stack(columns, dim=1) / total.unsqueeze(-1) ** 3


def vector_frame(vectors: torch.Tensor, group: str, spec: FrameSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotations of a vector-neuron canonicalizer's frame: ``(rotations (k·B, 3, 3), weights (B, k))``.

    ``vectors`` ``(B, 3, 3)`` are the three pooled equivariant vectors (rows; ``v ↦ v Qᵀ`` under ``Q``) that
    the canonical mode hands to :func:`~canonical_network.groups.euclidean.gram_schmidt` in the order
    ``(v₁, v₂, v₃)``; ``group`` is that Gram–Schmidt's (``"SO3"``: ``e₃ = e₁ × e₂``; ``"O3"``: ``e₃`` from ``v₃``).

    * ``sampled``: ``k`` draws of Gram–Schmidt on ``v + σ ε`` with ``ε`` i.i.d. standard Gaussian vectors
      and ``σ = T ·`` the mean norm of the three vectors. ``σ`` is invariant and the isotropic Gaussian is
      O(3)-invariant in law (``ε Qᵀ ~ ε``), so ``h(g·x)`` has the law of ``Q h(x)``: equivariant in
      distribution, exactly (no rounding argument needed for the law).
    * ``weighted_frame``: the candidates are Gram–Schmidt on each ordered pair ``(v_a, v_b)`` of
      :data:`VECTOR_PAIRS` (the remaining vector third), each exactly equivariant; their weights are
      :func:`top_k_weights` of :func:`pair_qualities` with floor 0 (with ``k ≥ 6`` every pair, ``w ∝ q``).
      A candidate is discontinuous only where its quality is 0, where its weight is 0 already, so the
      weighted sum is continuous wherever the three vectors span at least a plane — the one place the
      canonical frame jumps besides that is the choice of the pair (``v₁, v₂`` parallel), which this removes.
      For ``group="O3"`` the third axis's sign is the frame's other jump (the remaining vector crossing the
      plane of the first two): each pair gives two members, ``e₃`` and ``−e₃``, weighted
      ``σ(±2 |ẑ| / T)`` with ``ẑ`` the cosine between the remaining vector and ``e₃``: at the crossing both
      weigh 1/2, so the sum is continuous there too, and a reflection maps the pair of members onto itself
      with the weights exchanged (exact for the reflection part). O(3) frames therefore have ``2k``
      members. What stays discontinuous: all three vectors parallel or zero (no frame exists there, paper
      Appendix A), and ties of the ``k + 1`` best qualities (:func:`top_k_weights`). The canonicalizer's own
      vectors are continuous in the input only up to its kNN graph (``canonicalization/pointcloud.py``).
    """
    from canonical_network.groups.euclidean import gram_schmidt

    batch = vectors.shape[0]
    if spec.mode == "sampled":
        k = spec.size
        sigma = spec.temperature * vectors.norm(dim=-1).mean(dim=-1)  # (B,), invariant
        noise = torch.randn(k, *vectors.shape, dtype=vectors.dtype, device=vectors.device)
        perturbed = (vectors.unsqueeze(0) + sigma.view(1, batch, 1, 1) * noise).reshape(k * batch, 3, 3)
        return gram_schmidt(perturbed.transpose(1, 2), group), uniform_weights(batch, k, vectors)
    if spec.mode != "weighted_frame":
        raise ValueError(f"vector_frame builds weighted_frame or sampled frames, not {spec.mode!r}")
    index, weights = top_k_weights(pair_qualities(vectors), spec.size, spec.weights, spec.temperature, floor=0.0)
    k = index.shape[1]
    order = torch.tensor(VECTOR_PAIRS, device=vectors.device)[index.t().reshape(-1)]  # (k·B, 3)
    ordered = vectors.repeat(k, 1, 1).gather(1, order.unsqueeze(-1).expand(-1, -1, 3))  # rows v_a, v_b, v_c
    rotations = gram_schmidt(ordered.transpose(1, 2), group)  # (k·B, 3, 3), frame-major
    if group == "SO3":
        return rotations, weights
    remaining = ordered[:, 2]
    cosine = (remaining * rotations[:, :, 2]).sum(-1).abs() / remaining.norm(dim=-1).clamp_min(
        torch.finfo(vectors.dtype).tiny)
    kept = torch.sigmoid(2 * cosine / spec.temperature).view(k, batch).t()  # (B, k): weight of +e₃
    flipped = rotations * torch.tensor([1.0, 1.0, -1.0], dtype=rotations.dtype, device=rotations.device)
    both = torch.cat([rotations, flipped])  # members 0..k-1 keep e₃, k..2k-1 flip it
    return both, torch.cat([weights * kept, weights * (1 - kept)], dim=1)


__all__ = [
    "FRAME_WEIGHTS",
    "SYMMETRIZATIONS",
    "VECTOR_PAIRS",
    "Frame",
    "FrameSpec",
    "discrete_frame",
    "pair_qualities",
    "repeat_inputs",
    "select_elements",
    "top_k_weights",
    "top_member_rows",
    "uniform_weights",
    "vector_frame",
]
