"""Vector Neuron layers (Deng et al. 2021, "Vector Neurons: A General Framework for SO(3)-Equivariant
Networks"), written for this package.

A Vector Neuron feature is a list of ``C`` 3-D vectors per element: tensors are ``(B, C, 3, *S)`` where ``S``
are any trailing set dimensions (points ``N``, neighbours ``k``, …). A rotation ``Q`` acts on the
coordinate axis (dim 2) only: ``(Q·x)[b, c, :, s] = Q x[b, c, :, s]``. Every layer here mixes channels
linearly with weights that do not touch dim 2, or rescales vectors by functions of dot products; both
commute with any orthogonal ``Q``, so unless a docstring says otherwise each layer is **O(3)-equivariant**
(hence SO(3)-equivariant), ``f(Q·x) = Q·f(x)``, and equivariant to permutations of the set dimensions that
it does not pool. There are no biases: a bias vector would be a fixed direction and break equivariance.
"""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.utils.checks import check_fraction, check_int

#: Added to squared norms before dividing by them. Deng et al. use 1e-6; it only matters for (near-)zero
#: vectors, where it keeps outputs and gradients finite.
VN_EPS = 1e-6


def _check_vn(x: torch.Tensor, name: str = "x") -> None:
    if x.dim() < 3 or x.shape[2] != 3:
        raise ValueError(
            f"{name} must be a Vector Neuron feature of shape (B, C, 3, ...), got {tuple(x.shape)}"
        )


