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

from canonical_network.groups import GroupElement

Inputs = tuple[torch.Tensor, ...]


class _AppliesFreeze(type(nn.Module)):
    """Metaclass of :class:`Canonicalizer`: applies ``freeze`` once the outermost ``__init__`` has returned,
    i.e. after every parameter of every subclass exists, so no subclass has a step to remember."""

    def __call__(cls, *args: Any, **kwargs: Any):
        canonicalizer = super().__call__(*args, **kwargs)
        if canonicalizer.freeze:
            canonicalizer.set_frozen(True)
        return canonicalizer


class Canonicalizer(nn.Module, metaclass=_AppliesFreeze):
    """Base class of every canonicalization function h; it owns the contract every subclass gets for free.

    A subclass implements :meth:`canonicalize` and, when the task's outputs transform, :meth:`invert`:

    * ``canonicalize(*inputs)`` takes the *same positional inputs as the predictor* (e.g. ``(images,)`` or
      ``(loc, vel, charges)``) and returns ``(canonical_inputs, g)``: ``canonical_inputs`` a tuple of as many
      tensors as there were inputs, in the same order, each mapped to its canonical pose (invariant inputs
      such as charges or the object category pass through), and ``g`` the chosen element h(x), a
      :class:`~canonical_network.groups.GroupElement` (``None`` only for the trivial group). One shape for
      one input or several; :class:`CanonicalizedModel` checks it.
    * ``freeze`` is applied by the base class after construction (whatever the subclass builds in its
      ``__init__``), and a frozen canonicalizer stays in eval mode.
    * ``group_name`` names the group in mathematical notation: ``"C4"``, ``"D8"``, ``"SO(2)"``, ``"SO(3)"``,
      ``"O(3)"``, ``"E(3)"``, ``"trivial"``.

    Args:
        freeze: keep the weights at their initial values (the paper's "CN(frozen)" rows). The network is
            still evaluated, but no gradient flows into it and optimisers never see its parameters.
    """

    #: the group the canonicalizer is equivariant to, in mathematical notation (for logs and docs).
    group_name: str = "trivial"

    def __init__(self, freeze: bool = False) -> None:
        super().__init__()
        self.freeze = bool(freeze)

    def set_frozen(self, freeze: bool = True) -> Canonicalizer:
        """Freeze (or unfreeze) every parameter; called by the base class after ``__init__``, and usable later
        (e.g. on a canonicalizer whose trained weights were loaded, as CN(pretrained) does)."""
        self.freeze = bool(freeze)
        for p in self.parameters():
            p.requires_grad_(not self.freeze)
        if self.freeze:
            self.train(False)
        return self

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, GroupElement | None]:
        """Return ``(canonical_inputs, group_element)`` with ``canonical_inputs = h(x)⁻¹ · x``, a tuple."""
        raise NotImplementedError

    def invert(self, output: torch.Tensor, group_element: GroupElement | None) -> torch.Tensor:
        """Apply h'(x) to the predictor's output. Default: invariant output, returned unchanged."""
        return output

    def group_element_index(self, group_element: GroupElement | None) -> torch.Tensor | None:
        """Finite groups: the index of the chosen element per sample, (B,) int64; ``None`` otherwise."""
        return None if group_element is None else group_element.index

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
        if not isinstance(canonical, tuple) or len(canonical) != len(inputs):
            got = type(canonical).__name__ + (f" of {len(canonical)}" if isinstance(canonical, tuple) else "")
            raise TypeError(
                f"{type(self.canonicalizer).__name__}.canonicalize must return (a tuple of {len(inputs)} "
                f"canonical input(s), group element); got {got}"
            )
        return canonical, group_element

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        canonical, group_element = self.canonicalize(*inputs)
        return self.canonicalizer.invert(self.predictor(*canonical), group_element)
