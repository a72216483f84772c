"""Equivariance of the image canonicalizers and invariance of CN(pN)-CNN, on real rotated digits.

Rotations by multiples of 90° (``torch.rot90``) and the horizontal flip are exact on the pixel grid, so the
canonicalized classifier must give the same logits up to float error; the plain CNN must not.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import clear_argmax, fit_image_model, rel_tol

#: ``n`` (tests/helpers.py) of these float32 networks (escnn's R2Conv has no float64 path, so they stay in
#: float32): the fan-ins of their conv and linear layers sum to 4,169 (G-CNN p4 at width 0.25) … 5,113
#: (CN(p4)-CNN), plus a mean over ≤ 28² pixels: ≤ 2¹³.
IMAGE_TERMS = 2**13
#: ``factor = n · κ`` with ``κ = 1``: eval-mode batch norms are fixed affine maps that scale errors and logits
#: alike, ReLU and pooling do not amplify, and the worst-case ``n·eps`` (every rounding in one direction) is
#: itself far above what rounding does (≈ √n·eps), which leaves room for cancellation in the sums. The
#: canonicalizer's argmax is a discrete choice: checks that depend on it run on the images whose choice is
#: clear (:func:`clear_choice`). Tolerance 2¹³ eps32 ≈ 9.8e-4 of the logits' scale; observed errors are
#: ≤ ~2e-4 of it, and the plain CNN misses it ~500-fold (test_plain_cnn_fails_the_same_check).
IMAGE_FACTOR = IMAGE_TERMS


def assert_invariant(logits: torch.Tensor, logits_moved: torch.Tensor) -> None:
    tol = rel_tol(logits, logits_moved, factor=IMAGE_FACTOR)
    error = (logits - logits_moved).abs().max().item()
    assert error < tol, f"max error {error:.3g} vs tolerance {tol:.3g}"


def clear_choice(h, images: torch.Tensor) -> torch.Tensor:
    """Mask of the images whose canonicalizer scores single out one group element beyond rounding (the
    scores are sums of ≤ 2¹³ terms; IMAGE_FACTOR covers their rounding). A rotation permutes the scores, so
    the same images are clear after it. Untrained canonicalizers leave a few near-ties (gaps of ~1e-4 of the
    scores); most images must be clear for the checks to mean something."""
    clear = clear_argmax(h.scores(images), IMAGE_FACTOR)
    assert clear.float().mean() >= 0.75, f"only {int(clear.sum())} of {len(clear)} images have a clear choice"
    return clear


@pytest.fixture(scope="module")
def cn_p4(rotated_digits):
    return fit_image_model(["experiment=rotmnist/cn_p4"], train_steps=5, data=rotated_digits)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_cn_p4_logits_invariant_to_quarter_turns(cn_p4, rotated_digits, k):
    images, _ = rotated_digits
    with torch.no_grad():
        clear = clear_choice(cn_p4.canonicalizer, images)
        logits = cn_p4(images)
        logits_rot = cn_p4(torch.rot90(images, k, dims=(-2, -1)))
    assert_invariant(logits[clear], logits_rot[clear])


@pytest.mark.parametrize("k", [1, 2, 3])
def test_cn_p4_chosen_element_shifts_one_step_per_quarter_turn(cn_p4, rotated_digits, k):
    images, _ = rotated_digits
    h = cn_p4.canonicalizer
    with torch.no_grad():
        clear = clear_choice(h, images)  # where the argmax is not decided by rounding
        index = h.group_element_index(h.canonicalize(images)[1])
        index_rot = h.group_element_index(h.canonicalize(torch.rot90(images, k, dims=(-2, -1)))[1])
    assert torch.equal(index_rot[clear], (index[clear] + k) % 4)


def test_cn_p16_shifts_four_steps_per_quarter_turn(rotated_digits):
    model = fit_image_model(["experiment=rotmnist/cn_p16", "canonicalization.num_layers=1"])
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        clear = clear_choice(h, images)
        index = h.group_element_index(h.canonicalize(images)[1])
        index_rot = h.group_element_index(h.canonicalize(torch.rot90(images, 1, dims=(-2, -1)))[1])
        assert torch.equal(index_rot[clear], (index[clear] + 4) % 16)
        assert_invariant(model(images)[clear], model(torch.rot90(images, 1, dims=(-2, -1)))[clear])


def test_cn_d4_invariant_to_flip_and_rotations(rotated_digits):
    model = fit_image_model(["experiment=rotmnist/cn_p4", "canonicalization.reflection=true"])
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        clear = clear_choice(h, images)
        logits = model(images)[clear]
        index = h.group_element_index(h.canonicalize(images)[1])[clear]
        flipped = images.flip(-1)
        assert_invariant(logits, model(flipped)[clear])
        assert_invariant(logits, model(torch.rot90(flipped, 1, dims=(-2, -1)))[clear])
        # escnn's D4 element (r, k) = rotate by k·90° after flip^r; the flip F maps (r, k) to (1 − r, −k).
        reflect, rot = index // 4, index % 4
        index_flipped = h.group_element_index(h.canonicalize(flipped)[1])[clear]
        assert torch.equal(index_flipped, (1 - reflect) * 4 + (-rot) % 4)


def test_canonical_images_identical_across_the_orbit(cn_p4, rotated_digits):
    images, _ = rotated_digits
    with torch.no_grad():
        clear = clear_choice(cn_p4.canonicalizer, images)
        canonical = cn_p4.network.canonicalize(images)[0][0][clear]
        for k in (1, 2, 3):
            canonical_rot = cn_p4.network.canonicalize(torch.rot90(images, k, dims=(-2, -1)))[0][0][clear]
            # Rotating back goes through bilinear sampling: its sampling points, from cos/sin of multiples
            # of 90° on a 28-pixel grid, are off the pixel centres by ≤ ~28 eps pixels, moving a value by
            # ≤ 28 eps of the largest pixel step, plus the 4-tap blend's rounding: 2⁶ eps of max |pixel|.
            tol = rel_tol(canonical, canonical_rot, factor=2**6)
            assert (canonical - canonical_rot).abs().max() < tol


def test_plain_cnn_fails_the_same_check(rotated_digits):
    """The check above can fail: the CNN baseline is not invariant to quarter turns."""
    model = fit_image_model(["experiment=rotmnist/cnn"], train_steps=30, data=rotated_digits)
    images, _ = rotated_digits
    with torch.no_grad():
        logits = model(images)
        gap = (logits - model(torch.rot90(images, 1, dims=(-2, -1)))).abs().max()
    # Fails the invariance check by a wide margin, and not by float noise: the change is a sizeable part of
    # how much the logits vary from digit to digit.
    spread = (logits - logits.mean(dim=0)).abs().max()
    assert gap > 100 * rel_tol(logits, factor=IMAGE_FACTOR) and gap > 0.2 * spread, (gap, spread)


@pytest.mark.parametrize("order", [4, 8])
def test_free_filter_canonicalizer_is_exact_for_quarter_turns(rotated_digits, order):
    """The authors' free rotated filters (canonicalization.filters=free): C_4 ⊂ C_N acts exactly."""
    model = fit_image_model(["experiment=rotmnist/cn_p4", "canonicalization.filters=free",
                             f"canonicalization.num_rotations={order}"], train_steps=5, data=rotated_digits)
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        clear = clear_choice(h, images)
        logits = model(images)[clear]
        index = h.group_element_index(h.canonicalize(images)[1])[clear]
        for k in (1, 2, 3):
            rotated = torch.rot90(images, k, dims=(-2, -1))
            index_rot = h.group_element_index(h.canonicalize(rotated)[1])[clear]
            assert torch.equal(index_rot, (index + k * order // 4) % order)
            assert_invariant(logits, model(rotated)[clear])
