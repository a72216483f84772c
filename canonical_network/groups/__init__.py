"""Group elements and their actions on the inputs of each task.

Every canonicalizer returns its choice h(x) as a :class:`GroupElement`: one element per sample of the batch,
whatever the group. The interface is deliberately small: what logs, diagnostics and tests need to compare
elements across canonicalizers; the action on the task's inputs stays with each element's own class
(:class:`~canonical_network.groups.image.PlanarElement` for images,
:class:`~canonical_network.groups.euclidean.EuclideanTransform` for points and N-body systems).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class GroupElement(Protocol):
    """A batch of B group elements, one per sample.

    * :meth:`matrix` — ``(B, d, d)``: the element's linear action on the input's coordinates (a 2 × 2
      rotation/reflection of the image plane, a 3 × 3 orthogonal matrix in space). Translations, where the
      group has them, are extra attributes of the concrete class.
    * ``index`` — ``(B,)`` int64, the element's index in a finite group's enumeration, or ``None`` for
      continuous groups.

    Elements of finite groups chosen from per-element scores may also carry ``logits`` ``(B, |G|)``, the
    selection distribution of the forward pass that chose them (what the canonicalization prior of
    :meth:`~canonical_network.canonicalization.base.Canonicalizer.prior` reads); it is optional, so not part
    of the protocol.
    """

    @property
    def index(self) -> torch.Tensor | None: ...

    def matrix(self) -> torch.Tensor: ...


__all__ = ["GroupElement"]
