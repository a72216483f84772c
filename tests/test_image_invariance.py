"""Equivariance of the image canonicalizers and invariance of CN(pN)-CNN, on real rotated digits.

Rotations by multiples of 90° (``torch.rot90``) and the horizontal flip are exact on the pixel grid, so the
canonicalized classifier must give the same logits up to float error; the plain CNN must not.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import fit_image_model

ATOL = 1e-4  # float32 logits; the observed differences are ~1e-6


@pytest.fixture(scope="module")
def cn_p4(rotated_digits):
    return fit_image_model(["experiment=rotmnist/cn_p4"], train_steps=5, data=rotated_digits)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_cn_p4_logits_invariant_to_quarter_turns(cn_p4, rotated_digits, k):
    images, _ = rotated_digits
    with torch.no_grad():
        logits = cn_p4(images)
        logits_rot = cn_p4(torch.rot90(images, k, dims=(-2, -1)))
    assert torch.allclose(logits, logits_rot, atol=ATOL), (logits - logits_rot).abs().max()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_cn_p4_chosen_element_shifts_one_step_per_quarter_turn(cn_p4, rotated_digits, k):
    images, _ = rotated_digits
    h = cn_p4.canonicalizer
    with torch.no_grad():
        index = h.group_element_index(h.canonicalize(images)[1])
        index_rot = h.group_element_index(h.canonicalize(torch.rot90(images, k, dims=(-2, -1)))[1])
    assert torch.equal(index_rot, (index + k) % 4)


def test_cn_p16_shifts_four_steps_per_quarter_turn(rotated_digits):
    model = fit_image_model(["experiment=rotmnist/cn_p16", "canonicalization.num_layers=1"])
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        index = h.group_element_index(h.canonicalize(images)[1])
        index_rot = h.group_element_index(h.canonicalize(torch.rot90(images, 1, dims=(-2, -1)))[1])
        assert torch.equal(index_rot, (index + 4) % 16)
        assert torch.allclose(model(images), model(torch.rot90(images, 1, dims=(-2, -1))), atol=ATOL)


def test_cn_d4_invariant_to_flip_and_rotations(rotated_digits):
    model = fit_image_model(["experiment=rotmnist/cn_p4", "canonicalization.reflection=true"])
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        logits = model(images)
        index = h.group_element_index(h.canonicalize(images)[1])
        flipped = images.flip(-1)
        assert torch.allclose(logits, model(flipped), atol=ATOL)
        assert torch.allclose(logits, model(torch.rot90(flipped, 1, dims=(-2, -1))), atol=ATOL)
        # escnn's D4 element (r, k) = rotate by k·90° after flip^r; the flip F maps (r, k) to (1 − r, −k).
        reflect, rot = index // 4, index % 4
        index_flipped = h.group_element_index(h.canonicalize(flipped)[1])
        assert torch.equal(index_flipped, (1 - reflect) * 4 + (-rot) % 4)


def test_canonical_images_identical_across_the_orbit(cn_p4, rotated_digits):
    images, _ = rotated_digits
    with torch.no_grad():
        canonical = cn_p4.network.canonicalize(images)[0][0]
        for k in (1, 2, 3):
            canonical_rot = cn_p4.network.canonicalize(torch.rot90(images, k, dims=(-2, -1)))[0][0]
            assert torch.allclose(canonical, canonical_rot, atol=1e-5)


def test_plain_cnn_fails_the_same_check(rotated_digits):
    """The check above can fail: the CNN baseline is not invariant to quarter turns."""
    model = fit_image_model(["experiment=rotmnist/cnn"], train_steps=30, data=rotated_digits)
    images, _ = rotated_digits
    with torch.no_grad():
        logits = model(images)
        gap = (logits - model(torch.rot90(images, 1, dims=(-2, -1)))).abs().max()
    # Fails the absolute check, and not by float noise: the change is a sizeable part of how much the
    # logits vary from digit to digit.
    spread = (logits - logits.mean(dim=0)).abs().max()
    assert gap > ATOL and gap > 0.2 * spread, (gap, spread)


@pytest.mark.parametrize("order", [4, 8])
def test_free_filter_canonicalizer_is_exact_for_quarter_turns(rotated_digits, order):
    """The authors' free rotated filters (canonicalization.filters=free): C_4 ⊂ C_N acts exactly."""
    model = fit_image_model(["experiment=rotmnist/cn_p4", "canonicalization.filters=free",
                             f"canonicalization.num_rotations={order}"], train_steps=5, data=rotated_digits)
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        logits = model(images)
        index = h.group_element_index(h.canonicalize(images)[1])
        for k in (1, 2, 3):
            rotated = torch.rot90(images, k, dims=(-2, -1))
            assert torch.equal(h.group_element_index(h.canonicalize(rotated)[1]), (index + k * order // 4) % order)
            assert torch.allclose(logits, model(rotated), atol=ATOL)
