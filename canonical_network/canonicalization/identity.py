"""h(x) = e: the canonicalizer of every baseline row, so baselines share the canonicalized code path."""

from __future__ import annotations

import torch

from canonical_network.canonicalization.base import Canonicalizer


class IdentityCanonicalizer(Canonicalizer):
    """Returns the inputs unchanged and the identity element (``None``). Trivially equivariant."""

    group_name = "trivial"

    def __init__(self, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.finish_init()

    def canonicalize(self, *inputs: torch.Tensor):
        return (inputs[0] if len(inputs) == 1 else inputs), None
