"""The measures of a diagnosis: equivariance of φ, equivariance of h alone, the distribution of the chosen
poses, and continuity under small perturbations.

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

from canonical_network.diagnostics.symmetries import Inputs, SampledElement, Symmetry
from canonical_network.groups.euclidean import apply_rotation
from canonical_network.groups.image import PlanarElement, element_angles_deg, planar_group

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
    planar groups the chosen index with the index of ``g·h(x)``. ``None`` for the identity canonicalizer."""
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
        _, element_moved = model.network.canonicalize(*inputs_moved)
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
    return {
        "kind": "continuous", "group": h.group_name, "quantity": "rotation angle (deg)" + (
            ", 3-D: arccos((tr R − 1)/2) of the rotation part" if top == 180.0 else ""),
        "bin_edges_deg": torch.linspace(0.0, top, bins + 1).tolist(), "histogram": counts.long().tolist(),
        "entropy_bits": entropy_bits(counts), "max_entropy_bits": math.log2(bins),
        "reflection_rate": float(reflect.float().mean()), "ambiguity_rate": None,
    }, angles


def continuity(model, symmetry: Symmetry, inputs: Inputs, output: torch.Tensor, element, jump: float,
               generator: torch.Generator) -> dict:
    """How much the output moves under small perturbations (:meth:`Symmetry.perturbations`).

    Per perturbation ``x′`` (a small group element ``g`` or a jitter, ``g = e``): ``Δ = ‖φ(x′) − ρ(g)φ(x)‖ /
    ‖φ(x)‖`` (the change beyond what equivariance predicts), its max and mean, ``jump_rate`` (share of
    inputs with ``Δ > jump``) and ``element_change_rate`` (share whose chosen element changes: another index
    for finite groups; ``‖h(x′) − g·h(x)‖_F / ‖h(x)‖_F > jump`` for continuous ones; ``None`` for the
    identity). The top-level figures pool every perturbation (rates: inputs affected by any).
    """
    h = model.canonicalizer
    index = None if element is None else h.group_element_index(element)
    parts, changes, jumped, switched = {}, [], [], []
    for name, (g, perturbed) in symmetry.perturbations(inputs, generator).items():
        change = relative(model(*perturbed), output if g is None else symmetry.act_output(g, output), output)
        part = {**summary(change), "jump_rate": float((change > jump).float().mean()), "element_change_rate": None}
        label = g.label if g is not None else f"jitter {symmetry.jitter:g} × the input's size"
        if element is not None:
            _, element_p = model.network.canonicalize(*perturbed)
            if index is not None:
                changed = h.group_element_index(element_p) != index
            else:
                expected = element.matrix() if g is None else g.matrix @ element.matrix()
                changed = relative(element_p.matrix(), expected, element.matrix()) > jump
            part["element_change_rate"] = float(changed.float().mean())
            switched.append(changed)
        parts[name] = {"perturbation": label, **part}
        changes.append(change)
        jumped.append(change > jump)
    changes = torch.stack(changes)
    return {
        **summary(changes), "jump": jump,
        "jump_rate": float(torch.stack(jumped).any(dim=0).float().mean()),
        "element_change_rate": float(torch.stack(switched).any(dim=0).float().mean()) if switched else None,
        "by_perturbation": parts,
    }


@torch.no_grad()
def diagnose(model, symmetry: Symmetry, inputs: Inputs, *, seed: int = 0, margin: float = 0.01,
             jump: float = 0.1, pose_bins: int = 36) -> Diagnosis:
    """Every measure on ``inputs`` (the model in eval mode, inputs in its dtype and on its device).

    Returns a :class:`Diagnosis` whose ``results`` hold ``equivariance.exact``, ``equivariance.continuous``,
    ``equivariance.output_spread`` (mean ``‖φ(x) − mean φ‖ / ‖φ(x)‖`` over the inputs: near 0, the output
    ignores the input and the checks are vacuous), ``canonicalizer``, ``pose`` and ``continuity`` (see the
    module docstring and ``diagnostics.json`` in the README).
    """
    generator = torch.Generator().manual_seed(int(seed))
    output = model(*inputs)
    canonical, element = model.network.canonicalize(*inputs)
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
    }
    return Diagnosis(results, inputs, canonical, exact_moved, exact_errors, angles)
