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

``freeze`` and ``prior_weight`` are the product's (the base class's options): freezing it freezes both
factors; its prior is the sum of the factors' priors (each the factor's own distance to the identity).
"""

from __future__ import annotations

import torch

from canonical_network.canonicalization.base import Canonicalizer, Inputs
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
        self.first = first
        self.second = second
        self.group_name = f"{first.group_name}×{second.group_name}"

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, ProductElement]:
        """``(h₂⁻¹ h₁⁻¹ x, (h₁, h₂))``: the first factor's canonical inputs, reordered by the second."""
        posed, g_first = self.first.canonicalize(*inputs)
        canonical, g_second = self.second.canonicalize(*posed)
        return canonical, ProductElement(g_first, g_second)

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
