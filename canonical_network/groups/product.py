"""Elements of a direct product of groups: one element of each factor per sample, e.g. E(3) × S_n.

The factors act on different things — a rotation/translation on the coordinates of every element of a set, a
permutation on the order of the elements — so the two actions commute and the pair acts as one element:
``(g, P) · x = P (g · x) = g · (P x)``. Its inverse is the pair of inverses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ProductElement:
    """A batch of B elements of ``G₁ × G₂``, one per sample: ``first`` ∈ G₁, ``second`` ∈ G₂.

    ``matrix()`` is the first factor's: the linear action on the inputs' coordinates (a 3 × 3 orthogonal
    matrix for E(3) or SO(3)); the second factor (S_n) acts on the elements' order, not on coordinates.
    ``index`` is ``None``: the product is not enumerated.
    """

    first: Any
    second: Any

    @property
    def index(self) -> None:
        return None

    def matrix(self) -> torch.Tensor:
        return self.first.matrix()

    def __iter__(self):  # unpacks as ``g_first, g_second = element``
        return iter((self.first, self.second))


__all__ = ["ProductElement"]
