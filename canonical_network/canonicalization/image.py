"""Image canonicalizers: the paper's shallow G-CNN (§4.1, §5.1, Appendix I) and the PCA baseline.

Both return a :class:`~canonical_network.groups.image.PlanarElement` and the input mapped by its inverse,
so that ``CanonicalizedModel`` turns any image backbone into a rotation (and optionally reflection)
invariant classifier.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec, discrete_frame
from canonical_network.groups.image import (
    PlanarElement,
    act_inverse,
    check_images,
    element_angles_deg,
    rotate_deg,
)
from canonical_network.utils.checks import check_bool, check_choice, check_fraction, check_int, check_positive

FILTERS = ("steerable", "free")
#: how a discrete canonicalizer turns its scores into a choice (``canonicalization.selection``)
SELECTIONS = ("ste", "gumbel", "soft")


class RotatedFilterLifting(nn.Module):
    """Lifting convolution with free (unconstrained) filters, each used in N rotated copies.

    The layer of the authors' code (``models/equivariant_layers.py`` in oumarkaba/canonical_network): a
    bank of ``out_fields × in_channels`` free ``k × k`` filters, rotated by every angle ``j·360°/N`` of C_N,
    so output channel ``(c, j)`` (escnn's regular-field layout, field-major) correlates the image with
    filter ``c`` rotated by element ``j``. Rotating the image by element ``r`` then moves the response of
    copy ``j`` to copy ``j + r``: the output is a regular feature field of C_N, as escnn's lifting
    ``R2Conv`` gives, and escnn's group convolutions can follow it. Multiples of 90° rotate the filters
    with ``rot90`` (exact on the grid); other angles with kornia's bilinear rotation, so for N ∤ 4 the
    equivariance holds up to that interpolation, as in the authors' code.

    Unlike escnn's steerable basis, the filters are not band-limited: ``k²`` free weights per filter
    (12,544 for 16 fields of 28 × 28) against escnn's few hundred basis coefficients. Initialised as
    PyTorch initialises ``Conv2d`` (Kaiming uniform, a = √5), bias zero and shared by the N copies of a
    field, as the authors do.

    Shapes: ``(B, in_channels, H, W)`` → ``(B, out_fields·N, H − k + 1, W − k + 1)``.
    """

    def __init__(self, in_channels: int, out_fields: int, kernel_size: int, num_rotations: int) -> None:
        super().__init__()
        self.num_rotations = num_rotations
        self.weight = nn.Parameter(torch.empty(out_fields, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_fields))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def rotated_filters(self) -> torch.Tensor:
        """``(out_fields·N, in_channels, k, k)``: every filter under every rotation of C_N, field-major.

        When 4 divides N, only the first quarter turn is interpolated and the other copies are its exact
        ``rot90`` images, so rotating the input by 90° permutes the copies exactly (C_4 ⊂ C_N is exact).
        """
        n = self.num_rotations
        per_quarter = n // 4 if n % 4 == 0 else n
        base = [self.weight if j == 0 else rotate_deg(self.weight, 360.0 * j / n) for j in range(per_quarter)]
        copies = []
        for j in range(n):
            quarter, step = divmod(j, per_quarter)
            copies.append(torch.rot90(base[step], quarter, dims=(-2, -1)) if quarter else base[step])
        if n % 4 and n % 2 == 0:  # 180° is exact on the grid too
            copies[n // 2] = torch.rot90(self.weight, 2, dims=(-2, -1))
        return torch.stack(copies, dim=1).flatten(0, 1)  # (out, N, in, k, k) → (out·N, in, k, k)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        bias = self.bias.repeat_interleave(self.num_rotations)
        return F.conv2d(images, self.rotated_filters(), bias)


class GCNNCanonicalizer(Canonicalizer):
    """CN(pN): a shallow G-CNN built with escnn that scores every element of C_N (or D_N).

    Architecture (paper §5.1): a lifting convolution from the image to ``hidden_channels`` regular fields
    of the group, with an image-sized kernel by default, then ``num_layers - 1`` blocks of ReLU + 1×1 group
    convolution. The feature map is averaged over fields and pixels into one score per group element
    (Appendix I). The scores divided by ``temperature`` are the logits of the selection distribution
    ``p = softmax(scores / temperature)``; ``selection`` says how the element is chosen from it:

    * ``"ste"`` (the paper's, Appendix I): the argmax, with the straight-through estimator (Bengio et al.
      2013) passing the gradient of ``p`` to the chosen element in training, so the scores are learned end
      to end; the forward values are the same in training and eval.
    * ``"gumbel"``: Gumbel-softmax straight-through (Jang et al. 2017): in training the element is sampled
      from ``p`` by the Gumbel-max trick, ``argmax(scores / temperature + G)`` with G i.i.d. Gumbel(0, 1)
      noise, and the gradient is that of ``softmax(scores / temperature + G)``; in eval (and when frozen) no
      noise: the deterministic argmax, as ``"ste"``.
    * ``"soft"``: no choice: the canonical image is the blend ``Σ_k p_k · g_k⁻¹ · x`` of the input mapped by
      every element's inverse, weighted by ``p`` in training *and* eval (a weighted average over the orbit,
      differentiable and continuous in x). It is **not** a canonicalization: the predictor sees a
      superposition of poses, not one pose of the input. It is still invariant: the weights move with the
      input (p(g·x)_k = p(x)_{g⁻¹k}), so the blend is the same image for x and g·x, exactly for the
      transformations that are exact on the pixel grid (quarter turns, the flip) and up to interpolation
      otherwise, as for the other selections (``tests/test_prior.py`` checks it, and that weighting the
      *angles* instead would not be invariant). What it gives up is a single canonical pose; it costs |G|
      image rotations per input (128 for D_64). The returned element is the argmax (``index``, hard
      ``angle_deg`` and ``reflect``, without gradient), for logs and the identity rate; it is not what
      mapped the image.

    Equivariance: for g in the group acting exactly on the pixel grid (multiples of 90°, the horizontal
    flip), the scores are permuted by g, hence h(g·x) = g·h(x) and the canonical image h(x)⁻¹·x is the same
    for x and g·x. For other angles the image rotation interpolates, so the equivariance is approximate.
    Near-ties of the scores are where the hard choices (``ste``, ``gumbel``) are discontinuous in x.

    Args:
        num_rotations: N, the order of the rotation group (``canonicalization.num_rotations`` ≥ 1).
        reflection: use D_N (rotations and the horizontal flip) instead of C_N.
        num_layers: 1 lifting layer + (num_layers − 1) 1×1 group convolutions, in [1, 3] (paper Table 6).
        kernel_size: lifting kernel size; ``null``/None means image-sized (the paper's choice), i.e. the side
            of the image the canonicalizer looks at (``input_size`` when given).
        hidden_channels: number of regular fields per layer.
        image_size: side of the (square) input images.
        input_size: side the canonicalizer scores the image at (bilinear, antialiased resize; equiadapt's
            ``resize_shape``); ``None`` scores it as it comes. A large padded image (STL-10: 136) would need an
            image-sized kernel escnn cannot build cheaply; the chosen element still acts on the full image.
            Resizing a square image commutes with quarter turns and flips (a symmetric resampling grid), so the
            equivariance argument below is unchanged, up to the resize's rounding.
        in_channels: image channels.
        frequencies_cutoff: escnn's band limit for the lifting kernel basis; lowers the memory needed to
            build large groups (N = 64) at the price of smoother filters. ``None`` uses escnn's default.
        filters: lifting filters: "steerable" (escnn's band-limited basis, exactly equivariant for every
            N) or "free" (:class:`RotatedFilterLifting`, the authors' free filters rotated N times; C_N only).
        selection: "ste" | "gumbel" | "soft" (``canonicalization.selection``, above).
        temperature: of the selection distribution ``softmax(scores / temperature)`` (Appendix I uses 1):
            its gradient is what ``ste`` and ``gumbel`` pass to the chosen element (lower is closer to the hard
            argmax, higher spreads the gradient), the sampling distribution of ``gumbel``, the blend weights
            of ``soft``, and the distribution the canonicalization prior scores.
        freeze: keep the weights at initialisation (the paper's "CN(p4 & frozen)").
    """

    #: the tasks (model._target_'s class) whose inputs h takes (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    def __init__(
        self,
        num_rotations: int = 4,
        reflection: bool = False,
        num_layers: int = 3,
        kernel_size: int | None = None,
        hidden_channels: int = 8,
        image_size: int = 28,
        input_size: int | None = None,
        in_channels: int = 1,
        frequencies_cutoff: float | None = None,
        filters: str = "steerable",
        selection: str = "ste",
        temperature: float = 1.0,
        freeze: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        check_int("canonicalization.num_rotations", num_rotations, low=1)
        reflection = check_bool("canonicalization.reflection", reflection)
        check_choice("canonicalization.filters", filters, FILTERS)
        self.selection = check_choice("canonicalization.selection", selection, SELECTIONS)
        if filters == "free" and reflection:
            raise ValueError("canonicalization.filters=free rotates free filters (C_N only); got "
                             "canonicalization.reflection=true: use filters=steerable for D_N")
        self.filters = filters
        self.temperature = check_positive("canonicalization.temperature", temperature)
        check_int("canonicalization.num_layers", num_layers, low=1, high=3)
        check_int("canonicalization.image_size", image_size, low=1)
        self.input_size = check_int("canonicalization.input_size", input_size, low=1, optional=True)
        self.image_size = int(image_size)
        seen_size = self.input_size or image_size
        kernel_size = seen_size if kernel_size is None else kernel_size
        check_int("canonicalization.kernel_size", kernel_size, low=1, high=seen_size)
        check_int("canonicalization.hidden_channels", hidden_channels, low=1)
        check_int("canonicalization.in_channels", in_channels, low=1)

        from escnn import gspaces
        from escnn import nn as enn

        from canonical_network.utils.escnn_compat import patch_escnn

        patch_escnn()
        self.num_rotations = int(num_rotations)
        self.reflection = bool(reflection)
        self.group_name = f"{'D' if reflection else 'C'}{num_rotations}"
        gspace = gspaces.flipRot2dOnR2(num_rotations) if reflection else gspaces.rot2dOnR2(num_rotations)
        self.in_type = enn.FieldType(gspace, in_channels * [gspace.trivial_repr])
        hidden_type = enn.FieldType(gspace, hidden_channels * [gspace.regular_repr])
        self.hidden_type = hidden_type
        # Valid (unpadded) convolution: with an image-sized kernel the output is one pixel, so no border
        # effect can break the symmetry, and averaging over space is cheap. With free filters the lifting
        # layer sits outside the escnn network (``self.lifting``), which then starts at the first ReLU.
        self.lifting = None
        layers: list[nn.Module] = []
        if filters == "free":
            self.lifting = RotatedFilterLifting(in_channels, hidden_channels, kernel_size, int(num_rotations))
        else:
            layers.append(enn.R2Conv(self.in_type, hidden_type, kernel_size=kernel_size, padding=0,
                                     frequencies_cutoff=frequencies_cutoff))
        for _ in range(num_layers - 1):
            layers += [enn.ReLU(hidden_type), enn.R2Conv(hidden_type, hidden_type, kernel_size=1)]
        self.network = enn.SequentialModule(*layers) if layers else None
        self.group_order = gspace.fibergroup.order()
        angles, reflect = element_angles_deg(num_rotations, reflection)
        self.register_buffer("element_angle_deg", angles, persistent=False)
        self.register_buffer("element_reflect", reflect, persistent=False)

    def scores(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images → (B, |G|) one score per group element, permuted by the group action."""
        from escnn import nn as enn

        weight = next(self.parameters(), None)
        # built for image_size-sided inputs (its kernel spans the image) unless it resizes them (input_size)
        check_images(images, "GCNNCanonicalizer", self.in_type.size, None if weight is None else weight.dtype,
                     image_size=None if self.input_size is not None else self.image_size,
                     size_key="canonicalization.image_size")
        if self.input_size is not None and images.shape[-2:] != (self.input_size, self.input_size):
            shrink = images.shape[-1] > self.input_size or images.shape[-2] > self.input_size
            images = F.interpolate(images, size=(self.input_size, self.input_size), mode="bilinear",
                                   align_corners=False, antialias=shrink)
        if self.lifting is None:
            features = enn.GeometricTensor(images, self.in_type)
        else:
            features = enn.GeometricTensor(self.lifting(images), self.hidden_type)
        if self.network is not None:
            features = self.network(features)
        features = features.tensor
        b, _, h, w = features.shape
        # Regular fields are stored as (field, group element) along the channel axis.
        return features.view(b, -1, self.group_order, h, w).mean(dim=(1, 3, 4))

    def canonicalize(self, images: torch.Tensor):
        logits = self.scores(images) / self.temperature  # (B, |G|): the selection distribution's logits
        if self.selection == "gumbel" and self.training:
            # Gumbel(0, 1) = −log E with E ~ Exp(1); the floor keeps log finite if E underflows to 0
            noise = -torch.empty_like(logits).exponential_().clamp_min(torch.finfo(logits.dtype).tiny).log()
            perturbed = logits + noise.detach()
        else:
            perturbed = logits
        index = perturbed.argmax(dim=-1)
        weights = F.one_hot(index, self.group_order).to(logits.dtype)
        if self.selection == "soft":
            g = self._element(weights, index, logits)
            return (self._blend(images, logits.softmax(dim=-1)),), g
        if self.training and torch.is_grad_enabled():
            soft = perturbed.softmax(dim=-1)
            weights = weights + soft - soft.detach()  # straight-through: hard forward, soft backward
        g = self._element(weights, index, logits)
        return (act_inverse(images, g),), g

    def symmetrization_error(self, mode: str) -> str | None:
        if mode != "canonical" and self.selection == "soft":
            return ("canonicalization.selection=soft already blends the input over the whole orbit; a frame needs "
                    "selection=ste or gumbel")
        return None

    def build_frame(self, inputs: tuple[torch.Tensor, ...], spec: FrameSpec) -> Frame:
        """The members of ``weighted_frame`` (the top ``frame_size`` elements by score, continuous gap weights),
        ``sampled`` (``frame_size`` draws from ``softmax(scores / frame_temperature)``, the straight-through
        gradient in training) or ``full`` (all |G| elements, weight 1/|G|): ``symmetrization.discrete_frame``.
        The scores are permuted by the group as in the canonical mode, so the members and weights of g·x are
        g times those of x; each member maps the image by ``act_inverse`` as :meth:`canonicalize` does.
        ``selection`` plays no part (``soft`` is refused); ``temperature`` only sets the prior's logits."""
        (images,) = inputs
        scores = self.scores(images)
        training_gradient = self.training and torch.is_grad_enabled()
        index, weights, selection = discrete_frame(scores, spec, training_gradient)
        k = index.shape[0]
        g = self._element(selection, index.reshape(-1), (scores / self.temperature).repeat(k, 1))
        return self.frame_of((act_inverse(images.repeat(k, 1, 1, 1), g),), g, weights)

    def _element(self, weights: torch.Tensor, index: torch.Tensor, logits: torch.Tensor) -> PlanarElement:
        """The element whose (B, |G|) one-hot ``weights`` select (their gradient, if any, flows to its angle)."""
        return PlanarElement(
            angle_deg=weights @ self.element_angle_deg.to(weights.dtype),
            reflect=weights @ self.element_reflect.to(weights.dtype),
            index=index,
            logits=logits,
        )

    def _blend(self, images: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``Σ_k weights_k · g_k⁻¹ · images`` for (B, C, H, W) images and (B, |G|) weights (``soft``)."""
        b, order = weights.shape
        every = PlanarElement(
            angle_deg=self.element_angle_deg.to(images.dtype).repeat(b),
            reflect=self.element_reflect.to(images.dtype).repeat(b),
        )
        moved = act_inverse(images.repeat_interleave(order, dim=0), every)  # (B·|G|, C, H, W), sample-major
        return (weights.view(b, order, 1, 1, 1) * moved.view(b, order, *images.shape[1:])).sum(dim=1)


class PCACanonicalizer(Canonicalizer):
    """CN(PCA): orient each image by the principal axis of its intensity (paper §5.1), no parameters.

    The axis is the leading eigenvector of the intensity-weighted covariance of pixel coordinates; its sign
    is fixed so that the third moment (skew) of the mass along it is positive, which makes the choice
    rotation-covariant: rotating the image by θ rotates the axis by θ. The canonical image has that axis
    pointing up. Computed in closed form for the whole batch (no per-sample loop).

    Equivariance holds up to pixel interpolation; images whose mass is isotropic (e.g. blank) have no
    defined axis and get angle 0 — finite, never NaN.

    Args:
        threshold: pixels below this intensity (inputs in [0, 1]) are ignored, so faint interpolation halos
            do not tilt the axis.
    """

    #: the tasks (model._target_'s class) whose inputs h takes (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    group_name = "SO(2)"

    def __init__(self, threshold: float = 0.2, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.threshold = check_fraction("canonicalization.threshold", threshold)

    def principal_angle_deg(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B,) angle (deg, counter-clockwise from the +x axis) of the oriented principal axis."""
        return self.oriented_axis(images)[0]

    def oriented_axis(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(angle_deg, skewness)``, both (B,): the oriented principal axis and how clearly its sign is decided,
        ``Σ m u³ / Σ m |u|³`` ∈ [0, 1] along it (rotation invariant; 0 where the skew vanishes and the sign
        flips)."""
        check_images(images, "PCACanonicalizer")
        with torch.no_grad():
            mass = images.sum(dim=1)
            mass = torch.where(mass >= self.threshold, mass, torch.zeros_like(mass))  # (B, H, W)
            h, w = mass.shape[-2:]
            rows = torch.arange(h, device=images.device, dtype=images.dtype)
            cols = torch.arange(w, device=images.device, dtype=images.dtype)
            # Display coordinates: x to the right, y up, origin at the image centre.
            y = ((h - 1) / 2 - rows).view(1, h, 1)
            x = (cols - (w - 1) / 2).view(1, 1, w)
            total = mass.sum(dim=(1, 2)).clamp_min(1e-8)
            mx = (mass * x).sum(dim=(1, 2)) / total
            my = (mass * y).sum(dim=(1, 2)) / total
            dx = x - mx.view(-1, 1, 1)
            dy = y - my.view(-1, 1, 1)
            cxx = (mass * dx * dx).sum(dim=(1, 2)) / total
            cyy = (mass * dy * dy).sum(dim=(1, 2)) / total
            cxy = (mass * dx * dy).sum(dim=(1, 2)) / total
            axis = 0.5 * torch.atan2(2 * cxy, cxx - cyy)  # leading eigenvector's angle, defined mod π
            u = dx * axis.cos().view(-1, 1, 1) + dy * axis.sin().view(-1, 1, 1)
            skew = (mass * u**3).sum(dim=(1, 2))
            axis = torch.where(skew < 0, axis + torch.pi, axis)
            skewness = skew.abs() / (mass * u.abs() ** 3).sum(dim=(1, 2)).clamp_min(1e-8)
        return torch.rad2deg(axis), skewness

    def symmetrization_error(self, mode: str) -> str | None:
        if mode in ("canonical", "weighted_frame"):
            return None
        if mode == "full":
            return "SO(2) is infinite: there is no full frame to average over; use weighted_frame"
        return "PCA is deterministic: it has no distribution over rotations to sample; use weighted_frame"

    def build_frame(self, inputs: tuple[torch.Tensor, ...], spec: FrameSpec) -> Frame:
        """``weighted_frame``: the two orientations of the principal axis, ``a`` and ``a + 180°``, weighted
        ``σ(±2 · skewness / frame_temperature)`` (``frame_size`` does not apply: always 2 members).

        The canonical mode's one jump besides a degenerate (isotropic) covariance is the sign of the skew:
        as it crosses 0 the axis turns by 180°. Here the two members swap there with weights 1/2 each, so
        φ is continuous across it; rotating the image rotates both members and leaves the (invariant)
        skewness alone, so the frame is as equivariant as the canonical mode."""
        (images,) = inputs
        axis_deg, skewness = self.oriented_axis(images)
        angle = torch.cat([axis_deg, axis_deg + 180.0]) - 90.0  # members: frame-major (2·B,)
        kept = torch.sigmoid(2 * skewness / spec.temperature)
        g = PlanarElement(angle_deg=angle, reflect=torch.zeros_like(angle))
        weights = torch.stack([kept, 1 - kept], dim=1).to(images.dtype)
        return self.frame_of((act_inverse(images.repeat(2, 1, 1, 1), g),), g, weights)

    def canonicalize(self, images: torch.Tensor):
        # Rotating by (axis − 90°)⁻¹ brings the oriented axis to +y ("up").
        angle = self.principal_angle_deg(images) - 90.0
        g = PlanarElement(angle_deg=angle, reflect=torch.zeros_like(angle))
        return (act_inverse(images, g),), g
