"""The 3-D Euclidean group E(3) = O(3) ⋉ T(3): sampling, Gram–Schmidt frames, and actions on points.

Convention used everywhere in the package
------------------------------------------
Points and velocities are **row vectors**, batched as ``(B, N, 3)``. A group element ``g = (R, t)`` with
``R`` a ``(B, 3, 3)`` orthogonal matrix and ``t`` a ``(B, 3)`` translation acts as

* points:     ``x ↦ x Rᵀ + t``      (the column-vector ``p ↦ R p + t`` of the paper, §4.1 "Point Cloud Input")
* velocities: ``v ↦ v Rᵀ``          (differences of points: translations do not act)

and its inverse as ``x ↦ (x − t) R`` and ``v ↦ v R``. Composition: ``(R₁, t₁)·(R₂, t₂) = (R₁R₂, R₁t₂ + t₁)``.

A canonicalizer returns ``h(x) = (R, t)`` whose **columns** ``R[:, :, i]`` are the learned frame axes
(:func:`gram_schmidt` builds them from three equivariant vectors). Equivariance ``h(g·x) = g·h(x)`` means
``R ↦ Q R`` and ``t ↦ Q t + s`` for ``g = (Q, s)``, so the canonical input
``(x Qᵀ + s − Q t − s) Q R = (x − t) R`` is invariant: the canonical coordinates are the coordinates of the
input in the learned frame.

Sampling uses the Haar (uniform) measure: SO(3) through normalised Gaussian quaternions, O(3) as a uniform
SO(3) element times a uniform sign ``±I`` (``−I`` has determinant −1 in 3-D), rotations about one axis
with a uniform angle (the "z" protocol of §5.3; ModelNet/ShapeNet augmentation rotates about the up axis).
Every sampler takes a ``torch.Generator`` so that tests and data pipelines are reproducible.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

Group3D = Literal["SO3", "O3"]
Axis = Literal["x", "y", "z"]

_AXES: dict[str, int] = {"x": 0, "y": 1, "z": 2}
_GROUPS: tuple[str, ...] = ("SO3", "O3")


class _EuclideanFields(NamedTuple):
    rotation: torch.Tensor
    translation: torch.Tensor


class EuclideanTransform(_EuclideanFields):
    """One element ``(R, t)`` of E(3) per sample; a ``NamedTuple``, so it unpacks as ``R, t = g``.

    Attributes:
        rotation: ``(B, 3, 3)`` orthogonal matrix (determinant ±1); its columns are the frame axes.
        translation: ``(B, 3)``.
        degenerate: ``(B,)`` bool, or ``None`` when the element does not say: ``True`` where the canonicalizer
            could build no equivariant frame for the input and took a fixed fallback instead (the input is left
            unchanged by some rotations or reflections, its stabilizer: a system of one particle, a planar or
            collinear system, a symmetric cloud; :func:`gram_schmidt_frame`). There the element is not
            equivariant; the composition is equivariant only up to the stabilizer (relaxed equivariance,
            paper Appendix A: ``h(g·x) ∈ g · h(x) · Stab(x)``), and ``diagnose`` reports the rate
            (``pose.degenerate_rate``).
    """

    degenerate: torch.Tensor | None = None

    def marked(self, degenerate: torch.Tensor | None) -> EuclideanTransform:
        """This element with its :attr:`degenerate` mask set (``(B,)`` bool); returns itself."""
        self.degenerate = degenerate
        return self

    @property
    def index(self) -> None:
        """Continuous group: no enumeration (:class:`~canonical_network.groups.GroupElement`)."""
        return None

    def matrix(self) -> torch.Tensor:
        """The linear part ``R`` ``(B, 3, 3)`` (:class:`~canonical_network.groups.GroupElement`)."""
        return self.rotation

    @classmethod
    def from_rotation(cls, rotation: torch.Tensor, degenerate: torch.Tensor | None = None) -> EuclideanTransform:
        """``(R, 0)``: a rotation about the origin (point-cloud canonicalizers choose only ``R``)."""
        return cls(rotation, rotation.new_zeros(rotation.shape[:-1])).marked(degenerate)

    def apply_to_points(self, x: torch.Tensor) -> torch.Tensor:
        """``x Rᵀ + t`` for points ``(B, N, 3)``."""
        return apply_euclidean(x, self.rotation, self.translation)

    def apply_to_vectors(self, v: torch.Tensor) -> torch.Tensor:
        """``v Rᵀ`` for velocities/directions ``(B, N, 3)``."""
        return apply_rotation(v, self.rotation)

    def inverse_on_points(self, x: torch.Tensor) -> torch.Tensor:
        """``(x − t) R``: points ``(B, N, 3)`` expressed in the frame ``(R, t)``."""
        return invert_euclidean(x, self.rotation, self.translation)

    def inverse_on_vectors(self, v: torch.Tensor) -> torch.Tensor:
        """``v R`` for velocities ``(B, N, 3)``."""
        return invert_rotation(v, self.rotation)


# ---------------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------------
def apply_rotation(v: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``v Rᵀ``: rotate row vectors ``(B, N, 3)`` (or ``(B, 3)``) by ``R`` ``(B, 3, 3)``."""
    if v.dim() == rotation.dim() - 1:
        return (v.unsqueeze(-2) @ rotation.transpose(-1, -2)).squeeze(-2)
    return v @ rotation.transpose(-1, -2)


