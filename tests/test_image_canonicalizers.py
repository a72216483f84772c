"""Training behaviour of the image canonicalizers: straight-through gradients, freezing, PCA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from canonical_network.canonicalization.image import GCNNCanonicalizer, PCACanonicalizer
from canonical_network.canonicalization.image_optimization import OptimizationCanonicalizer
from canonical_network.groups.image import rotate_deg
from canonical_network.prediction.cnn import CNN
from canonical_network.tasks.image_classification import ImageClassificationTask


def make_task(**canon_kwargs) -> ImageClassificationTask:
    torch.manual_seed(0)
    return ImageClassificationTask(
        canonicalizer=GCNNCanonicalizer(**canon_kwargs),
        predictor=CNN(),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
    )


def test_straight_through_estimator_reaches_canonicalizer_weights(rotated_digits):
    task = make_task(num_rotations=4, num_layers=2).train()
    images, labels = rotated_digits
    F.cross_entropy(task(images), labels).backward()
    grads = [p.grad for p in task.canonicalizer.parameters()]
    assert grads and all(g is not None for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


def test_eval_mode_uses_hard_argmax_without_gradient_path(rotated_digits):
    task = make_task(num_rotations=4, num_layers=1).eval()
    images, _ = rotated_digits
    _, g = task.canonicalizer.canonicalize(images)
    assert torch.equal(g.angle_deg, g.index.float() * 90.0)
    assert not g.angle_deg.requires_grad


def test_frozen_canonicalizer_does_not_change(rotated_digits):
    task = make_task(num_rotations=4, num_layers=2, freeze=True).train()
    assert not task.canonicalizer.training  # frozen stays in eval mode, no batch statistics drift
    before = [p.detach().clone() for p in task.canonicalizer.parameters()]
    optimizer = task.configure_optimizers()
    assert all(p.requires_grad for group in optimizer.param_groups for p in group["params"])
    images, labels = rotated_digits
    loss = F.cross_entropy(task(images), labels)
    loss.backward()
    optimizer.step()
    assert all(p.grad is None for p in task.canonicalizer.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, task.canonicalizer.parameters(), strict=True))
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in task.network.predictor.parameters())


def test_pca_maps_a_rotated_digit_to_nearly_the_same_image(digits):
    images, _ = digits
    pca = PCACanonicalizer()
    (canonical,), _ = pca.canonicalize(images)
    for angle in (37.0, 123.0, 250.0):
        (canonical_rot,), _ = pca.canonicalize(rotate_deg(images, angle))
        # Same image up to interpolation for most digits; a few nearly symmetric digits flip their sign.
        per_digit = (canonical_rot - canonical).abs().mean(dim=(1, 2, 3))
        baseline = (rotate_deg(canonical, 90.0) - canonical).abs().mean(dim=(1, 2, 3))
        close = per_digit < 0.3 * baseline
        assert close.float().mean() >= 0.85, (angle, close.float().mean())


def test_pca_angle_is_rotation_covariant(digits):
    images, _ = digits
    pca = PCACanonicalizer()
    base = pca.principal_angle_deg(images)
    rotated = pca.principal_angle_deg(rotate_deg(images, 60.0))
    diff = torch.remainder(rotated - base - 60.0 + 180.0, 360.0) - 180.0
    assert (diff.abs() < 5.0).float().mean() >= 0.85


@pytest.mark.parametrize(
    "canonicalizer", [lambda: GCNNCanonicalizer(num_rotations=8, num_layers=2), lambda: PCACanonicalizer()]
)
def test_blank_images_give_finite_logits(canonicalizer):
    torch.manual_seed(0)
    task = ImageClassificationTask(canonicalizer(), CNN(), optimizer=lambda params: None)
    blank = torch.zeros(4, 1, 28, 28)
    for mode in (True, False):
        task.train(mode)
        assert torch.isfinite(task(blank)).all()


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"num_rotations": 0}, "canonicalization.num_rotations"),
        ({"num_rotations": -4}, "canonicalization.num_rotations"),
        ({"num_layers": 4}, "canonicalization.num_layers"),
        ({"kernel_size": 29}, "canonicalization.kernel_size"),
    ],
)
def test_bad_gcnn_arguments_name_the_key_and_range(kwargs, key):
    with pytest.raises(ValueError, match=key + r" must be an integer (>= 1|in \[1, \d+\]); got -?\d+$"):
        GCNNCanonicalizer(**kwargs)


def test_free_filters_temperature_and_their_errors():
    h = GCNNCanonicalizer(num_rotations=4, num_layers=1, hidden_channels=16, filters="free")
    # the authors' layer: 16 free 28 x 28 filters and one bias per field
    assert sum(p.numel() for p in h.parameters()) == 16 * 28 * 28 + 16
    with pytest.raises(ValueError, match="canonicalization.filters must be one of"):
        GCNNCanonicalizer(filters="fourier")
    with pytest.raises(ValueError, match="canonicalization.reflection=true"):
        GCNNCanonicalizer(filters="free", reflection=True)
    for bad in (0.0, -1.0, "hot"):
        with pytest.raises(ValueError, match="canonicalization.temperature must be a number > 0"):
            GCNNCanonicalizer(temperature=bad)


def test_temperature_scales_the_straight_through_gradient(rotated_digits):
    """The forward choice is the argmax whatever the temperature; the soft-max gradient is what changes."""
    images, labels = rotated_digits
    grads = {}
    for temperature in (1.0, 1e3):
        task = make_task(num_rotations=4, num_layers=1, temperature=temperature).train()
        F.cross_entropy(task(images), labels).backward()
        grads[temperature] = sum(p.grad.abs().sum() for p in task.canonicalizer.parameters())
        task.eval()
        assert torch.equal(task.canonicalizer.canonicalize(images)[1].index,
                           make_task(num_rotations=4, num_layers=1).eval().canonicalizer.canonicalize(images)[1].index)
    # softmax(s / T) has Jacobian (1/T)(diag(p) − p pᵀ): a 1000× hotter soft-max passes a far smaller gradient
    assert grads[1e3] < 0.01 * grads[1.0]


def test_canonicalizer_learning_rate_is_its_own_param_group():
    task = ImageClassificationTask(canonicalizer=GCNNCanonicalizer(num_rotations=4, num_layers=1),
                                   predictor=CNN(), optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
                                   canonicalizer_lr=1e-2)
    groups = task.configure_optimizers().param_groups
    assert [g["lr"] for g in groups] == [1e-3, 1e-2]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in task.canonicalizer.parameters()}
    assert sum(len(g["params"]) for g in groups) == len(list(task.parameters()))
    with pytest.raises(ValueError, match="model.canonicalizer_lr must be null or a number > 0"):
        ImageClassificationTask(canonicalizer=GCNNCanonicalizer(num_rotations=4, num_layers=1), predictor=CNN(),
                                optimizer=lambda params: torch.optim.Adam(params), canonicalizer_lr=0)


@pytest.mark.parametrize("build", [lambda: GCNNCanonicalizer(num_rotations=4), lambda: PCACanonicalizer(),
                                   lambda: OptimizationCanonicalizer()], ids=["gcnn", "pca", "opt"])
def test_bad_images_get_one_clear_error(build):
    """Not a (B, C, H, W) float batch: one error naming the shape or dtype and what to pass instead (before:
    an AssertionError of escnn's, an IndexError, a reshape error or a cast error, by canonicalizer)."""
    canonicalizer = build()
    name = type(canonicalizer).__name__
    for images, message in (
        (torch.rand(1, 28, 28), r"shape \(B, C, H, W\); got shape \(1, 28, 28\): .* add the batch dimension"),
        (torch.rand(0, 1, 28, 28), r"a batch of at least one image; got shape \(0, 1, 28, 28\)"),
        (torch.randint(0, 255, (2, 1, 28, 28), dtype=torch.uint8), "floating-point images .* got torch.uint8"),
    ):
        with pytest.raises(ValueError, match=f"{name} takes .*{message}"):
            canonicalizer(images)


def test_the_gcnn_canonicalizer_names_a_channel_or_dtype_mismatch():
    canonicalizer = GCNNCanonicalizer(num_rotations=4)
    with pytest.raises(ValueError, match=r"built for 1-channel images .* got 3 channels"):
        canonicalizer(torch.rand(2, 3, 28, 28))
    with pytest.raises(ValueError, match=r"torch.float32 weights; got torch.float64 images"):
        canonicalizer(torch.rand(2, 1, 28, 28, dtype=torch.float64))
    # (not converted here with .double(): escnn shares sampled bases between layers, so that would turn every
    # escnn layer built later in this process to float64, docs/api.md)
    canonical, g = canonicalizer(torch.rand(2, 1, 28, 28))
    assert canonical.dtype == torch.float32 and g.index.shape == (2,)


def test_planar_group_refuses_n_zero():
    from canonical_network.groups.image import planar_group

    assert planar_group("C4") == (4, False) and planar_group("D1") == (1, True) and planar_group("SO(2)") is None
    with pytest.raises(ValueError, match="'C0': C_N and D_N need N >= 1"):
        planar_group("C0")
