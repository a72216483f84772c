"""Canonicalization for a direct product of groups G₁ × G₂: one canonicalizer per factor, applied in turn.

``h(x) = (h₁(x), h₂(h₁(x)⁻¹ x))``: the first canonicalizer (E(3) or SO(3), the vector-neuron ones) puts the
input in its canonical pose; the second (S_n, :class:`~canonical_network.canonicalization.permutation.PermutationCanonicalizer`)
orders the elements of that canonical input. The pair is one element of the product
(:class:`~canonical_network.groups.product.ProductElement`), with one inverse:

    φ(x) = h₁'(x) · h₂'(·) · f(h₂⁻¹ h₁⁻¹ x),   ``invert(y, (g₁, g₂)) = first.invert(second.invert(y, g₂), g₁)``.

Why it is equivariant to the product, whatever ``f`` (paper §4, with the two factors' actions commuting:
a rotation acts on each element's coordinates, a permutation on their order):

* ``h₁`` must be equivariant to G₁ and *invariant* to G₂: the vector-neuron canonicalizers pool over the
  elements (means), so permuting the elements leaves their frame unchanged, and the canonical input
  ``h₁(x)⁻¹ x`` is G₁-invariant and G₂-equivariant;
* ``h₂`` then reads features invariant to G₁ (the canonical coordinates), so it is blind to G₁ and
  equivariant to G₂ (S_n: the scores of permuted elements are the permuted scores);
* for ``(g, P)`` acting on ``x``: ``h₁`` returns ``g h₁(x)``, the canonical input is ``P`` applied to the
  former one, ``h₂`` returns ``P`` composed with the former order, and the predictor sees the same numbers.

``symmetrization`` is the product's too (``canonicalization/symmetrization.py``): the first factor builds
the frame (weighted_frame, sampled; E(3) and SO(3) have no full frame) and the second orders each member's
canonical input (canonically, or by a draw of its own for ``sampled``); the factors' own keys stay canonical.

``freeze`` and ``prior_weight`` are the product's (the base class's options): freezing it freezes both
factors; its prior is the sum of the factors' priors (each the factor's own distance to the identity).
"""

from __future__ import annotations

import torch

from canonical_network.canonicalization.base import Canonicalizer, Inputs
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec
from canonical_network.groups.product import ProductElement


class ProductCanonicalizer(Canonicalizer):
    """``h(x) = (h₁(x), h₂(h₁(x)⁻¹ x)) ∈ G₁ × G₂`` (module docstring).

    Args:
        first: the canonicalizer of G₁ (e.g. ``VNDeepSetsCanonicalizer`` for E(3), ``VNPointCloudCanonicalizer``
            for SO(3)); must be invariant to G₂ (pooling over the elements).
        second: the canonicalizer of G₂ (``PermutationCanonicalizer`` for S_n), applied to the first's
            canonical inputs.
        freeze: keep both factors at their initial weights.
    """

    def __init__(self, first: Canonicalizer, second: Canonicalizer, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        for name, factor in (("first", first), ("second", second)):
            if not isinstance(factor, Canonicalizer):
                raise TypeError(f"ProductCanonicalizer: canonicalization.{name} must be a Canonicalizer, got "
                                f"{type(factor).__name__}")
            if factor.needs_predictor:
                raise ValueError(f"ProductCanonicalizer: canonicalization.{name} ({type(factor).__name__}) scores "
                                 "with the predictor; a factor of a product cannot")
            if factor.symmetrization != "canonical":
                raise ValueError(f"ProductCanonicalizer: canonicalization.{name}.symmetrization="
                                 f"{factor.symmetrization!r}; a product's symmetrization is its own "
                                 "(canonicalization.symmetrization), its factors' must stay canonical")
        self.first = first
        self.second = second
        self.group_name = f"{first.group_name}×{second.group_name}"

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, ProductElement]:
        """``(h₂⁻¹ h₁⁻¹ x, (h₁, h₂))``: the first factor's canonical inputs, reordered by the second."""
        posed, g_first = self.first.canonicalize(*inputs)
        canonical, g_second = self.second.canonicalize(*posed)
        return canonical, ProductElement(g_first, g_second)

    def symmetrization_error(self, mode: str) -> str | None:
        if mode == "canonical":
            return None
        reason = self.first.symmetrization_error(mode)
        return None if reason is None else f"its first factor: {reason}"

    def build_frame(self, inputs: Inputs, spec: FrameSpec) -> Frame:
        """The first factor's frame, each member's canonical input then ordered by the second factor: its
        canonical order (``weighted_frame``), or one draw of its own per member when it can sample
        (``sampled``: ``k`` draws of the pair, the first's law times the second's given the first). The
        weights are the first factor's; the pair ``(g₁, g₂)`` of each member acts as in the canonical mode."""
        first = self.first.frame(*inputs, spec=spec)
        if spec.mode == "sampled" and self.second.symmetrization_error("sampled") is None:
            second = self.second.frame(*first.canonical, spec=spec.with_mode("sampled", size=1))
            canonical, g_second = second.canonical, second.elements
        else:
            canonical, g_second = self.second.canonicalize(*first.canonical)
        return self.frame_of(canonical, ProductElement(first.elements, g_second), first.weights)

    def invert(self, output: torch.Tensor, group_element: ProductElement) -> torch.Tensor:
        """``h₁' · h₂' · y``: the second factor's inverse first (the order), then the first's (the pose)."""
        return self.first.invert(self.second.invert(output, group_element.second), group_element.first)

    def prior(self, group_element: ProductElement | None) -> torch.Tensor:
        """The sum of the factors' priors (each its own distance to the identity)."""
        if group_element is None:
            return torch.zeros(())
        return self.first.prior(group_element.first) + self.second.prior(group_element.second)

    def is_identity(self, group_element: ProductElement | None, batch_size: int) -> torch.Tensor:
        """``(B,)`` bool: both factors' elements are the identity."""
        if group_element is None:
            return torch.ones(batch_size, dtype=torch.bool)
        first = self.first.is_identity(group_element.first, batch_size)
        return first & self.second.is_identity(group_element.second, batch_size).to(first.device)


__all__ = ["ProductCanonicalizer"]