def invert_rotation(v: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """``v R`` (``R⁻¹ = Rᵀ`` acting on row vectors) for ``(B, N, 3)`` or ``(B, 3)``."""
    if v.dim() == rotation.dim() - 1:
        return (v.unsqueeze(-2) @ rotation).squeeze(-2)
    return v @ rotation


def apply_euclidean(x: torch.Tensor, rotation: torch.Tensor, translation: torch.Tensor) -> torch.Tensor:
    """``x Rᵀ + t`` for points ``(B, N, 3)``, ``R`` ``(B, 3, 3)``, ``t`` ``(B, 3)``."""
    return apply_rotation(x, rotation) + translation.unsqueeze(-2)


def invert_euclidean(x: torch.Tensor, rotation: torch.Tensor, translation: torch.Tensor) -> torch.Tensor:
    """``(x − t) R``: the inverse of :func:`apply_euclidean`, for points ``(B, N, 3)``."""
    return invert_rotation(x - translation.unsqueeze(-2), rotation)


# ---------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------
def _sample_device(generator: torch.Generator | None, device: torch.device | str | None) -> torch.device:
    # A generator only draws on its own device; sample there and move afterwards.
    if generator is not None:
        return generator.device
    return torch.device(device) if device is not None else torch.device("cpu")


def quaternion_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Quaternions ``(B, 4)`` as ``(w, x, y, z)``, normalised here → rotation matrices ``(B, 3, 3)``."""
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
    w, x, y, z = q.unbind(-1)
    rows = (
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    )  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(*q.shape[:-1], 3, 3)


def random_rotations(
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniform (Haar) samples of SO(3): ``(B, 3, 3)``, orthogonal with determinant +1.

    A standard Gaussian in R⁴ is rotation invariant, so its direction is uniform on S³, and unit
    quaternions cover SO(3) twice uniformly.
    """
    q = torch.randn(batch_size, 4, generator=generator, dtype=dtype, device=_sample_device(generator, device))
    return quaternion_to_matrix(q).to(device if device is not None else q.device)


def random_orthogonal(
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniform (Haar) samples of O(3): ``(B, 3, 3)``; determinant −1 with probability 1/2.

    ``O(3) = SO(3) × {I, −I}`` in odd dimension, so a uniform rotation times a uniform sign is Haar on O(3).
    """
    rotation = random_rotations(batch_size, generator, dtype=dtype, device=device)
    sign = torch.randint(0, 2, (batch_size,), generator=generator, device=_sample_device(generator, device))
    sign = (1 - 2 * sign).to(dtype=dtype, device=rotation.device)
    return rotation * sign.view(-1, 1, 1)


def axis_rotation(angle_rad: torch.Tensor, axis: Axis = "z") -> torch.Tensor:
    """Rotations by ``angle_rad`` ``(B,)`` (right-handed, counter-clockwise) about ``axis``: ``(B, 3, 3)``."""
    if axis not in _AXES:
        raise ValueError(f"axis must be one of {sorted(_AXES)}, got {axis!r}")
    k = _AXES[axis]
    i, j = (k + 1) % 3, (k + 2) % 3  # (x, y) for z, (y, z) for x, (z, x) for y: keeps right-handedness
    cos, sin = torch.cos(angle_rad), torch.sin(angle_rad)
    matrix = torch.zeros(*angle_rad.shape, 3, 3, dtype=angle_rad.dtype, device=angle_rad.device)
    matrix[..., k, k] = 1
    matrix[..., i, i] = cos
    matrix[..., j, j] = cos
    matrix[..., i, j] = -sin
    matrix[..., j, i] = sin
    return matrix


def axis_angle_rotation(axis: torch.Tensor, angle_rad: torch.Tensor) -> torch.Tensor:
    """Rotations by ``angle_rad`` ``(B,)`` about the directions ``axis`` ``(B, 3)`` (normalised here), right-
    handed: ``(B, 3, 3)`` by Rodrigues' formula ``I + sin θ K + (1 − cos θ) K²`` (``K v = n × v``)."""
    n = axis / axis.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(axis.dtype).tiny)
    x, y, z = n.unbind(-1)
    zero = torch.zeros_like(x)
    cross = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=-1).reshape(*n.shape[:-1], 3, 3)
    sin = torch.sin(angle_rad).view(*angle_rad.shape, 1, 1)
    versine = (1 - torch.cos(angle_rad)).view(*angle_rad.shape, 1, 1)
    eye = torch.eye(3, dtype=axis.dtype, device=axis.device)
    return eye + sin * cross + versine * (cross @ cross)


