"""The G-CNN baselines of Table 1 (paper §5.1, Appendix G.1): the 7-layer CNN with group convolutions.

"We took the same CNN architecture as above and replaced the standard convolutions with group convolutions"
(Appendix G.1): the seven layers, kernel sizes and channel layout of :mod:`canonical_network.prediction.cnn`,
built with escnn over C_N. Layer 1 lifts the image to ``channels[0]`` regular fields of C_N; layers 2-7 map
regular fields to regular fields. Every convolution is followed by escnn's ``InnerBatchNorm`` (statistics
shared by the N channels of a field) and ``ReLU``; ``PointwiseDropout`` follows layers 4 and 7. A max over
the group (``GroupPooling``) then a mean over the remaining pixels give invariant features, and a linear
layer gives the logits.

The rows of Table 1 differ only in ``num_rotations`` and the channel counts (regular fields per layer):

* G-CNN (p4): the CNN's channel counts as regular fields (``width: 1.0``), 698,634 parameters;
* G-CNN (p4 & = params), G-CNN (p64 & = params): fewer fields, chosen by :func:`match_width` so that the
  parameter count matches CN(p4)-CNN's within a few per cent (the paper: "we decreased the number of
  channels to keep the number of parameters the same as our model", §5.1).

Parameters per pair of fields follow escnn's steerable bases under its default band limit: 6 (3×3) and 11
(5×5) per lifting filter, N times that between regular fields, so a p4 layer has ~2.7× (3×3) and ~1.8× (5×5)
the weights of the CNN's layer with as many channels as it has fields.

One deliberate change to layer 4 (see :func:`plan_layers`): a stride-2 5×5 convolution on the 22×22 map
would sample an even grid asymmetrically (it reads rows 0-20 and never row 21), which breaks exact
equivariance to quarter turns (measured: logits change by ~3e-2 under ``torch.rot90``, against ~1e-7). We use
the stride-1 5×5 convolution followed by 2×2 average pooling instead: the same kernel size, the same
parameters and the same 9×9 output, and the sampling is symmetric.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch
from torch import nn

from canonical_network.prediction.cnn import PAPER_LAYERS
from canonical_network.utils.checks import check_fraction, check_int, check_positive

#: Regular fields per layer at ``width: 1.0``: the CNN's channel counts (Appendix G.1).
PAPER_CHANNELS: tuple[int, ...] = tuple(layer[0] for layer in PAPER_LAYERS)


def plan_layers(image_size: int) -> list[tuple[int, int, str, float]]:
    """Per layer: (kernel, stride, downsampling, dropout) and the check that every layer is symmetric.

    ``downsampling`` is ``"stride"`` (a strided convolution, used when its windows cover the input exactly,
    e.g. layer 7: 5×5 input, 5×5 kernel) or ``"avgpool"`` (stride-1 convolution, then ``stride × stride``
    average pooling, used when a strided convolution would drop the last rows and columns: layer 4 on the
    22×22 map). Both give the same output size; only the second is symmetric on such grids.

    Raises ``ValueError`` naming ``prediction.image_size`` when no symmetric plan exists or the map vanishes.
    """
    plan, size = [], image_size
    for _, kernel, stride, dropout in PAPER_LAYERS:
        if size < kernel:
            raise ValueError(
                f"prediction.image_size={image_size} is too small for the 7-layer G-CNN (needs ≥ 27)"
            )
        if (size - kernel) % stride == 0:
            plan.append((kernel, stride, "stride", dropout))
            size = (size - kernel) // stride + 1
        elif (size - kernel + 1) % stride == 0:
            plan.append((kernel, stride, "avgpool", dropout))
            size = (size - kernel + 1) // stride
        else:
            raise ValueError(
                f"prediction.image_size={image_size}: layer {len(plan) + 1} cannot downsample its {size}×{size} "
                "map symmetrically, so the G-CNN would not be exactly equivariant; use e.g. 28"
            )
    return plan


def resolve_channels(width: float, channels: Sequence[int] | None) -> list[int]:
    """Regular fields per layer: ``channels`` if given (7 positive ints), else round(PAPER_CHANNELS · width)."""
    if channels is not None:
        channels = list(channels)
        if len(channels) != len(PAPER_CHANNELS) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in channels
        ):
            raise ValueError(
                f"prediction.channels must be a list of {len(PAPER_CHANNELS)} positive integers "
                f"(regular fields per layer); got {channels!r}"
            )
        return channels
    width = check_positive("prediction.width", width)
    return [max(1, round(c * width)) for c in PAPER_CHANNELS]


class GCNN(nn.Module):
    """The paper's 7-layer CNN with C_N group convolutions (escnn): rotation-invariant logits.

    Equivariance: every layer maps regular fields of C_N to regular fields and commutes with the rotations by
    multiples of 360°/N that map the pixel grid onto itself, i.e. those that are multiples of 90° (exact up to
    float error, for any N divisible by 4). The group max-pool and the spatial mean make the logits invariant:
    ``model(torch.rot90(x, k, (-2, -1))) == model(x)`` in eval mode (dropout and batch statistics break it in
    training mode, as for any network). Other angles in C_N are equivariant only up to interpolation.

    Args:
        num_rotations: N, the order of the rotation group (``prediction.num_rotations`` ≥ 1).
        num_classes: size of the logits.
        in_channels: image channels (each a scalar, trivial field).
        image_size: side of the square inputs (28 for MNIST; see :func:`plan_layers`).
        width: multiplies the CNN's channel counts to give regular fields per layer (1.0: 32,32,32,64,64,64,128).
        channels: explicit regular fields per layer (7 ints); overrides ``width``.
        dropout: dropout probability after layers 4 and 7 (paper: 0.4).
        frequencies_cutoff: escnn's band limit of the steerable kernel bases (maximum angular frequency per
            unit of radius); lower it to get fewer parameters and a smaller basis (memory) for large N.
            ``None`` uses escnn's default, a radius-dependent cutoff.

    Shapes: ``forward((B, C, H, W)) -> (B, num_classes)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    def __init__(
        self,
        num_rotations: int = 4,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        width: float = 1.0,
        channels: Sequence[int] | None = None,
        dropout: float = 0.4,
        frequencies_cutoff: float | None = None,
    ) -> None:
        super().__init__()
        check_int("prediction.num_rotations", num_rotations, low=1)
        check_int("prediction.num_classes", num_classes, low=2)
        check_int("prediction.in_channels", in_channels, low=1)
        check_int("prediction.image_size", image_size, low=1)
        check_fraction("prediction.dropout", dropout)
        # escnn reads a float as "frequency ≤ cutoff · radius" but rejects an int (the check returns a float).
        frequencies_cutoff = check_positive("prediction.frequencies_cutoff", frequencies_cutoff, optional=True)
        fields = resolve_channels(width, channels)
        plan = plan_layers(image_size)

        from escnn import gspaces
        from escnn import nn as enn

        from canonical_network.utils.escnn_compat import patch_escnn

        patch_escnn()
        self.num_rotations = int(num_rotations)
        self.channels = fields
        gspace = gspaces.rot2dOnR2(num_rotations)
        self.in_type = enn.FieldType(gspace, in_channels * [gspace.trivial_repr])
        layers: list[nn.Module] = []
        in_type = self.in_type
        for num_fields, (kernel, stride, downsampling, layer_dropout) in zip(fields, plan, strict=True):
            out_type = enn.FieldType(gspace, num_fields * [gspace.regular_repr])
            # No bias: batch norm follows and would cancel it (as in the CNN).
            layers.append(
                enn.R2Conv(in_type, out_type, kernel_size=kernel, padding=0,
                           stride=stride if downsampling == "stride" else 1,
                           bias=False, frequencies_cutoff=frequencies_cutoff)
            )
            if downsampling == "avgpool":
                layers.append(enn.PointwiseAvgPool2D(out_type, kernel_size=stride, stride=stride))
            layers += [enn.InnerBatchNorm(out_type), enn.ReLU(out_type, inplace=True)]
            if layer_dropout > 0 and dropout > 0:
                layers.append(enn.PointwiseDropout(out_type, p=dropout))
            in_type = out_type
        self.features = enn.SequentialModule(*layers)
        self.group_pool = enn.GroupPooling(in_type)
        self.classifier = nn.Linear(fields[-1], num_classes)

    def invariant_features(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, channels[-1]): max over the group per field, mean over the remaining pixels."""
        from escnn import nn as enn

        from canonical_network.groups.image import check_images

        check_images(images, "GCNN", self.in_type.size)  # any side: the mean below pools what remains
        features = self.group_pool(self.features(enn.GeometricTensor(images, self.in_type))).tensor
        # The map is 1×1 for 28×28 inputs; the mean keeps other sizes invariant (a flatten would not).
        return features.mean(dim=(-2, -1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.invariant_features(images))


def basis_dimensions(
    num_rotations: int, in_channels: int = 1, frequencies_cutoff: float | None = None
) -> dict[tuple[str, int], int]:
    """Weights of one R2Conv per pair of fields: ``{("lift", k): ..., ("regular", k): ...}`` for k in {3, 5}.

    Built on a single input and output field (the basis is the same for every pair of fields; escnn stores
    one weight vector of this size per pair). This is not much cheaper than the full model for large N: the
    cost is escnn sampling the basis of one pair of regular fields (time and memory for N = 64:
    ``docs/measurements.md``), which the layers share, and the count needs that sample (escnn drops elements
    that vanish on the grid). Cached per process, as escnn caches the sampled bases.
    """
    cutoff = None if frequencies_cutoff is None else float(frequencies_cutoff)
    return dict(_basis_dimensions(num_rotations, in_channels, cutoff))


@cache
def _basis_dimensions(
    num_rotations: int, in_channels: int, frequencies_cutoff: float | None
) -> tuple[tuple[tuple[str, int], int], ...]:
    from escnn import gspaces
    from escnn import nn as enn

    from canonical_network.utils.escnn_compat import patch_escnn

    patch_escnn()
    gspace = gspaces.rot2dOnR2(num_rotations)
    scalar = enn.FieldType(gspace, in_channels * [gspace.trivial_repr])
    regular = enn.FieldType(gspace, [gspace.regular_repr])
    dims = {}
    for kernel in sorted({layer[1] for layer in PAPER_LAYERS}):
        for name, in_type in (("lift", scalar), ("regular", regular)):
            conv = enn.R2Conv(in_type, regular, kernel_size=kernel, bias=False, initialize=False,
                              frequencies_cutoff=frequencies_cutoff)
            dims[(name, kernel)] = conv.weights.numel()
    return tuple(dims.items())


def count_parameters(fields: Sequence[int], dims: dict[tuple[str, int], int], num_classes: int = 10) -> int:
    """Parameters of :class:`GCNN` with ``fields`` regular fields per layer, from :func:`basis_dimensions`.

    Convolutions: one basis-sized weight vector per (input field, output field) pair (the lifting layer's
    basis already covers all input channels); ``InnerBatchNorm``: a scale and a shift per field; the
    classifier: ``fields[-1] · num_classes`` weights and ``num_classes`` biases.
    """
    total, previous = 0, None
    for num_fields, (_, kernel, _, _) in zip(fields, PAPER_LAYERS, strict=True):
        if previous is None:
            total += dims[("lift", kernel)] * num_fields
        else:
            total += dims[("regular", kernel)] * previous * num_fields
        total += 2 * num_fields
        previous = num_fields
    return total + previous * num_classes + num_classes


def match_width(
    target_params: int,
    num_rotations: int,
    num_classes: int = 10,
    in_channels: int = 1,
    frequencies_cutoff: float | None = None,
) -> tuple[float, list[int], int]:
    """The width whose rounded channel counts give the parameter count closest to ``target_params``.

    Returns ``(width, channels, parameters)``. Used once to choose the ``channels`` written in
    ``configs/experiment/rotmnist/gcnn_p{4,64}_eqparams.yaml``; the tests recompute the counts.
    """
    dims = basis_dimensions(num_rotations, in_channels, frequencies_cutoff)
    best: tuple[int, float, list[int], int] | None = None
    # Parameters grow like width², so a fine scan over a generous range finds the closest rounding.
    for step in range(1, 4001):
        width = step / 1000
        fields = resolve_channels(width, None)
        params = count_parameters(fields, dims, num_classes)
        if best is None or abs(params - target_params) < best[0]:
            best = (abs(params - target_params), width, fields, params)
    _, width, fields, params = best
    return width, fields, params
