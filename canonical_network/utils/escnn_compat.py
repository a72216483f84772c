"""Make escnn 1.0.11 build dihedral (D_N) bases on current scikit-learn.

escnn computes null spaces with scikit-learn's ``randomized_svd`` when it is importable. Recent
scikit-learn refuses the ``np.matrix`` escnn passes it ("np.matrix is not supported"), which crashes every
dihedral layer on a cold basis cache. escnn already has an exact fallback (``scipy.linalg.svd``) for when
scikit-learn is missing; we select it. The exact SVD is also the better choice for these small matrices.
"""

from __future__ import annotations

_PATCHED = False


def patch_escnn() -> None:
    """Idempotently route escnn's null-space computation to scipy's exact SVD."""
    global _PATCHED
    if _PATCHED:
        return
    from escnn.group import _numerical

    _numerical.randomized_svd = None
    _PATCHED = True