def channel_mix(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``y[b, o, :, s] = Σ_c weight[o, c] x[b, c, :, s]``: ``(B, C_in, 3, *S)`` → ``(B, C_out, 3, *S)``."""
    return torch.einsum("oc,bc...->bo...", weight, x)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-channel dot product over the coordinate axis, kept as a size-1 dim: ``(B, C, 1, *S)``."""
    return (a * b).sum(dim=2, keepdim=True)


def vn_leaky_relu(
    q: torch.Tensor, direction: torch.Tensor, negative_slope: float, eps: float = VN_EPS
) -> torch.Tensor:
    """The VN non-linearity: keep ``q`` where ``⟨q, k⟩ ≥ 0``, else remove its component along ``k``.

    ``out = α q + (1 − α) (q if ⟨q, k⟩ ≥ 0 else q − ⟨q, k⟩ k / ‖k‖²)`` with ``α = negative_slope`` (``α = 0``:
    VN-ReLU). ``q`` ``(B, C, 3, *S)``; ``direction`` ``k`` of the same shape or with ``C = 1`` (shared).
    Only dot products decide and scale, so the map is O(3)-equivariant.
    """
    dot = _dot(q, direction)
    k_sq = _dot(direction, direction)
    projected = q - (dot / (k_sq + eps)) * direction
    rectified = torch.where(dot >= 0, q, projected)
    return negative_slope * q + (1.0 - negative_slope) * rectified


class VNLinear(nn.Module):
    """Channel-mixing linear map ``(B, C_in, 3, *S)`` → ``(B, C_out, 3, *S)``, no bias.

    Equivariance: O(3) (indeed GL(3): the weights never touch the coordinate axis) and permutations of ``S``.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        # nn.Linear only for its weight and its (Kaiming-uniform) initialisation.
        self.map = nn.Linear(in_channels, out_channels, bias=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.map.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_vn(x)
        return channel_mix(x, self.map.weight)


class VNLeakyReLU(nn.Module):
    """VN leaky ReLU with a learned direction ``k = U x`` per output channel (or one shared, ``U: C → 1``).

    ``(B, C, 3, *S)`` → same shape. Equivariance: O(3), permutations of ``S``.

    Args:
        channels: ``C``.
        negative_slope: ``α`` in :func:`vn_leaky_relu`; Deng et al. use 0.2, 0 gives VN-ReLU.
        share_nonlinearity: one direction for all channels instead of one per channel.
    """

    def __init__(self, channels: int, negative_slope: float = 0.2, share_nonlinearity: bool = False) -> None:
        super().__init__()
        self.direction = VNLinear(channels, 1 if share_nonlinearity else channels)
        self.negative_slope = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vn_leaky_relu(x, self.direction(x), self.negative_slope)


class VNBatchNorm(nn.Module):
    """Batch norm of the vector *norms*: ``x ↦ x / ‖x‖ · BN(‖x‖)`` per channel, directions untouched.

    ``(B, C, 3, *S)`` → same shape; statistics over the batch and all of ``S`` (one ``BatchNorm1d`` over the
    flattened set dims, which equals ``BatchNorm2d`` for ``S = (N, k)``). Norms are invariant, so the layer
    is O(3)-equivariant in training and in eval mode alike, also when each sample is rotated differently.
    A zero vector stays zero.
    """

    def __init__(self, channels: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(channels, momentum=momentum, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_vn(x)
        # clamp, not +eps, inside the sqrt: a zero vector must not get an infinite gradient from sqrt.
        norm = (x * x).sum(dim=2).clamp_min(VN_EPS * VN_EPS).sqrt()  # (B, C, *S)
        shape = norm.shape
        flat = norm.reshape(shape[0], shape[1], -1) if norm.dim() > 2 else norm
        normed = self.bn(flat).reshape(shape)
        return x * (normed / norm).unsqueeze(2)


class VNLinearLeakyReLU(nn.Module):
    """The VN block ``q = W x`` → (``VNBatchNorm``) → leaky ReLU along ``k = U x``.

    The direction is computed from the block's *input*, as in the VN paper (``q`` and ``k`` are two linear
    maps of the same features). ``(B, C_in, 3, *S)`` → ``(B, C_out, 3, *S)``. Equivariance: O(3),
    permutations of ``S``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        negative_slope: float = 0.2,
        batch_norm: bool = True,
        share_nonlinearity: bool = False,
    ) -> None:
        super().__init__()
        self.linear = VNLinear(in_channels, out_channels)
        self.batch_norm = VNBatchNorm(out_channels) if batch_norm else None
        self.direction = VNLinear(in_channels, 1 if share_nonlinearity else out_channels)
        self.negative_slope = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activate(self.linear(x), self.direction(x))

    def activate(self, q: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """The block after its two linear maps, given ``q = W x`` and ``k = U x`` computed another way (VN
        EdgeConv computes them without its edge features: ``prediction/vn_dgcnn.py``)."""
        if self.batch_norm is not None:
            q = self.batch_norm(q)
        return vn_leaky_relu(q, direction, self.negative_slope)


class VNDropout(nn.Module):
    """Dropout of whole vectors: one Bernoulli mask entry per (sample, channel, set element), shared by the
    three coordinates, rescaled by ``1 / (1 − p)``.

    Ordinary dropout on ``(B, C, 3, *S)`` would zero single coordinates and break equivariance; here, for a
    fixed mask, ``f(Q·x) = Q·f(x)`` exactly (O(3)), so a canonicalizer stays equivariant during training too.
    Identity in eval mode.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = check_fraction("p", p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_vn(x)
        if not self.training or self.p == 0.0:
            return x
        mask_shape = (x.shape[0], x.shape[1], 1, *x.shape[3:])
        keep = torch.empty(mask_shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


def vn_mean_pool(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Mean over a set dimension of ``(B, C, 3, *S)``; O(3)-equivariant, invariant to permuting ``dim``."""
    _check_vn(x)
    if dim % x.dim() < 3:
        raise ValueError(f"dim must be a set dimension (>= 3), got {dim}")
    return x.mean(dim=dim, keepdim=keepdim)


class VNMeanPool(nn.Module):
    """Module form of :func:`vn_mean_pool` over ``dim`` (default the last set dimension)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vn_mean_pool(x, self.dim)


class VNMaxPool(nn.Module):
    """VN max pooling: per channel, the set element whose vector has the largest ``⟨x, k⟩`` with a learned
    direction ``k = U x``. Pools the **last** dimension: ``(B, C, 3, *S, M)`` →
    ``(B, C, 3, *S)``.

    Equivariance: O(3) (the selection depends on invariant dot products only); invariant to permuting the
    pooled dimension, up to ties. The gradient flows into the selected element only.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.direction = VNLinear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_vn(x)
        if x.dim() < 4:
            raise ValueError(f"VNMaxPool needs a set dimension to pool, got shape {tuple(x.shape)}")
        score = _dot(x, self.direction(x))  # (B, C, 1, *S, M)
        index = score.argmax(dim=-1, keepdim=True).expand(*x.shape[:-1], 1)
        return torch.gather(x, -1, index).squeeze(-1)


class VNInvariant(nn.Module):
    """Rotation-invariant features from VN features (the "VN std feature" of Deng et al.).

    A small VN network predicts three equivariant vectors ``z = (z₁, z₂, z₃)`` per set element from ``x``;
    the output ``⟨x_c, z_j⟩`` does not change when both rotate: ``(x Qᵀ)(z Qᵀ)ᵀ = x zᵀ``.

    ``(B, C, 3, *S)`` → ``(invariant (B, C, 3, *S), frame (B, 3, 3, *S))``; ``invariant[:, c, j]`` is
    ``⟨x_c, z_j⟩``, to be flattened to ``3C`` ordinary channels. Invariance: O(3) (with
    ``normalize_frame``, the frame is orthonormalised by :func:`gram_schmidt` in its O(3) form, which keeps
    reflections exact), equivariance to permutations of ``S``.

    Args:
        channels: ``C``.
        negative_slope: of the hidden VN blocks.
        normalize_frame: orthonormalise ``z`` (invariant features then keep the norms of ``x``).
        hidden_layers: VN blocks before the read-out to ``z``, halving the width each time
            (``C → C/2 → C/4 …``, at least 3). Deng et al.'s point-cloud networks use 2 (their
            ``VNStdFeature``); the default 1 is the small variant.
        batch_norm: VN batch norm in the hidden blocks (Deng et al.'s networks use it).
    """

    def __init__(
        self,
        channels: int,
        negative_slope: float = 0.2,
        normalize_frame: bool = False,
        hidden_layers: int = 1,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        check_int("hidden_layers", hidden_layers, low=1)
        blocks: list[nn.Module] = []
        width = channels
        for depth in range(1, hidden_layers + 1):
            # at least 3 hidden vectors, or the frame could not span 3-D
            hidden = max(channels // 2**depth, 3)
            blocks.append(
                VNLinearLeakyReLU(width, hidden, negative_slope=negative_slope, batch_norm=batch_norm)
            )
            width = hidden
        # One block stays a bare module so that state dicts of the default layer keep their keys.
        self.hidden = blocks[0] if len(blocks) == 1 else nn.Sequential(*blocks)
        self.to_frame = VNLinear(width, 3)
        self.normalize_frame = bool(normalize_frame)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frame = self.to_frame(self.hidden(x))  # (B, 3, 3, *S): 3 vectors × 3 coordinates
        if self.normalize_frame:
            from canonical_network.groups.euclidean import gram_schmidt

            set_shape = frame.shape[3:]
            flat = frame.movedim(1, -1).movedim(1, -1).reshape(-1, 3, 3)  # (B·S, 3 vectors, 3 coords)
            flat = gram_schmidt(flat.transpose(1, 2), "O3").transpose(1, 2)
            frame = flat.reshape(frame.shape[0], *set_shape, 3, 3).movedim(-1, 1).movedim(-1, 1)
        return vn_in_frame(x, frame), frame


def vn_in_frame(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """Coordinates of VN features in per-element frames: ``out[:, c, j] = ⟨x_c, z_j⟩``.

    ``x`` ``(B, C, 3, *S)``, ``frame`` ``(B, 3, 3, *S)`` (three vectors ``z_j``, as :class:`VNInvariant`
    returns them) → ``(B, C, 3, *S)``. Invariant when ``x`` and ``frame`` rotate together (O(3)). Deng et
    al.'s segmentation networks use it to make skip features invariant with the frame of the global ones.
    """
    _check_vn(x)
    _check_vn(frame, "frame")
    return torch.einsum("bcd...,bjd...->bcj...", x, frame)


def vn_norms(x: torch.Tensor) -> torch.Tensor:
    """Per-channel vector norms ``(B, C, *S)``: the simplest O(3)-invariant read-out of a VN feature."""
    _check_vn(x)
    return (x * x).sum(dim=2).clamp_min(VN_EPS * VN_EPS).sqrt()


__all__ = [
    "VN_EPS",
    "VNBatchNorm",
    "VNDropout",
    "VNInvariant",
    "VNLeakyReLU",
    "VNLinear",
    "VNLinearLeakyReLU",
    "VNMaxPool",
    "VNMeanPool",
    "channel_mix",
    "vn_in_frame",
    "vn_leaky_relu",
    "vn_mean_pool",
    "vn_norms",
]
