"""The paper's 7-layer CNN for Rotated MNIST (Appendix G.1), the prediction network f of CN(·)-CNN."""

from __future__ import annotations

import torch
from torch import nn

from canonical_network.groups.image import check_images
from canonical_network.utils.checks import check_fraction, check_int, check_positive

# (out_channels, kernel, stride, dropout) per layer, Appendix G.1: layers 1-3 have 32 channels, 4-6 have
# 64 and layer 7 has 128; 5×5 stride-2 convolutions replace pooling at layers 4 and 7; dropout 0.4 there.
PAPER_LAYERS: tuple[tuple[int, int, int, float], ...] = (
    (32, 3, 1, 0.0),
    (32, 3, 1, 0.0),
    (32, 3, 1, 0.0),
    (64, 5, 2, 0.4),
    (64, 3, 1, 0.0),
    (64, 3, 1, 0.0),
    (128, 5, 2, 0.4),
)


class CNN(nn.Module):
    """Conv → BatchNorm → ReLU (→ Dropout) ×7, then a linear classifier. Not rotation equivariant.

    Unpadded convolutions take a 28×28 digit to a 1×1 map of 128 features
    (28 → 26 → 24 → 22 → 9 → 7 → 5 → 1), so the classifier sees every pixel without any pooling.

    Args:
        num_classes: size of the logits.
        in_channels: image channels.
        image_size: side of the square inputs (must leave a positive map after the seven layers).
        width: multiplies every layer's channel count (1.0 = the paper's network).
        dropout: dropout probability at layers 4 and 7 (paper: 0.4).

    Shapes: ``forward((B, C, H, W)) -> (B, num_classes)``.
    """

    #: the tasks (model._target_'s class) f serves (utils/run_config.py checks it)
    tasks = ("ImageClassificationTask",)

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        width: float = 1.0,
        dropout: float = 0.4,
    ) -> None:
        super().__init__()
        check_int("prediction.num_classes", num_classes, low=2)
        check_int("prediction.in_channels", in_channels, low=1)
        check_fraction("prediction.dropout", dropout)
        check_positive("prediction.width", width)
        layers: list[nn.Module] = []
        channels, size = in_channels, image_size
        for out_channels, kernel, stride, layer_dropout in PAPER_LAYERS:
            out_channels = max(1, round(out_channels * width))
            layers += [
                nn.Conv2d(channels, out_channels, kernel, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(inplace=True),
            ]
            if layer_dropout > 0 and dropout > 0:
                layers.append(nn.Dropout(dropout))
            channels, size = out_channels, (size - kernel) // stride + 1
        if size < 1:
            raise ValueError(f"prediction.image_size={image_size} is too small for the 7-layer CNN (needs ≥ 27)")
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels * size * size, num_classes)
        self.in_channels, self.image_size = int(in_channels), int(image_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # its classifier's width is fixed by the image side: another side fails with this message, not deep in torch
        check_images(images, "CNN", self.in_channels, self.classifier.weight.dtype, self.image_size,
                     size_key="prediction.image_size")
        return self.classifier(self.features(images).flatten(1))
