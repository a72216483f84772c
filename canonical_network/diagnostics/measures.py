"""The measures of a diagnosis: equivariance of φ, equivariance of h alone, the distribution of the chosen
poses, and continuity under small perturbations; for a canonicalizer with an S_n factor, the same questions
about its order (:func:`permutation_measures`: permutations alone, ties of the scores, jitter).

Every error is **relative, per input sample**: ``‖a − b‖ / ‖φ(x)‖`` with ``‖·‖`` the Euclidean (Frobenius)
norm of one sample's whole output — all class logits, all ``N × 3`` predicted positions, all ``P × parts``
part logits. For the canonicalizer the norm is the Frobenius norm of its ``(d, d)`` matrices (``√d`` for an
orthogonal one), and its translations are measured relative to the input's RMS radius. The figures of a
measure are the maximum and the mean over inputs × sampled elements.

All functions take the task LightningModule (``model.network`` is the
:class:`~canonical_network.canonicalization.base.CanonicalizedModel`), in eval mode, and run without
gradients; the dtype is whatever the model and inputs are in (the CLI uses float64, see
:mod:`canonical_network.diagnose`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from canonical_network.canonicalization.permutation import PermutationCanonicalizer
from canonical_network.canonicalization.product import ProductCanonicalizer
from canonical_network.diagnostics.symmetries import Inputs, SampledElement, Symmetry
from canonical_network.groups.euclidean import apply_rotation
from canonical_network.groups.image import PlanarElement, element_angles_deg, planar_group
from canonical_network.groups.permutation import PermutationElement, random_permutations
from canonical_network.groups.product import ProductElement

#: how the relative errors are normalised, written into diagnostics.json
NORM = ("‖φ(g·x) − ρ(g)φ(x)‖ / ‖φ(x)‖ per input, ‖·‖ the Euclidean norm of one sample's whole output "
        "(all logits, all N×3 positions, all P×parts part logits)")


def sample_norm(x: torch.Tensor) -> torch.Tensor:
    """``(B,)`` Euclidean norm of each sample of ``x`` ``(B, ...)``."""
    return x.flatten(1).norm(dim=1)


def relative(actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``‖actual − expected‖ / ‖reference‖`` per sample, ``(B,)``."""
    return sample_norm(actual - expected) / sample_norm(reference).clamp_min(torch.finfo(reference.dtype).tiny)


def summary(values: torch.Tensor) -> dict[str, float]:
    """``{"max_rel", "mean_rel"}`` of a tensor of relative errors."""
    return {"max_rel": float(values.max()), "mean_rel": float(values.mean())}


def entropy_bits(counts: torch.Tensor) -> float:
    """Shannon entropy (bits) of a histogram."""
    p = counts.double() / counts.sum().clamp_min(1)
    p = p[p > 0]
    return float(-(p * p.log2()).sum())


def coordinate_element(element):
    """The part of ``h(x)`` that acts on coordinates, which the pose, canonicalizer and continuity measures
    compare through ``matrix()``: the element itself, a product's factors other than S_n (``E(3)×S_n`` → its
    E(3) element), or ``None`` for an S_n element alone (it reorders the elements, it has no coordinate
    action; :func:`permutation_measures` measures it)."""
    if isinstance(element, PermutationElement):
        return None
    if isinstance(element, ProductElement):
        parts = [p for p in (coordinate_element(element.first), coordinate_element(element.second)) if p is not None]
        if len(parts) > 1:
            raise ValueError("a product of two coordinate groups has no single coordinate element to diagnose")
        return parts[0] if parts else None
    return element


@dataclass
class Diagnosis:
    """What :func:`diagnose` found: ``results`` (JSON-ready, the body of ``diagnostics.json``) and the tensors
    the figures draw."""

    results: dict
    inputs: Inputs
    canonical: Inputs
    exact: list[tuple[SampledElement, Inputs]]
    exact_errors: torch.Tensor  # (elements, B)
    pose_angles_deg: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)