def random_axis_rotations(
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    axis: Axis = "z",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Rotations about ``axis`` by a uniform angle in [0, 2π): ``(B, 3, 3)``, the "z" protocol of §5.3."""
    u = torch.rand(batch_size, generator=generator, dtype=dtype, device=_sample_device(generator, device))
    angle = 2 * torch.pi * u
    return axis_rotation(angle, axis).to(device if device is not None else angle.device)


def random_translations(
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Gaussian translations ``(B, 3)`` with standard deviation ``scale`` (T(3) has no uniform measure)."""
    t = torch.randn(batch_size, 3, generator=generator, dtype=dtype, device=_sample_device(generator, device))
    return (scale * t).to(device if device is not None else t.device)


def random_euclidean(
    batch_size: int,
    generator: torch.Generator | None = None,
    *,
    group: Group3D = "O3",
    translation_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> EuclideanTransform:
    """``(R, t)`` with ``R`` uniform on ``group`` ("SO3" → SE(3), "O3" → E(3)) and Gaussian ``t``."""
    _check_group(group)
    sample = random_rotations if group == "SO3" else random_orthogonal
    rotation = sample(batch_size, generator, dtype=dtype, device=device)
    translation = random_translations(
        batch_size, generator, scale=translation_scale, dtype=dtype, device=device
    )
    return EuclideanTransform(rotation, translation)


# ---------------------------------------------------------------------------------------------------------
# Gram–Schmidt
# ---------------------------------------------------------------------------------------------------------
def _check_group(group: str) -> None:
    if group not in _GROUPS:
        raise ValueError(f"group must be one of {list(_GROUPS)}, got {group!r}")


def _sum_sq(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(dim=-1)


def _project_out(candidates: torch.Tensor, basis: list[torch.Tensor]) -> torch.Tensor:
    """Remove from ``candidates`` ``(B, K, 3)`` their components along the unit vectors ``basis`` ``(B, 3)``.

    Two passes ("twice is enough", Parlett 1980): one pass leaves a component along the basis of the size
    of the rounding error of the *input*, which after normalising a short residual is no longer small; the
    second pass brings orthogonality back to machine precision.
    """
    for _ in range(2):
        for e in basis:
            e = e.unsqueeze(-2)
            candidates = candidates - (candidates * e).sum(-1, keepdim=True) * e
    return candidates


def _first_valid(residuals: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Unit vector along the first residual ``(B, K, 3)`` whose ``valid`` ``(B, K)`` flag is set."""
    return _first_valid_with_index(residuals, valid)[0]


def _first_valid_with_index(residuals: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_first_valid` and the index ``(B,)`` of the candidate chosen."""
    # argmax returns the first maximal index, i.e. the first valid candidate in priority order.
    index = valid.to(torch.uint8).argmax(dim=-1)
    chosen = torch.gather(residuals, 1, index.view(-1, 1, 1).expand(-1, 1, 3)).squeeze(1)
    # The chosen residual has norm > tol (the last candidates are always valid), so the clamp only guards
    # the gradient of the unchosen rows of a batch; it never changes a value that is used.
    norm = _sum_sq(chosen).clamp_min(torch.finfo(chosen.dtype).tiny).sqrt()
    return chosen / norm.unsqueeze(-1), index


def gram_schmidt(
    vectors: torch.Tensor,
    group: Group3D = "O3",
    *,
    eps: float = 1e-6,
    parallel_tol: float | None = None,
) -> torch.Tensor:
    """The orthogonal matrix of :func:`gram_schmidt_frame` (without its degeneracy mask)."""
    return gram_schmidt_frame(vectors, group, eps=eps, parallel_tol=parallel_tol)[0]


def gram_schmidt_frame(
    vectors: torch.Tensor,
    group: Group3D = "O3",
    *,
    eps: float = 1e-6,
    parallel_tol: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormalise three 3-D vectors into an orthogonal matrix, robustly (paper §4.1 and Appendix F), and say
    where the result is not equivariant.

    Args:
        vectors: ``(B, 3, 3)`` whose **columns** ``vectors[:, :, i]`` are the three input vectors
            ``v₁, v₂, v₃`` (a Vector Neuron output ``(B, 3 channels, 3)`` is passed as ``.transpose(1, 2)``).
        group: "O3" — the textbook process, ``e₃`` from ``v₃``; the result may have determinant −1 and is
            O(3)-equivariant (N-body, where reflections are symmetries). "SO3" — ``e₃ = e₁ × e₂``;
            determinant +1 always, equivariant under rotations only (the cross product flips sign under
            reflections); used for point clouds, whose canonical pose must not be a mirror image.
        eps: the frame is treated as zero when ``max_i ‖v_i‖ ≤ eps`` (e.g. coincident particles with zero
            velocity give exactly zero vectors; float32 cancellation leaves ~1e-7 noise). Vector Neuron
            outputs on unit-scale data are O(1), so 1e-6 separates signal from rounding noise.
        parallel_tol: a residual (the part of a candidate orthogonal to the axes already chosen) counts as
            zero when its norm is ``≤ parallel_tol · max_i ‖v_i‖``. Default ``sqrt(finfo(dtype).eps)``
            (3.5e-4 in float32, 1.5e-8 in float64): below it the residual's direction is dominated by
            rounding error and its gradient by ``1/‖residual‖``.

    Returns:
        ``(B, 3, 3)`` orthogonal matrix whose columns are ``e₁, e₂, e₃``: ``G(Q V) = Q G(V)`` for ``Q`` in
        O(3) ("O3") or SO(3) ("SO3") on non-degenerate inputs. Values and gradients are always finite.
        And ``degenerate`` ``(B,)`` bool: the frame took a fallback that is not equivariant under ``group``
        (a standard axis for ``e₁`` or ``e₂``; for "O3" also ``e₁ × e₂`` for ``e₃``, which a reflection does not
        follow), so the input vectors are fixed by some of ``group`` besides the identity.

    Degenerate inputs. Each axis ``e_k`` is the normalised residual of the *first* candidate, in the order
    below, whose residual is not zero in the sense above:

    * ``e₁``, ``e₂``: ``v₁, v₂, v₃``, then the standard axes ``x̂, ŷ, ẑ``;
    * ``e₃`` ("O3"): ``v₁, v₂, v₃``, then ``e₁ × e₂``; ("SO3"): always ``e₁ × e₂``.

    On generic inputs this is exactly the textbook process (``v₁ → e₁``, ``v₂ → e₂``, ``v₃ → e₃``). When
    ``v₂ ∥ v₁`` the next *equivariant* candidate ``v₃`` is used, so the frame stays equivariant as long as
    the input vectors span two dimensions; a missing third direction falls back to ``±e₁ × e₂``, equivariant
    under rotations. Only when every input vector is parallel (or zero) does the standard-axis fallback
    break equivariance — unavoidably: such an input is fixed by the rotations about its axis (by all of
    O(3) if zero), so no equivariant frame exists; the paper's *relaxed* equivariance (Appendix A) is what
    holds there. All-zero input gives the identity (determinant +1). The choice of candidate is a hard
    switch, so the output is discontinuous at those thresholds, and the gradient flows only through the
    candidates actually used.
    """
    _check_group(group)
    if vectors.shape[-2:] != (3, 3) or vectors.dim() != 3:
        raise ValueError(f"vectors must have shape (B, 3, 3), got {tuple(vectors.shape)}")
    dtype, device = vectors.dtype, vectors.device
    tol = float(torch.finfo(dtype).eps) ** 0.5 if parallel_tol is None else float(parallel_tol)
    # Some standard axis always keeps a residual of norm >= 1/sqrt(3) after removing two axes, so any
    # tol below that guarantees a valid candidate for every column.
    if not 0.0 < tol < 3.0**-0.5:
        raise ValueError(f"parallel_tol must lie in (0, 1/sqrt(3)), got {parallel_tol!r}")

    v = vectors.transpose(1, 2)  # (B, 3 vectors, 3 coordinates)
    # Gram–Schmidt is invariant to a common positive scale; dividing by the largest norm makes the
    # thresholds relative and keeps tiny-but-nonzero frames away from underflow.
    # clamp before sqrt: sqrt has an infinite derivative at 0, which would turn the zero gradient of an
    # all-zero (hence unused) input into NaN.
    scale = _sum_sq(v).amax(dim=-1).clamp_min(torch.finfo(dtype).tiny).sqrt()  # (B,)
    nonzero = scale > eps
    safe_scale = torch.where(nonzero, scale, torch.ones_like(scale))
    v = v / safe_scale.view(-1, 1, 1)

    batch = v.shape[0]
    axes = torch.eye(3, dtype=dtype, device=device).expand(batch, 3, 3)
    # The input vectors are candidates only when the frame is not zero; the standard axes always are.
    input_ok = nonzero.unsqueeze(-1).expand(batch, 3)
    always = torch.ones(batch, 3, dtype=torch.bool, device=device)

    candidates = torch.cat([v, axes], dim=1)  # (B, 6, 3)
    allowed = torch.cat([input_ok, always], dim=1)
    basis: list[torch.Tensor] = []
    degenerate = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(2):
        residuals = _project_out(candidates, basis)
        valid = allowed & (_sum_sq(residuals) > tol * tol)
        axis, index = _first_valid_with_index(residuals, valid)
        basis.append(axis)
        degenerate = degenerate | (index >= 3)  # a standard axis: fixed, whatever the input's pose

    cross = torch.linalg.cross(basis[0], basis[1], dim=-1)
    if group == "SO3":
        basis.append(cross)
    else:
        # e₁ × e₂ is a unit vector orthogonal to both, so it is always a valid last candidate.
        candidates = torch.cat([v, cross.unsqueeze(1)], dim=1)  # (B, 4, 3)
        allowed = torch.cat([input_ok, always[:, :1]], dim=1)
        residuals = _project_out(candidates, basis)
        valid = allowed & (_sum_sq(residuals) > tol * tol)
        axis, index = _first_valid_with_index(residuals, valid)
        basis.append(axis)
        degenerate = degenerate | (index >= 3)  # e₁ × e₂: a reflection does not follow it
    return torch.stack(basis, dim=-1), degenerate  # columns are e₁, e₂, e₃
