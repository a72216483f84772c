"""h(x) = e: the canonicalizer of every baseline row, so baselines share the canonicalized code path."""

from __future__ import annotations

import torch

from canonical_network.canonicalization.base import Canonicalizer


class IdentityCanonicalizer(Canonicalizer):
    """Returns the inputs unchanged and ``None``, the trivial group's only element. Trivially equivariant."""

    group_name = "trivial"

    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)

    def canonicalize(self, *inputs: torch.Tensor):
        return tuple(inputs), None
