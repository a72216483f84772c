"""Four fixes to escnn 1.0.11, applied by :func:`patch_escnn` before any of our escnn layers is built.

1. **Dihedral bases on current scikit-learn.** escnn computes null spaces with scikit-learn's
   ``randomized_svd`` when it is importable. Recent scikit-learn refuses the ``np.matrix`` escnn passes it
   ("np.matrix is not supported"), which crashes every dihedral layer on a cold basis cache. escnn already
   has an exact fallback (``scipy.linalg.svd``) for when scikit-learn is missing; we select it. The exact
   SVD is also the better choice for these small matrices.

2. **Memory of large bases.** escnn normalises every sampled kernel basis (shape ``(B, O, I, P)``: basis
   elements, output and input size, grid points) in ``normalize_basis`` by forming all the products
   ``basis[b] · basis[b]ᵀ`` per grid point, a ``(B, O, O, P)`` tensor, and then keeping only its trace.
   For a regular C64 field (O = 64) and an image-sized 28×28 kernel that intermediate alone is several GB
   (its size, computed from the shapes, and the builds' peak memory with this fix: ``docs/measurements.md``),
   and it grows as O² (O = 128 for a D64 field). The trace
   is the sum of the squared entries, ``Σ_{o,i,p} basis[b,o,i,p]²``, which needs no intermediate at all;
   :func:`lean_normalize_basis` computes it so and is otherwise escnn's function (same in-place division,
   same thresholds), so the sampled bases, hence the models, are unchanged (checked in
   ``tests/test_escnn_memory.py``).

3. **Time of the filter expansion.** In training every forward expands the filters from the basis,
   ``einsum('boi...,kb->koi...', basis, weights)``. torch evaluates that einsum by permuting the basis so
   that ``b`` comes last, i.e. by copying the whole sampled basis at every call (for CN(p64)'s lifting
   layer a large share of the canonicalizer's forward + backward time in a hand timing, not recorded:
   ``docs/measurements.md``), then a batched product.
   :func:`expand_without_copy` computes the same contraction as one matrix product
   ``weights (k, b) @ basis (b, o·i·P)``, which reads the basis in place; its backward needs no copy
   either. Same numbers up to the order of float additions.
"""

from __future__ import annotations

import torch

_PATCHED = False
#: escnn's own ``normalize_basis``, kept once patched (the tests compare against it)
ESCNN_NORMALIZE_BASIS = None


def lean_normalize_basis(basis: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """escnn's ``normalize_basis`` without the ``(B, O, O, P)`` intermediate; normalises ``basis`` in place."""
    b = basis.shape[0]
    assert basis.dim() > 2, basis.shape
    assert sizes.shape == (b,), (sizes.shape, b, basis.shape)
    # trace_o Σ_p (basis[b] basis[b]ᵀ)[o, o, p] = Σ_{o,i,p} basis[b, o, i, p]²
    norms = basis.pow(2).reshape(b, -1).sum(dim=1)
    norms = norms / sizes
    norms[norms < 1e-15] = 0
    norms = torch.sqrt(norms)
    norms[norms < 1e-6] = 1
    norms[norms != norms] = 1
    basis /= norms.view(b, *([1] * (basis.dim() - 1)))
    return basis


def expand_without_copy(self, weights: torch.Tensor) -> torch.Tensor:
    """``SingleBlockBasisExpansion.forward``: ``(k, b)`` coefficients → ``(k, o, i, *grid)`` filters."""
    assert len(weights.shape) == 2 and weights.shape[1] == self.dimension()
    basis = self.sampled_basis
    return (weights @ basis.reshape(basis.shape[0], -1)).reshape(weights.shape[0], *basis.shape[1:])


#: the buffers an escnn convolution derives from its weights in eval mode (fix 4)
DERIVED_BUFFERS = ("filter", "expanded_bias")


def _expand_into_buffers(conv) -> None:
    """Expand ``conv``'s filter (and bias) from its current weights into non-persistent buffers."""
    with torch.no_grad():
        weight_filter, bias = conv.expand_parameters()
    conv.register_buffer("filter", weight_filter, persistent=False)
    if bias is not None:
        conv.register_buffer("expanded_bias", bias, persistent=False)
    else:
        conv.expanded_bias = None


def _train_with_derived_filters(self, mode: bool = True):
    """escnn's ``_RdConv.train`` with the expanded filters kept out of the state dict and out of autograd."""
    if mode:
        for name in DERIVED_BUFFERS:
            if hasattr(self, name):
                delattr(self, name)
    elif self.training:  # entering eval: expand once from the current weights (as escnn does)
        _expand_into_buffers(self)
    return torch.nn.Module.train(self, mode)


def _reexpand_after_load(module, incompatible_keys) -> None:
    """Load post-hook: an eval-mode convolution's filters follow the weights just loaded."""
    if not module.training:
        _expand_into_buffers(module)


def _wrap_rdconv_init(original_init):
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        for name in DERIVED_BUFFERS:
            if name in self._buffers:
                self._non_persistent_buffers_set.add(name)
        self.register_load_state_dict_post_hook(_reexpand_after_load)

    __init__.__wrapped__ = original_init
    return __init__


def _wrap_rdconv_load(original_load):
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in DERIVED_BUFFERS:  # written by escnn's own eval mode before fix 4: derived, so ignored
            state_dict.pop(prefix + name, None)
        return original_load(self, state_dict, prefix, *args, **kwargs)

    return _load_from_state_dict


def patch_escnn() -> None:
    """Idempotently apply the four fixes (exact SVD; lean basis normalisation; copy-free expansion; derived
    filters kept out of state dicts)."""
    global _PATCHED, ESCNN_NORMALIZE_BASIS
    if _PATCHED:
        return
    from escnn.group import _numerical
    from escnn.nn.modules.basismanager import basisexpansion_singleblock
    from escnn.nn.modules.conv.rd_convolution import _RdConv

    _numerical.randomized_svd = None
    ESCNN_NORMALIZE_BASIS = basisexpansion_singleblock.normalize_basis
    basisexpansion_singleblock.normalize_basis = lean_normalize_basis
    basisexpansion_singleblock.SingleBlockBasisExpansion.forward = expand_without_copy
    _RdConv.__init__ = _wrap_rdconv_init(_RdConv.__init__)
    _RdConv._load_from_state_dict = _wrap_rdconv_load(_RdConv._load_from_state_dict)
    _RdConv.train = _train_with_derived_filters
    _PATCHED = True
