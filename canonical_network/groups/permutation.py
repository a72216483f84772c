"""The symmetric group S_n acting on sets of n elements: a batch of permutations and its action on dim 1.

A permutation is stored as ``perm`` ``(B, n)`` int64: ``perm[b, k]`` is the index of the input element placed
at position ``k``. Its matrix ``P`` has ``P[k, perm[k]] = 1``, so ``P x`` (``x`` of shape ``(n, d)``) is
``x[perm]`` and ``Pᵀ y`` puts row ``k`` of ``y`` back at ``perm[k]``. Both actions are gathers/scatters:
exact in floating point (the same numbers, reordered).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def permute(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``P x`` along dim 1: ``out[b, k] = x[b, perm[b, k]]`` for ``x`` of shape ``(B, n, ...)``."""
    index = perm.view(*perm.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


def unpermute(y: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``Pᵀ y`` along dim 1: ``out[b, perm[b, k]] = y[b, k]`` (the inverse of :func:`permute`)."""
    index = perm.view(*perm.shape, *([1] * (y.dim() - 2))).expand_as(y)
    return torch.empty_like(y).scatter(1, index, y)


def permutation_matrix(perm: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(B, n, n)`` one-hot rows: ``P[b, k, perm[b, k]] = 1``."""
    return torch.nn.functional.one_hot(perm, perm.shape[-1]).to(dtype)


def random_permutations(batch_size: int, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``(B, n)`` int64: one uniform random permutation of ``range(n)`` per sample."""
    return torch.rand(batch_size, n, generator=generator).argsort(dim=-1)


@dataclass
class PermutationElement:
    """A batch of B elements of S_n, one per sample.

    Attributes:
        perm: ``(B, n)`` int64, the hard permutation (``perm[b, k]`` = the input element at position ``k``).
        relaxed: ``(B, n, n)`` or ``None``: the matrix the forward pass applied, whose gradient reaches the
            canonicalizer: the hard ``P`` with a straight-through Sinkhorn gradient, or the soft doubly
            stochastic matrix (``selection=soft``). ``None`` for an element not chosen by a network, and for
            one chosen where no gradient can flow (the canonicalizer's fast path: the sort alone).

    ``index`` is ``None``: the protocol's index is a position in an enumeration of a small finite group
    ``(B,)``; S_n is not enumerated (n! elements); ``perm`` is its coordinate.
    """

    perm: torch.Tensor
    relaxed: torch.Tensor | None = None

    @property
    def index(self) -> None:
        return None

    @property
    def n(self) -> int:
        return self.perm.shape[-1]

    def matrix(self) -> torch.Tensor:
        """``(B, n, n)``: the hard permutation matrix ``P`` (orthogonal), in the relaxed matrix's dtype."""
        dtype = self.relaxed.dtype if self.relaxed is not None else torch.get_default_dtype()
        return permutation_matrix(self.perm, dtype)

    def is_identity(self) -> torch.Tensor:
        """``(B,)`` bool: whether each permutation is the identity."""
        return (self.perm == torch.arange(self.n, device=self.perm.device)).all(dim=-1)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``P x`` along dim 1 (exact)."""
        return permute(x, self.perm)

    def apply_inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``Pᵀ y`` along dim 1 (exact)."""
        return unpermute(y, self.perm)


__all__ = ["PermutationElement", "permutation_matrix", "permute", "random_permutations", "unpermute"]
