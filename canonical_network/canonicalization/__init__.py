"""Canonicalization functions h (paper §3-4). The composition φ = h' f(h⁻¹ x) lives in ``base``."""

from canonical_network.canonicalization.base import CanonicalizedModel, Canonicalizer

__all__ = ["CanonicalizedModel", "Canonicalizer"]
