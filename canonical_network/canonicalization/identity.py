"""h(x) = e: the canonicalizer of every baseline row, so baselines share the canonicalized code path."""

from __future__ import annotations

import torch

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec


class IdentityCanonicalizer(Canonicalizer):
    """Returns the inputs unchanged and ``None``, the trivial group's only element. Trivially equivariant.

    Every ``symmetrization`` is the same here: the trivial group has one element, so its weighted frame, its
    samples and its full frame are that element with weight 1 (one predictor pass, whatever ``frame_size``).
    """

    group_name = "trivial"

    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)

    def canonicalize(self, *inputs: torch.Tensor):
        return tuple(inputs), None

    def symmetrization_error(self, mode: str) -> str | None:
        return None

    def build_frame(self, inputs: tuple[torch.Tensor, ...], spec: FrameSpec) -> Frame:
        weights = torch.ones(inputs[0].shape[0], 1, device=inputs[0].device)
        return Frame(tuple(inputs), None, weights, None)