def equivariance(model, symmetry: Symmetry, output: torch.Tensor,
                 moved: list[tuple[SampledElement, Inputs]]) -> tuple[dict | None, torch.Tensor | None]:
    """``φ(g·x)`` against ``ρ(g)φ(x)`` for every ``(g, g·x)`` of ``moved``: the JSON summary (with the figures
    of each element under ``by_element``) and the errors ``(elements, B)``; ``(None, None)`` if ``moved`` is
    empty."""
    if not moved:
        return None, None
    errors, by_element = [], {}
    for g, inputs_moved in moved:
        error = relative(model(*inputs_moved), symmetry.act_output(g, output), output)
        by_element[g.label] = summary(error)
        errors.append(error)
    errors = torch.stack(errors)
    return {**summary(errors), "num_elements": len(moved), "num_inputs": errors.shape[1],
            "by_element": by_element}, errors


def _nearest_index(matrices: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Index of the nearest (Frobenius) matrix of ``table`` ``(|G|, d, d)`` to each of ``matrices`` ``(B, d, d)``."""
    distances = (matrices.unsqueeze(1) - table.unsqueeze(0)).flatten(2).norm(dim=-1)
    return distances.argmin(dim=1)


def _finite_table(group_name: str, like: torch.Tensor) -> torch.Tensor | None:
    """The ``(|G|, 2, 2)`` matrices of a finite planar group's elements, in escnn's order (the canonicalizers'
    ``index``), or ``None`` for other groups."""
    finite = planar_group(group_name)
    if finite is None:
        return None
    angles, reflect = element_angles_deg(*finite)
    return PlanarElement(angle_deg=angles.to(like), reflect=reflect.to(like)).matrix()


def canonicalizer_equivariance(model, symmetry: Symmetry, inputs: Inputs, element,
                               moved: list[tuple[SampledElement, Inputs]]) -> dict | None:
    """Is ``h(g·x) = g·h(x)``? Compares ``h(g·x).matrix()`` with ``g.matrix() @ h(x).matrix()`` (relative to
    ``‖h(x).matrix()‖_F``), translations with ``Q t + s`` (relative to the input's RMS radius), and for finite
    planar groups the chosen index with the index of ``g·h(x)``. ``None`` for the identity canonicalizer and
    for one without a coordinate factor (S_n alone); ``element`` is :func:`coordinate_element`'s."""
    if element is None:
        return None
    h = model.canonicalizer
    matrix = element.matrix()
    table = _finite_table(h.group_name, matrix)
    scale = symmetry.length_scale(inputs)
    matrix_errors, translation_errors, mismatches = [], [], []
    for g, inputs_moved in moved:
        if g.matrix.shape[-2:] != matrix.shape[-2:]:
            raise ValueError(f"{type(h).__name__} returns {tuple(matrix.shape[-2:])} matrices, but the "
                             f"{symmetry.family} diagnosis acts on {tuple(g.matrix.shape[-2:])} coordinates")
        element_moved = coordinate_element(model.network.canonicalize(*inputs_moved)[1])
        expected = g.matrix @ matrix
        matrix_errors.append(relative(element_moved.matrix(), expected, matrix))
        translation = getattr(element, "translation", None)
        if translation is not None and scale is not None:
            expected_t = apply_rotation(translation, g.matrix)
            if g.translation is not None:
                expected_t = expected_t + g.translation
            error = (element_moved.translation - expected_t).norm(dim=-1)
            translation_errors.append(error / scale.clamp_min(torch.finfo(scale.dtype).tiny))
        index_moved = h.group_element_index(element_moved)
        if table is not None and index_moved is not None:
            mismatches.append(index_moved != _nearest_index(expected, table))
    errors = torch.stack(matrix_errors)
    return {
        "group": h.group_name,
        **summary(errors),
        "compared": "h(g·x).matrix() vs g.matrix() @ h(x).matrix(), relative to ‖h(x).matrix()‖_F",
        "translation_max_rel": float(torch.stack(translation_errors).max()) if translation_errors else None,
        "index_mismatch_rate": float(torch.stack(mismatches).float().mean()) if mismatches else None,
    }


def rotation_angles_deg(matrices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation angle (deg) of each matrix and whether it reflects.

    2-D ``(B, 2, 2)`` (rotation ∘ flip^r, :class:`~canonical_network.groups.image.PlanarElement`): the angle of
    the rotation part, read from the second column (the flip changes only the first), in [0, 360). 3-D
    ``(B, 3, 3)``: for ``R`` with det −1 its rotation part ``−R`` (in 3-D, ``−I`` commutes with everything),
    then ``θ = arccos((tr R − 1) / 2)`` in [0, 180].
    """
    if matrices.shape[-1] == 2:
        angle = torch.rad2deg(torch.atan2(-matrices[..., 0, 1], matrices[..., 1, 1])) % 360.0
        reflect = torch.linalg.det(matrices) < 0
        return angle, reflect
    det = torch.linalg.det(matrices)
    proper = matrices * det.sign().view(-1, 1, 1)
    trace = proper.diagonal(dim1=-2, dim2=-1).sum(-1)
    return torch.rad2deg(torch.arccos(((trace - 1) / 2).clamp(-1.0, 1.0))), det < 0


def pose(model, inputs: Inputs, element, margin: float, bins: int) -> tuple[dict | None, torch.Tensor | None]:
    """The distribution of the chosen elements ``h(x)`` over the inputs (``None`` for the identity).

    Finite groups: the histogram of ``group_element_index``, its entropy in bits (``log₂|G|`` when every
    element is chosen equally often), and ``ambiguity_rate``, the share of inputs whose two best canonicalizer
    scores are within ``margin`` × the standard deviation of that input's scores over the group (only for
    canonicalizers with a ``scores`` method, else ``None``). Continuous groups: the histogram of rotation
    angles (:func:`rotation_angles_deg`) in ``bins`` bins, its entropy, and the share of reflections.
    """
    if element is None:
        return None, None
    h = model.canonicalizer
    index = h.group_element_index(element)
    angles, reflect = rotation_angles_deg(element.matrix())
    if index is not None:
        finite = planar_group(h.group_name)
        order = finite[0] * (2 if finite[1] else 1) if finite else int(index.max()) + 1
        counts = torch.bincount(index.cpu(), minlength=order)
        ambiguity = None
        if callable(getattr(h, "scores", None)):
            scores = h.scores(*inputs)
            top = scores.topk(2, dim=-1).values
            spread = scores.std(dim=-1).clamp_min(torch.finfo(scores.dtype).tiny)
            ambiguity = float(((top[:, 0] - top[:, 1]) <= margin * spread).float().mean())
        result = {
            "kind": "finite", "group": h.group_name, "order": order, "histogram": counts.tolist(),
            "entropy_bits": entropy_bits(counts), "max_entropy_bits": math.log2(order),
            "ambiguity_rate": ambiguity, "margin": margin,
            "margin_definition": "top score − second score ≤ margin × std of the input's scores over the group",
        }
        return result, angles
    top = 360.0 if element.matrix().shape[-1] == 2 else 180.0
    counts = torch.histc(angles.double().cpu(), bins=bins, min=0.0, max=top)
    degenerate = getattr(element, "degenerate", None)
    return {
        "kind": "continuous", "group": h.group_name, "quantity": "rotation angle (deg)" + (
            ", 3-D: arccos((tr R − 1)/2) of the rotation part" if top == 180.0 else ""),
        "bin_edges_deg": torch.linspace(0.0, top, bins + 1).tolist(), "histogram": counts.long().tolist(),
        "entropy_bits": entropy_bits(counts), "max_entropy_bits": math.log2(bins),
        "reflection_rate": float(reflect.float().mean()), "ambiguity_rate": None,
        # inputs for which no equivariant frame exists (the element fell back to a fixed axis): there the model
        # is equivariant only up to the input's stabilizer (groups/euclidean.py: EuclideanTransform.degenerate)
        "degenerate_rate": None if degenerate is None else float(degenerate.float().mean()),
        "degenerate_definition": "share of inputs whose frame took a fixed fallback axis (no equivariant frame: "
                                 "the input is fixed by some rotations or reflections)",
    }, angles


def continuity(model, symmetry: Symmetry, inputs: Inputs, output: torch.Tensor, element, jump: float,
               generator: torch.Generator) -> dict:
    """How much the output moves under small perturbations (:meth:`Symmetry.perturbations`).

    Per perturbation ``x′`` (a small group element ``g`` or a jitter, ``g = e``): ``Δ = ‖φ(x′) − ρ(g)φ(x)‖ /
    ‖φ(x)‖`` (the change beyond what equivariance predicts), its max and mean, ``jump_rate`` (share of
    inputs with ``Δ > jump``) and ``element_change_rate`` (share whose chosen element changes: another index
    for finite groups; ``‖h(x′) − g·h(x)‖_F / ‖h(x)‖_F > jump`` for continuous ones; ``None`` for the
    identity). The top-level figures pool every perturbation (rates: inputs affected by any).

    Where the element is known, the jump rate is split in two: ``jump_with_element_change_rate`` (the output
    jumps and the chosen element changes) and ``jump_without_element_change_rate`` (the output jumps under the
    same element). They sum to ``jump_rate``. In the canonical mode the first is the canonicalization's own
    discontinuity, the part a weighted frame is built to remove, and the second the predictor's own
    sensitivity to the perturbation; for a frame (element: its member of largest weight), jumps under the same
    leading member come from its other members or from weights that move steeply.

    A model with ``symmetrization=sampled`` draws its frame anew at every pass, so two passes differ even on
    the same input. Its perturbations are therefore compared at common random numbers (the global RNG seeded
    alike before ``φ(x)`` and each ``φ(x′)``: the continuity of one draw), and a part ``redraw`` gives the
    change between two draws on the same input (its own figures, not pooled into the top level). Under a
    rotation the common draw is not turned with the input, so that part also holds the mode's departure from
    exact equivariance for one draw (it is equivariant in distribution only).
    """
    h = model.canonicalizer
    draws = getattr(h, "symmetrization", "canonical") == "sampled"

    def call(*x: torch.Tensor, draw: int = 0) -> torch.Tensor:
        if not draws:
            return model(*x)
        with torch.random.fork_rng(devices=[output.device] if output.device.type == "cuda" else []):
            torch.manual_seed(draw)
            return model(*x)

    if draws:
        output = call(*inputs)
    index = None if element is None else h.group_element_index(element)
    parts, changes, jumped, switched = {}, [], [], []
    for name, (g, perturbed) in symmetry.perturbations(inputs, generator).items():
        change = relative(call(*perturbed), output if g is None else symmetry.act_output(g, output), output)
        part = {**summary(change), "jump_rate": float((change > jump).float().mean()), "element_change_rate": None}
        label = g.label if g is not None else f"jitter {symmetry.jitter:g} × the input's size"
        if element is not None:
            element_p = coordinate_element(model.network.canonicalize(*perturbed)[1])
            if index is not None:
                changed = h.group_element_index(element_p) != index
            else:
                expected = element.matrix() if g is None else g.matrix @ element.matrix()
                changed = relative(element_p.matrix(), expected, element.matrix()) > jump
            part.update(_jumps_by_element_change(change > jump, changed))
            switched.append(changed)
        parts[name] = {"perturbation": label, **part}
        changes.append(change)
        jumped.append(change > jump)
    if draws:
        change = relative(call(*inputs, draw=1), output, output)
        parts["redraw"] = {"perturbation": "a second draw of the sampled frame, the same input", **summary(change),
                           "jump_rate": float((change > jump).float().mean()), "element_change_rate": None}
    changes = torch.stack(changes)
    any_jump = torch.stack(jumped).any(dim=0)
    pooled = {"jump_rate": float(any_jump.float().mean()), "element_change_rate": None}
    if switched:  # pooled: an input counts as switched when its element changes under any perturbation
        pooled.update(_jumps_by_element_change(any_jump, torch.stack(switched).any(dim=0)))
    return {**summary(changes), "jump": jump, **pooled, "by_perturbation": parts}


def _jumps_by_element_change(jumped: torch.Tensor, changed: torch.Tensor) -> dict:
    """``element_change_rate`` and the jump rate split by whether the chosen element changed (``(B,)`` bools)."""
    changed = changed.to(jumped.device)
    return {"element_change_rate": float(changed.float().mean()),
            "jump_with_element_change_rate": float((jumped & changed).float().mean()),
            "jump_without_element_change_rate": float((jumped & ~changed).float().mean())}


#: the rounding allowance of a score, in units of ``eps · S`` (``S`` the read-out's absolute terms, below): a
#: score is the dot product ``Σ_j w_j y_j`` of the read-out with features ``y`` that the Deep Sets layers
#: compute to a relative accuracy of ``ρ eps`` (each layer's sums of ``width`` and ``n`` terms, amplified
#: by the layers' conditioning), so ``|δs| ≤ (ρ + width) eps Σ_j |w_j y_j|`` (Higham, *Accuracy and
#: Stability of Numerical Algorithms*, §3.1). 2¹³ covers ρ + width for the configured scorers (2–4 layers of
#: 32–64 units, sums of up to 1,024 elements) with room for a conditioning of ~10 per layer; it is the
#: allowance tests/helpers.py uses for deep float64 networks (``DEEP_TERMS``). Two scores of different
#: elements closer than that are ordered by rounding: a permutation of the input (another summation order
#: in the mean pooling) may swap them.
SCORE_ROUNDING_TERMS = 2.0**13


def permutation_factor(canonicalizer, inputs: Inputs) -> tuple[PermutationCanonicalizer, Inputs] | None:
    """The S_n canonicalizer inside ``canonicalizer`` (itself, or a factor of a product, however nested) and
    the inputs it reads (for ``E(3)×S_n``: the first factor's canonical inputs); ``None`` without one."""
    if isinstance(canonicalizer, PermutationCanonicalizer):
        return canonicalizer, inputs
    if isinstance(canonicalizer, ProductCanonicalizer):
        found = permutation_factor(canonicalizer.first, inputs)
        if found is not None:
            return found
        return permutation_factor(canonicalizer.second, canonicalizer.first.canonicalize(*inputs)[0])
    return None


def has_permutation_factor(canonicalizer) -> bool:
    """Whether ``canonicalizer`` is, or has a factor that is, a :class:`PermutationCanonicalizer`."""
    if isinstance(canonicalizer, ProductCanonicalizer):
        return has_permutation_factor(canonicalizer.first) or has_permutation_factor(canonicalizer.second)
    return isinstance(canonicalizer, PermutationCanonicalizer)


def _order(model, inputs: Inputs) -> torch.Tensor:
    """``(B, n)``: the order the S_n factor picks for ``inputs`` (``perm[b, k]`` = the element at position k)."""
    factor, factor_inputs = permutation_factor(model.canonicalizer, inputs)
    return factor.canonicalize(*factor_inputs)[1].perm


def score_ties(factor: PermutationCanonicalizer, factor_inputs: Inputs, margin: float) -> dict:
    """How close the S_n factor is to a tie on each input (the ambiguity of its order).

    Per input, the scores sorted ascending and the gaps between consecutive ones (consecutive positions are
    always two different elements of the set):

    * ``ambiguity_rate``: share of inputs with a gap ≤ ``SCORE_ROUNDING_TERMS · eps · S``, ``S`` =
      ``max_i Σ_j |w_j y_ij|`` (the read-out's absolute terms, which bound ``|s_i|``), ``eps`` the diagnosis
      dtype's: the order of those two elements is decided by rounding (see :data:`SCORE_ROUNDING_TERMS`).
      It counts ties of *identical* elements too (equal features give equal scores, ordered by their index):
      for per-element outputs they matter, since which of two identical elements receives which of ``f``'s
      two (generally different) outputs then depends on their index, and φ is equivariant only up to their
      swap (the stabiliser; the paper's relaxed equivariance, Appendix A);
    * ``ambiguity_rate_distinct``: the same, counting only gaps between elements whose features differ
      (what matters for invariant outputs: identical elements are the same numbers in either order);
    * ``duplicate_rate``: share of inputs with two elements of identical features (what the scorer reads);
    * ``near_tie_rate``: share with a gap ≤ ``margin`` × the std of the input's scores (as
      ``pose.ambiguity_rate``): close to a flip under a small perturbation, not under rounding;
    * ``min_gap_over_std``: the smallest gap over the std of the scores, min and median over inputs.
    """
    features = factor.element_features(*factor_inputs)
    y = factor.hidden_features(*factor_inputs)
    terms = (y * factor.readout.weight.squeeze(0)).abs().sum(-1)  # (B, n): Σ_j |w_j y_ij|
    scores = factor.readout(y).squeeze(-1)
    ranked, order = scores.sort(dim=-1, stable=True)
    gaps = ranked.diff(dim=-1)  # (B, n − 1), ≥ 0
    eps = torch.finfo(scores.dtype).eps
    threshold = SCORE_ROUNDING_TERMS * eps * terms.amax(dim=-1)  # (B,)
    tied = gaps <= threshold.unsqueeze(-1)
    ordered = features.gather(1, order.unsqueeze(-1).expand_as(features))
    identical_neighbours = (ordered[:, 1:] == ordered[:, :-1]).all(dim=-1)
    duplicates = torch.tensor([len(torch.unique(f, dim=0)) < len(f) for f in features], device=scores.device)
    spread = scores.std(dim=-1).clamp_min(torch.finfo(scores.dtype).tiny)
    min_gap = gaps.amin(dim=-1) / spread
    return {
        "ambiguity_rate": float(tied.any(dim=-1).float().mean()),
        "ambiguity_rate_distinct": float((tied & ~identical_neighbours).any(dim=-1).float().mean()),
        "duplicate_rate": float(duplicates.float().mean()),
        "near_tie_rate": float((gaps <= margin * spread.unsqueeze(-1)).any(dim=-1).float().mean()),
        "margin": margin,
        "min_gap_over_std": {"min": float(min_gap.min()), "median": float(min_gap.median())},
        "threshold_max": float(threshold.max()),
        "threshold_definition": f"consecutive sorted scores within {SCORE_ROUNDING_TERMS:g} · eps · "
                                "max_i Σ_j |w_j y_ij| (read-out weights w, last Deep Sets features y; eps of "
                                f"{str(scores.dtype).removeprefix('torch.')}): ordered by rounding",
    }


def permutation_measures(model, symmetry: Symmetry, inputs: Inputs, output: torch.Tensor, *, num_elements: int,
                         margin: float, jump: float, generator: torch.Generator) -> dict | None:
    """The S_n factor of the canonicalizer (alone or in a product): equivariance under permutations alone,
    the ambiguity of its order, and continuity under jitter. ``None`` when the canonicalizer has no S_n
    factor.

    * ``equivariance``: ``‖φ(σx) − ρ(σ)φ(x)‖ / ‖φ(x)‖`` for ``num_elements`` uniform random permutations σ
      per input, with ``ρ(σ)`` the permutation for per-element outputs (N-body positions, part logits) and the
      identity for invariant ones (class logits), as the task's outputs transform (``outputs`` says which);
      ``canonical_max_rel``: the canonical inputs of ``σx`` against those of ``x`` (the S_n factor makes them
      the same numbers); ``order_mismatch_rate``: share of inputs × σ whose order for ``σx`` is not ``σ``
      composed with the order for ``x`` (``σ[perm(σx)] ≠ perm(x)``; ties of identical elements count);
    * ``ties``: :func:`score_ties`;
    * ``continuity``: under a jitter of ``symmetry.jitter`` × the input's size (:meth:`Symmetry.perturbations`),
      the output change (``max_rel``, ``mean_rel``, ``jump_rate``: share moving by more than ``jump``), the
      share of inputs whose order changes at all (``order_change_rate``) and the mean share of positions
      that receive another element (``displaced_fraction``).
    """
    if not has_permutation_factor(model.canonicalizer):
        return None
    if not symmetry.has_sets:
        raise ValueError(f"{type(model.canonicalizer).__name__} has an S_n factor but the {symmetry.family} "
                         "family has no set of elements to permute")
    factor, factor_inputs = permutation_factor(model.canonicalizer, inputs)
    canonical, _ = model.network.canonicalize(*inputs)
    order = _order(model, inputs)
    batch, n = order.shape
    errors, canonical_errors, mismatches = [], [], []
    for j in range(num_elements):
        sigma = random_permutations(batch, n, generator).to(order.device)
        moved = symmetry.permute(inputs, sigma)
        g = SampledElement(f"S_n #{j + 1}", torch.eye(3, dtype=output.dtype, device=output.device).expand(batch, 3, 3),
                           permutation=sigma)
        errors.append(relative(model(*moved), symmetry.act_output(g, output), output))
        canonical_moved, _ = model.network.canonicalize(*moved)
        canonical_errors.append(relative(canonical_moved[0], canonical[0], canonical[0]))
        mismatches.append((sigma.gather(1, _order(model, moved)) != order).any(dim=-1))
    errors = torch.stack(errors)
    equivariance_result = {
        **summary(errors), "num_elements": num_elements, "num_inputs": batch,
        "outputs": ("per element: φ(σx) vs σφ(x)" if symmetry.per_element_outputs
                    else "invariant: φ(σx) vs φ(x)"),
        "canonical_max_rel": float(torch.stack(canonical_errors).max()),
        "order_mismatch_rate": float(torch.stack(mismatches).float().mean()),
    }
    _, jittered = symmetry.perturbations(inputs, generator)["jitter"]
    change = relative(model(*jittered), output, output)
    order_jittered = _order(model, jittered)
    continuity_result = {
        **summary(change), "perturbation": f"jitter {symmetry.jitter:g} × the input's size", "jump": jump,
        "jump_rate": float((change > jump).float().mean()),
        "order_change_rate": float((order_jittered != order).any(dim=-1).float().mean()),
        "displaced_fraction": float((order_jittered != order).float().mean()),
    }
    return {"group": "S_n", "factor": type(factor).__name__, "n": n, "selection": factor.selection,
            "equivariance": equivariance_result, "ties": score_ties(factor, factor_inputs, margin),
            "continuity": continuity_result}


@torch.no_grad()
def diagnose(model, symmetry: Symmetry, inputs: Inputs, *, seed: int = 0, margin: float = 0.01,
             jump: float = 0.1, pose_bins: int = 36) -> Diagnosis:
    """Every measure on ``inputs`` (the model in eval mode, inputs in its dtype and on its device).

    Returns a :class:`Diagnosis` whose ``results`` hold ``equivariance.exact``, ``equivariance.continuous``,
    ``equivariance.output_spread`` (mean ``‖φ(x) − mean φ‖ / ‖φ(x)‖`` over the inputs: near 0, the output
    ignores the input and the checks are vacuous), ``canonicalizer``, ``pose`` and ``continuity`` (see the
    module docstring and ``diagnostics.json`` in the README), and ``permutation`` (:func:`permutation_measures`;
    ``None`` unless the canonicalizer has an S_n factor).
    """
    generator = torch.Generator().manual_seed(int(seed))
    output = model(*inputs)
    canonical, chosen = model.network.canonicalize(*inputs)
    element = coordinate_element(chosen)  # what the pose, canonicalizer and continuity measures compare
    exact_moved = symmetry.exact(inputs, generator)
    exact, exact_errors = equivariance(model, symmetry, output, exact_moved)
    if exact is None:  # e.g. images under C3: no quarter turn belongs to the group
        exact = {"max_rel": None, "mean_rel": None, "num_elements": 0, "num_inputs": len(output),
                 "by_element": {}, "note": "no element of the canonicalizer's group is exact on this data"}
    continuous, _ = equivariance(model, symmetry, output, symmetry.continuous(inputs, generator))
    if continuous is None:
        continuous = {"max_rel": None, "mean_rel": None,
                      "note": "every element of the 3-D group acts exactly on coordinates: see equivariance.exact"}
    else:
        continuous["note"] = "interpolated: reported, not thresholded"
    pose_result, angles = pose(model, inputs, element, margin, pose_bins)
    # A model whose output ignores its input (e.g. untrained, batch norms at their initial statistics) passes
    # every check vacuously: say how much the outputs vary between inputs, on the same relative scale.
    spread = relative(output, output.mean(dim=0, keepdim=True).expand_as(output), output)
    results = {
        "equivariance": {"exact": exact, "continuous": continuous, "norm": NORM,
                         "output_spread": float(spread.mean())},
        "canonicalizer": canonicalizer_equivariance(model, symmetry, inputs, element, exact_moved),
        "pose": pose_result,
        "continuity": continuity(model, symmetry, inputs, output, element, jump, generator),
        # drawn after the others, so adding this section left their samples (and figures) as they were
        "permutation": permutation_measures(model, symmetry, inputs, output, num_elements=symmetry.num_elements,
                                            margin=margin, jump=jump, generator=generator),
    }
    return Diagnosis(results, inputs, canonical, exact_moved, exact_errors, angles)
