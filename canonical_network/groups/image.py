"""Planar rotations and reflections acting on images (the pnm groups of paper §4.1, "Image Input").

Conventions, shared by every image canonicalizer, the data pipeline and the tests:

* An angle is in degrees, counter-clockwise as the image is displayed (row 0 at the top). Rotating by
  +90° equals ``torch.rot90(images, 1, dims=(-2, -1))``, which is exact on the pixel grid.
* The reflection is the horizontal flip (``images.flip(-1)``).
* A group element acts as  g·x = rotate(flip^r(x), angle): reflect first, then rotate. This is escnn's
  convention for ``flipRot2dOnR2`` with its element (r, k) = rotation by k·360°/N after flip^r, so the
  index of a G-CNN's regular feature maps to an element without any reordering.

Rotations go through kornia's bilinear ``rotate`` about the image centre; it is differentiable with
respect to the angle, which the straight-through estimator of Appendix I relies on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import kornia
import torch


def rotate_deg(images: torch.Tensor, angle_deg: torch.Tensor | float) -> torch.Tensor:
    """Rotate (B, C, H, W) images counter-clockwise by ``angle_deg`` (scalar or (B,)) about their centre."""
    if not torch.is_tensor(angle_deg):
        angle_deg = torch.full((images.shape[0],), float(angle_deg), device=images.device)
    angle_deg = angle_deg.to(device=images.device, dtype=images.dtype).expand(images.shape[0])
    return kornia.geometry.transform.rotate(images, angle_deg, mode="bilinear", padding_mode="zeros")


@dataclass
class PlanarElement:
    """A batch of elements of C_N, D_N or SO(2) acting on images (a :class:`~canonical_network.groups.GroupElement`).

    Attributes:
        angle_deg: (B,) rotation angle in degrees; carries the straight-through gradient in training.
        reflect: (B,) 1.0 where the element includes the horizontal flip, else 0.0 (float so that the
            straight-through gradient can flow through it as well).
        index: (B,) int64 index of the element in escnn's ordering (reflect · N + k), or ``None`` for
            continuous canonicalizers such as PCA.
        logits: (B, |G|) for finite groups chosen from scores: the logits of the selection distribution
            (the canonicalizer's scores divided by its temperature), as computed in the forward pass that
            chose this element, so that the canonicalization prior needs no second forward; ``None`` otherwise.
    """

    angle_deg: torch.Tensor
    reflect: torch.Tensor
    index: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    def matrix(self) -> torch.Tensor:
        """``(B, 2, 2)`` action on display coordinates (x right, y up): rotation ∘ flip^r (flip: x ↦ −x)."""
        theta = torch.deg2rad(self.angle_deg)
        cos, sin = theta.cos(), theta.sin()
        rotation = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
        flip_x = 1.0 - 2.0 * self.reflect.to(rotation.dtype)  # −1 where the element reflects
        return rotation * torch.stack([flip_x, torch.ones_like(flip_x)], -1).unsqueeze(-2)


def _blend_flip(images: torch.Tensor, reflect: torch.Tensor) -> torch.Tensor:
    # reflect is exactly 0 or 1 in the forward pass; blending keeps its straight-through gradient.
    r = reflect.to(images.dtype).view(-1, 1, 1, 1)
    return (1.0 - r) * images + r * images.flip(-1)


def act(images: torch.Tensor, g: PlanarElement) -> torch.Tensor:
    """g · images for (B, C, H, W) images: flip (if g reflects), then rotate by g's angle."""
    return rotate_deg(_blend_flip(images, g.reflect), g.angle_deg)


def act_inverse(images: torch.Tensor, g: PlanarElement) -> torch.Tensor:
    """g⁻¹ · images: rotate back by g's angle, then undo the flip."""
    return _blend_flip(rotate_deg(images, -g.angle_deg), g.reflect)


def element_angles_deg(num_rotations: int, reflection: bool, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Angle (deg) and reflection flag of every element of C_N (N elements) or D_N (2N), in escnn order."""
    angles = torch.arange(num_rotations, device=device, dtype=torch.float32) * (360.0 / num_rotations)
    reflect = torch.zeros(num_rotations, device=device)
    if reflection:
        angles = torch.cat([angles, angles])
        reflect = torch.cat([reflect, torch.ones(num_rotations, device=device)])
    return angles, reflect


def act_exact(images: torch.Tensor, angle_deg: float, reflect: bool = False) -> torch.Tensor:
    """The same element applied to a whole batch, exactly on the pixel grid where it can be.

    Multiples of 90° go through ``torch.rot90`` (no interpolation, so an invariant model's outputs must
    match to float precision); any other angle falls back to the bilinear :func:`rotate_deg`.
    """
    if reflect:
        images = images.flip(-1)
    quarter_turns = angle_deg / 90.0
    if float(quarter_turns).is_integer():
        return torch.rot90(images, int(quarter_turns) % 4, dims=(-2, -1))
    return rotate_deg(images, float(angle_deg))


def planar_group(group_name: str) -> tuple[int, bool] | None:
    """``(N, reflection)`` of a finite planar group named as canonicalizers name it (``"C4"`` → (4, False),
    ``"D8"`` → (8, True)); ``None`` for any other name (``"SO(2)"``, ``"trivial"``, ...). ``"C0"``/``"D0"``
    name no group: ``ValueError``."""
    match = re.fullmatch(r"([CD])(\d+)", group_name)
    if match is None:
        return None
    if int(match.group(2)) < 1:
        raise ValueError(f"group {group_name!r}: C_N and D_N need N >= 1 (C1 is the trivial group)")
    return int(match.group(2)), match.group(1) == "D"


def _autocast(images: torch.Tensor) -> bool:
    """Whether autocast is on for ``images``' device (mixed precision: it casts inside each op)."""
    try:
        return torch.is_autocast_enabled(images.device.type)
    except TypeError:  # an older torch: no device argument
        return torch.is_autocast_enabled()


def _batch_advice(shape: tuple[int, ...], in_channels: int | None) -> str:
    """What to do with an input of the wrong rank, from its shape: a single image, a batch without its channel axis,
    one grayscale image."""
    if len(shape) == 3:
        single = in_channels is not None and shape[0] == in_channels or in_channels is None and shape[0] in (1, 3)
        if single:
            return f"a single {shape[0]}-channel image? add the batch dimension: images[None] -> {(1, *shape)}"
        channels = in_channels or 1
        if channels == 1:
            return f"a batch of {shape[0]} images without their channel axis? add it: images[:, None] -> " \
                   f"{(shape[0], 1, *shape[1:])}"
        return f"a batch of images without their {channels} channels? give (B, {channels}, H, W)"
    if len(shape) == 2:
        return f"one image of {shape[0]}×{shape[1]} pixels? add batch and channel dimensions: images[None, None] " \
               f"-> {(1, 1, *shape)}"
    if len(shape) > 4:
        return "more than one batch dimension? merge them: images.flatten(0, -4)"
    return "an image batch is 4-dimensional"


def check_images(images, who: str, in_channels: int | None = None, dtype: torch.dtype | None = None,
                 image_size: int | None = None, size_key: str = "image_size") -> None:
    """One clear error for an input an image component cannot take: not a non-empty ``(B, C, H, W)`` batch of
    floating-point images (the advice says what the shape looks like: a single image, a batch without its channel
    axis), another channel count than ``in_channels``, another side than ``image_size`` (``size_key`` names its
    config key), or another dtype than its weights' ``dtype`` (``who`` names the component in the message)."""
    shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"{who} takes a torch.Tensor batch of images (B, C, H, W); got a {shape}")
    if images.dim() != 4:
        raise ValueError(f"{who} takes a batch of images of shape (B, C, H, W); got shape {shape}: "
                         f"{_batch_advice(shape, in_channels)}")
    if images.shape[0] == 0:
        raise ValueError(f"{who} takes a batch of at least one image; got shape {shape}")
    if in_channels is not None and images.shape[1] != in_channels:
        raise ValueError(f"{who} was built for {in_channels}-channel images (in_channels={in_channels}); "
                         f"got {images.shape[1]} channels, shape {shape}")
    if image_size is not None and tuple(images.shape[-2:]) != (image_size, image_size):
        raise ValueError(f"{who} was built for {image_size}×{image_size} images ({size_key}={image_size}); got "
                         f"{images.shape[-2]}×{images.shape[-1]}, shape {shape}: resize or pad the images, or build "
                         f"it with {size_key}={images.shape[-1]}" if images.shape[-2] == images.shape[-1] else
                         f"{who} was built for {image_size}×{image_size} images ({size_key}={image_size}); got "
                         f"{images.shape[-2]}×{images.shape[-1]}, shape {shape}: it takes square images")
    if not images.is_floating_point():
        raise ValueError(f"{who} takes floating-point images (float32 or float64); got {images.dtype} "
                         "(e.g. images.float() / 255 for 8-bit pixels)")
    if dtype is not None and images.dtype != dtype and not _autocast(images):
        raise ValueError(f"{who} has {dtype} weights; got {images.dtype} images: convert one to the other "
                         f"(images.to({dtype}) or the model's .to({images.dtype}))")


def group_elements(num_rotations: int, reflection: bool) -> list[tuple[float, bool]]:
    """Every element of C_N (D_N with ``reflection``) as ``(angle_deg, reflect)``, in escnn's order."""
    angles, reflect = element_angles_deg(num_rotations, reflection)
    return [(float(a), bool(r)) for a, r in zip(angles.tolist(), reflect.tolist(), strict=True)]


def orbit(images: torch.Tensor, elements: list[tuple[float, bool]]) -> Iterator[tuple[tuple[float, bool], torch.Tensor]]:
    """``(element, g · images)`` for each ``element = (angle_deg, reflect)``, the same ``g`` for the whole batch
    (B, C, H, W), applied by :func:`act_exact` (``rot90`` and flips exactly, other angles bilinearly).

    The one definition of "a batch under a group's elements": the group-orbit test evaluation of
    :class:`~canonical_network.tasks.image_classification.ImageClassificationTask` and the image symmetry of
    :mod:`canonical_network.diagnostics` both iterate it.
    """
    for angle_deg, reflect in elements:
        yield (angle_deg, reflect), act_exact(images, angle_deg, reflect)


def constant_element(
    angle_deg: float, reflect: bool, batch_size: int, *, dtype: torch.dtype = torch.float32, device=None
) -> PlanarElement:
    """The same element ``(angle_deg, reflect)`` for every sample of a batch, as a :class:`PlanarElement`."""
    angle = torch.full((batch_size,), float(angle_deg), dtype=dtype, device=device)
    return PlanarElement(angle_deg=angle, reflect=torch.full_like(angle, float(reflect)))
