"""Test-time canonicalization: the frozen predictor picks its own pose, no training (issue 16).

h(x) is the element g of a finite set of poses (C_N, D_N, or a grid of SO(2) angles) under which the
predictor f is most confident about ``g⁻¹ · x``; f then predicts on that canonical input, so
φ(x) = f(h(x)⁻¹ · x) as for every canonicalizer (:class:`~canonical_network.canonicalization.base.CanonicalizedModel`).
It has no parameters: it needs f, which :class:`CanonicalizedModel` hands over through
:meth:`~canonical_network.canonicalization.base.Canonicalizer.bind_predictor`. Because it adds no weights,
it can be put in front of any trained image classifier whose own canonicalizer is the identity, at
evaluation time: ``python -m canonical_network.evaluate ckpt_path=<file> canonicalization=tta``.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec, discrete_frame
from canonical_network.groups.image import PlanarElement, element_angles_deg, rotate_deg
from canonical_network.utils.checks import check_bool, check_choice, check_int

#: ``canonicalization.score``: how confident f is on a candidate, from its logits z (higher = chosen)
SCORES = ("max_softmax", "neg_energy")


def confidence(logits: torch.Tensor, score: str) -> torch.Tensor:
    """(B, classes) logits → (B,) confidence: the largest softmax probability (``max_softmax``) or the negative
    free energy ``logsumexp(z)`` (``neg_energy``; the energy of Liu et al. 2020 is ``−logsumexp(z)``).

    ``max_softmax`` is returned as ``−logsumexp_{j≠top}(z_j − z_top)``, which orders candidates exactly as
    ``p_top = 1 / (1 + exp(logsumexp_{j≠top}(z_j − z_top)))`` does but does not saturate: in float32 ``p_top``
    (and ``log p_top``) rounds to exactly 1 (0) once the top logit leads by more than ~17, common for a trained
    classifier, and the tied candidates were then chosen by their position in the grid, another pose for x than
    for a quarter turn of x: the invariance was lost.
    """
    if score == "max_softmax":
        if logits.shape[-1] < 2:
            return torch.zeros(logits.shape[:-1], dtype=logits.dtype, device=logits.device)
        top = logits.amax(dim=-1, keepdim=True)
        gaps = (logits - top).scatter(-1, logits.argmax(dim=-1, keepdim=True), float("-inf"))
        return -torch.logsumexp(gaps, dim=-1)
    return torch.logsumexp(logits, dim=-1)


def inverse_exact(images: torch.Tensor, angle_deg: float, reflect: bool) -> torch.Tensor:
    """g⁻¹ · images for g = rotation by ``angle_deg`` after flip^reflect (the convention of
    :mod:`canonical_network.groups.image`), the same g for the whole batch.

    The angle is split as ``90°·q + s`` with ``0 ≤ s < 90°``: the quarter turns go through ``rot90`` (exact)
    *before* the residual ``s`` is interpolated, so for ``x' = rot90(x)`` the candidate of angle ``a + 90°``
    is computed from the very same tensor as x's candidate of angle ``a``, bit for bit.
    """
    quarters, rest = divmod(float(angle_deg), 90.0)
    moved = torch.rot90(images, -int(quarters) % 4, dims=(-2, -1))
    if rest:
        moved = rotate_deg(moved, -rest)
    return moved.flip(-1) if reflect else moved


class TestTimeCanonicalizer(Canonicalizer):
    """CN(TTA): h(x) = argmax over candidate poses g of the frozen predictor's confidence on g⁻¹ · x.

    Per input, each candidate g⁻¹ · x is classified by f (in eval mode, without gradient) and scored by
    ``score`` (:func:`confidence`); the best one is the canonical input, the candidate itself (f then
    predicts on it, with gradient reaching the input image but not the choice). No parameters, no buffers in
    the ``state_dict``: f is held as a plain reference, not as a submodule (:meth:`bind_predictor`), so
    ``parameters()`` and ``state_dict()`` stay empty and the model's weights are f's alone.

    Invariance. With C_N (D_N) and 4 | N, the candidates of ``rot90(x)`` are those of x cyclically shifted
    by N/4, computed from bit-identical tensors (:func:`inverse_exact`), so the scores are shifted, the
    chosen element is ``90° · h(x)`` and the canonical image is the same: φ(rot90(x)) = φ(x) exactly — when
    the argmax is unique. Ties (two distinct candidates with the same score, e.g. a saturated softmax of
    1.0 in float32) go to the first candidate in escnn order, which is not the same pose for x and rot90(x):
    there the choice, and possibly the prediction, can differ. (Identical candidates, as for a C4-symmetric
    image, are harmless: any choice is the same image.) For other rotations (45°, arbitrary angles) the
    candidates are interpolated, so the invariance is approximate, as for the G-CNN canonicalizer; the flip
    of D_N maps the residual angle s to 90° − s, so it is exact for N = 4 only. Cost: |G| forward passes of
    f per input (the first |G| − 1 without gradient).

    Args:
        num_rotations: N of C_N (``canonicalization.num_rotations``, default 8); ignored with ``angles``.
        reflection: D_N (the N rotations, with and without the horizontal flip) instead of C_N.
        angles: an explicit grid of SO(2) angles in degrees (e.g. ``[-30, -15, 0, 15, 30]``) instead of a
            group: ``group_name`` is then ``"SO(2)"`` and the element carries no index (the identity rate
            tests the angle against 0).
        score: ``max_softmax`` (largest softmax probability) or ``neg_energy`` (``logsumexp`` of the logits).
        freeze: accepted for the common interface; there is nothing to freeze.
    """

    #: the tasks (model._target_'s class) whose inputs h takes (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    __test__ = False  # a class named Test* that pytest must not collect

    #: f is what scores the candidates: CanonicalizedModel binds it (Canonicalizer.bind_predictor)
    needs_predictor = True

    def __init__(
        self,
        num_rotations: int = 8,
        reflection: bool = False,
        angles: list[float] | None = None,
        score: str = "max_softmax",
        freeze: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        self.score = check_choice("canonicalization.score", score, SCORES)
        reflection = check_bool("canonicalization.reflection", reflection)
        if angles is not None:
            angles = [float(a) for a in angles]
            if not angles:
                raise ValueError("canonicalization.angles must list at least one angle (degrees), or be null")
            if reflection:
                raise ValueError("canonicalization.angles is a grid of SO(2) rotations; "
                                 "canonicalization.reflection=true needs the group D_N (angles: null)")
            self.elements = [(a, False) for a in angles]
            self.group_name = "SO(2)"
        else:
            check_int("canonicalization.num_rotations", num_rotations, low=1)
            angle, flip = element_angles_deg(int(num_rotations), bool(reflection))
            self.elements = [(float(a), bool(r)) for a, r in zip(angle.tolist(), flip.tolist(), strict=True)]
            self.group_name = f"{'D' if reflection else 'C'}{int(num_rotations)}"
        self.num_rotations = int(num_rotations)
        self.reflection = bool(reflection)
        self.has_index = angles is None

    # --- the predictor ----------------------------------------------------------------------------------

    def bind_predictor(self, predictor: nn.Module) -> None:
        # Written into __dict__ directly: nn.Module.__setattr__ would register f as a submodule, so f's
        # weights would appear twice in the model's state_dict (network.canonicalizer.* and
        # network.predictor.*) and once in the canonicalizer's parameter count.
        self.__dict__["_predictor"] = predictor

    @property
    def predictor(self) -> nn.Module:
        predictor = self.__dict__.get("_predictor")
        if predictor is None:
            raise RuntimeError(
                "TestTimeCanonicalizer scores poses with the predictor f: wrap it as "
                "CanonicalizedModel(canonicalizer, predictor), which binds f (Canonicalizer.bind_predictor)"
            )
        return predictor

    # --- h ----------------------------------------------------------------------------------------------

    def scores(self, candidates: list[torch.Tensor]) -> torch.Tensor:
        """(B, |G|) confidence of the frozen f on every candidate ``g_k⁻¹ · x`` (eval mode, no gradient)."""
        predictor = self.predictor
        was_training = predictor.training
        predictor.eval()
        try:
            with torch.no_grad():
                columns = []
                for candidate in candidates:  # one batch of B per element: the same batch shape for every pose
                    logits = predictor(candidate)
                    if not torch.is_tensor(logits) or logits.dim() != 2:
                        raise TypeError("TestTimeCanonicalizer needs a classifier: the predictor must return "
                                        f"(B, classes) logits, got {getattr(logits, 'shape', type(logits))}")
                    columns.append(confidence(logits.float(), self.score))
        finally:
            predictor.train(was_training)
        return torch.stack(columns, dim=-1)

    def _candidates(self, inputs: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Every candidate ``g_k⁻¹ · x`` (exact where the grid allows, :func:`inverse_exact`) and f's (B, |G|)
        confidence in each."""
        if len(inputs) != 1 or inputs[0].dim() != 4:
            shapes = [tuple(x.shape) for x in inputs]
            raise TypeError(f"TestTimeCanonicalizer rotates images: one (B, C, H, W) input, got shapes {shapes}")
        candidates = [inverse_exact(inputs[0], angle, reflect) for angle, reflect in self.elements]
        return candidates, self.scores(candidates)

    def _element(self, index: torch.Tensor, scores: torch.Tensor, like: torch.Tensor) -> PlanarElement:
        """The elements of ``index`` (any shape of indices into :attr:`elements`, with their rows of scores)."""
        angles = torch.tensor([a for a, _ in self.elements], dtype=like.dtype, device=like.device)
        reflects = torch.tensor([float(r) for _, r in self.elements], dtype=like.dtype, device=like.device)
        return PlanarElement(
            angle_deg=angles[index],
            reflect=reflects[index],
            index=index if self.has_index else None,
            logits=scores if self.has_index else None,  # the prior's selection scores (finite groups only)
        )

    def canonicalize(self, *inputs: torch.Tensor):
        candidates, scores = self._candidates(inputs)
        index = scores.argmax(dim=-1)  # ties: the first candidate (documented above)
        stacked = torch.stack(candidates, dim=1)  # (B, |G|, C, H, W)
        batch = torch.arange(inputs[0].shape[0], device=inputs[0].device)
        return (stacked[batch, index],), self._element(index, scores, inputs[0])

    def symmetrization_error(self, mode: str) -> str | None:
        if mode == "full" and not self.has_index:
            return ("canonicalization.angles is a grid of SO(2) angles, not a group: averaging over it is not "
                    "invariant; full needs a finite group (num_rotations, reflection)")
        return None

    def build_frame(self, inputs: tuple[torch.Tensor, ...], spec: FrameSpec) -> Frame:
        """``weighted_frame``, ``sampled`` or ``full`` over the candidate poses, scored by f's confidence
        (``symmetrization.discrete_frame``); each member is the very candidate tensor the canonical mode would
        pick, so the exactness argument of the class docstring holds member by member. f's confidence carries
        no gradient, so neither do the weights (nor any straight-through term)."""
        candidates, scores = self._candidates(inputs)
        index, weights, _ = discrete_frame(scores, spec)
        stacked = torch.stack(candidates, dim=0)  # (|G|, B, C, H, W)
        batch = torch.arange(inputs[0].shape[0], device=inputs[0].device)
        members = stacked[index, batch.unsqueeze(0)].flatten(0, 1)  # (k·B, C, H, W), frame-major
        flat = index.reshape(-1)
        g = self._element(flat, scores.repeat(index.shape[0], 1), inputs[0])
        return self.frame_of((members,), g, weights.to(inputs[0].dtype))
