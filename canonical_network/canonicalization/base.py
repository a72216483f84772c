"""The canonicalization interface and the paper's composition, written once.

Paper Eq. (1) (§3.2):  φ(x) = h'(x) · f(h(x)⁻¹ · x)

* ``h``  — a :class:`Canonicalizer`: a small equivariant network that picks one group element per input.
* ``f``  — the prediction network: any backbone, usually not equivariant.
* ``h'`` — the same group element acting on the output (``Canonicalizer.invert``); the identity for
  invariant outputs (class logits), a rotation/translation for equivariant ones (N-body positions).

:class:`CanonicalizedModel` is the only place where this composition is written. Baselines use
:class:`~canonical_network.canonicalization.identity.IdentityCanonicalizer` (h = e), so a plain backbone and
a canonicalized one share every code path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

Inputs = tuple[torch.Tensor, ...]


class Canonicalizer(nn.Module):
    """Base class of every canonicalization function h.

    Subclasses implement :meth:`canonicalize` and, when the task's outputs transform, :meth:`invert`.
    A canonicalizer takes the *same positional inputs as the predictor* (e.g. ``(images,)`` or
    ``(loc, vel, charges)``) and returns the same number of inputs, mapped to their canonical pose;
    inputs that are invariant (charges, object category) are passed through untouched.

    Args:
        freeze: keep the weights at their initial values (the paper's "CN(frozen)" rows). The network is
            still evaluated, but no gradient flows into it and optimisers never see its parameters.
    """

    #: name of the group the canonicalizer is equivariant to, for logs and docs.
    group_name: str = "trivial"

    def __init__(self, freeze: bool = False) -> None:
        super().__init__()
        self.freeze = bool(freeze)

    def finish_init(self) -> None:
        """Call at the end of a subclass ``__init__``: applies ``freeze`` once all parameters exist."""
        if self.freeze:
            for p in self.parameters():
                p.requires_grad_(False)

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[torch.Tensor | Inputs, Any]:
        """Return ``(canonical_inputs, group_element)`` with ``canonical_inputs = h(x)⁻¹ · x``.

        ``canonical_inputs`` is a tensor when there is one input, else a tuple in the same order.
        """
        raise NotImplementedError

    def invert(self, output: torch.Tensor, group_element: Any) -> torch.Tensor:
        """Apply h'(x) to the predictor's output. Default: invariant output, returned unchanged."""
        return output

    def group_element_index(self, group_element: Any) -> torch.Tensor | None:
        """Discrete groups: the index of the chosen element per sample, (B,) int64; ``None`` otherwise."""
        return None

    def train(self, mode: bool = True) -> Canonicalizer:
        # A frozen canonicalizer stays in eval mode: batch-norm statistics or dropout would otherwise
        # change the "frozen at initialisation" function during training.
        return super().train(mode and not self.freeze)


class CanonicalizedModel(nn.Module):
    """φ(x) = h'(x) · f(h(x)⁻¹ · x): any predictor made equivariant by a canonicalizer.

    Args:
        canonicalizer: h, a :class:`Canonicalizer` (the identity for baselines).
        predictor: f, any ``nn.Module`` taking the same positional inputs.

    ``forward(*inputs)`` returns the predictor's output mapped back by ``h'``. If ``h`` is equivariant
    (tested for every canonicalizer in ``tests/``), φ is equivariant (invariant for ``invert = id``)
    whatever ``f`` is.
    """

    def __init__(self, canonicalizer: Canonicalizer, predictor: nn.Module) -> None:
        super().__init__()
        if not isinstance(canonicalizer, Canonicalizer):
            raise TypeError(
                f"canonicalizer must be a canonical_network Canonicalizer, got {type(canonicalizer).__name__}"
            )
        self.canonicalizer = canonicalizer
        self.predictor = predictor

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, Any]:
        """``(h(x)⁻¹ · x as a tuple, h(x))``: what the predictor sees, for logging and figures."""
        canonical, group_element = self.canonicalizer.canonicalize(*inputs)
        if isinstance(canonical, torch.Tensor):
            canonical = (canonical,)
        return tuple(canonical), group_element

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        canonical, group_element = self.canonicalize(*inputs)
        return self.canonicalizer.invert(self.predictor(*canonical), group_element)
