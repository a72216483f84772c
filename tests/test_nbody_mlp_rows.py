"""Issue 36's N-body rows: a plain MLP on the flattened particle array (``nbody/mlp``), the same MLP behind
E(3) × S_n canonicalization (``nbody/cn_mlp``), and its two halves (``nbody/cn_mlp_sn``, ``nbody/cn_mlp_e3``).

What the rows claim, checked in float64 on real simulated frames (``tests/test_nbody_task.py``'s tiny data set):

* ``cn_mlp``: ``model(P(Rx + t), P(Rv), Pq) = P(R·model(x, v, q) + t)`` for random permutations ``P``,
  rotations and reflections ``R`` and translations ``t`` (``cn.check_equivariance`` with ``"E(3)×S_n"``) within
  its derived tolerance and below the issue's absolute 1e-9, in every selection mode of the S_n factor;
* ``mlp`` fails that check by more than 1e-2 (the control: the check can tell);
* ``cn_mlp_sn`` passes S_n and fails E(3); ``cn_mlp_e3`` passes E(3) and fails S_n: each half supplies its
  own symmetry and only that one;
* training reaches both factors of ``cn_mlp`` (the VN frame and the S_n scorer) in every selection mode, and a
  few optimiser steps through the LightningModule lower the loss;
* :class:`ProductCanonicalizer` itself: the order of ``canonicalize`` and ``invert``, the prior as the sum of
  the factors', ``is_identity``, ``freeze`` on both factors, and a clear error for a factor that is not a
  canonicalizer;
* :class:`NBodyMLP`: its shapes, defaults, residual and the error naming ``prediction.num_particles``.
"""

from __future__ import annotations

import functools

import hydra
import pytest
import torch
from lightning import Callback, Trainer
from torch import nn

import canonical_network as cn
from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.canonicalization.permutation import SELECTIONS
from canonical_network.canonicalization.product import ProductCanonicalizer
from canonical_network.data.nbody import NBodyDataModule
from canonical_network.equivariance import MEANINGFUL_RTOL
from canonical_network.groups.euclidean import EuclideanTransform
from canonical_network.groups.permutation import PermutationElement
from canonical_network.groups.product import ProductElement
from canonical_network.prediction.mlp import NBodyMLP
from tests.helpers import MAX_FRAME_CONDITION, compose_config, frame_condition
from tests.test_nbody_task import TINY

ROWS = ("mlp", "cn_mlp", "cn_mlp_sn", "cn_mlp_e3")
#: the issue's bounds: an equivariant row's max error in float64, and the miss of one that is not
EXACT_ABS = 1e-9
CONTROL_ABS = 1e-2
#: distinct particles' S_n scores must differ by far more than float64 rounding of the canonical system, or
#: a rotated copy could be sorted differently (a tie, the paper's Appendix A), which is not what this checks
SCORE_GAP = 1e-6


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real inputs at frame 30, float64: loc (16, 5, 3), vel (16, 5, 3), charges (16, 5, 1)."""
    out = tmp_path_factory.mktemp("nbody_tiny")
    dm = NBodyDataModule(data_dir=str(out), batch_size=TINY["num_test"], **TINY)
    dm.prepare_data()
    dm.setup()
    loc, vel, charges, _ = next(iter(dm.test_dataloader()))
    return loc.double(), vel.double(), charges.double()


@functools.cache
def _config(row: str, overrides: tuple[str, ...] = ()):
    return compose_config([f"experiment=nbody/{row}", *overrides])


def _row(row: str, *overrides: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """The LightningModule of ``experiment=nbody/<row>`` (seed 0) in ``dtype``, eval mode."""
    torch.manual_seed(0)
    return hydra.utils.instantiate(_config(row, tuple(overrides)).model).to(dtype).eval()


def _conditioning(model: torch.nn.Module, inputs) -> float | None:
    """``κ`` of the check's tolerance: the Gram–Schmidt conditioning of the learned frame at these inputs
    (tests/helpers.py), at least ``check_equivariance``'s own default; ``None`` (the default) without one."""
    h = model.network.canonicalizer
    h = getattr(h, "first", h)  # a product: the frame is its 3-D factor's
    if not isinstance(h, VNDeepSetsCanonicalizer):
        return None
    with torch.no_grad():
        return max(frame_condition(h.frame_vectors(*inputs)[0][:, :3]), MAX_FRAME_CONDITION)


def _check(model: torch.nn.Module, inputs, group: str) -> cn.EquivarianceResult:
    """``cn.check_equivariance`` with the action of the group on predicted positions: ``x Rᵀ + t`` reordered
    under E(3) and products, the plain reordering of per-particle outputs under S_n."""
    action = "elements" if group == "S_n" else "points"
    return cn.check_equivariance(model, inputs, group, output_action=action,
                                 conditioning=_conditioning(model, inputs))


def _assert_passes(result: cn.EquivarianceResult) -> None:
    assert result.rtol < MEANINGFUL_RTOL, f"tolerance too loose to mean anything:\n{result}"
    assert result.passed, str(result)
    assert result.max_abs_error < EXACT_ABS, str(result)


def _assert_fails(result: cn.EquivarianceResult) -> None:
    assert not result.passed and result.max_abs_error > CONTROL_ABS, str(result)


def _assert_clear_order(h: Canonicalizer, inputs) -> None:
    """The S_n scores of the (canonical) system are far from ties, so the order is the same for every
    transformed copy (``SCORE_GAP``)."""
    if isinstance(h, ProductCanonicalizer):
        with torch.no_grad():
            inputs = h.first.canonicalize(*inputs)[0]
        h = h.second
    with torch.no_grad():
        scores = h.scores(*inputs)
    gaps = (scores.unsqueeze(-1) - scores.unsqueeze(-2)).abs() + torch.eye(scores.shape[-1], dtype=scores.dtype)
    assert gaps.min() > SCORE_GAP


# ------------------------------------------------------------------------------------------------- the rows
def test_the_rows_compose_with_the_intended_parts():
    parts = {}
    for row in ROWS:
        cfg = _config(row)
        assert cfg.experiment_name == f"nbody/{row}"
        assert cfg.prediction._target_ == "canonical_network.prediction.mlp.NBodyMLP"
        parts[row] = cfg.canonicalization._target_.rsplit(".", 1)[1]
    assert parts == {"mlp": "IdentityCanonicalizer", "cn_mlp": "ProductCanonicalizer",
                     "cn_mlp_sn": "PermutationCanonicalizer", "cn_mlp_e3": "VNDeepSetsCanonicalizer"}
    # the three canonicalized rows share one optimiser set-up (the CN rows' lr), the bare MLP the base rows'
    assert {_config(row).model.optimizer.lr for row in ROWS[1:]} == {0.001}
    assert _config("mlp").model.optimizer.lr == compose_config(["experiment=nbody/gnn"]).model.optimizer.lr


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("selection", SELECTIONS)
def test_cn_mlp_is_e3_x_sn_equivariant_and_the_bare_mlp_is_not(selection, frames):
    model = _row("cn_mlp", f"canonicalization.second.selection={selection}")
    _assert_clear_order(model.network.canonicalizer, frames)
    _assert_passes(_check(model, frames, "E(3)×S_n"))
    _assert_fails(_check(_row("mlp"), frames, "E(3)×S_n"))


@pytest.mark.usefixtures("one_thread")
def test_cn_mlp_does_not_reduce_to_a_trivial_output(frames):
    """Equivariance must not hold vacuously: the MLP's output moves the particles (away from the inputs the
    residual adds back, by a fraction of the positions' scale) and depends on the canonical order."""
    loc, vel, charges = frames
    model = _row("cn_mlp")
    with torch.no_grad():
        out = model(loc, vel, charges)
    assert (out - loc).abs().max() > CONTROL_ABS * loc.abs().max()


@pytest.mark.usefixtures("one_thread")
def test_the_sn_half_gives_sn_and_not_e3(frames):
    model = _row("cn_mlp_sn")
    _assert_clear_order(model.network.canonicalizer, frames)
    _assert_passes(_check(model, frames, "S_n"))
    _assert_fails(_check(model, frames, "E(3)"))


@pytest.mark.usefixtures("one_thread")
def test_the_e3_half_gives_e3_and_not_sn(frames):
    model = _row("cn_mlp_e3")
    _assert_passes(_check(model, frames, "E(3)"))
    _assert_fails(_check(model, frames, "S_n"))


@pytest.mark.usefixtures("one_thread")
def test_the_bare_mlp_has_neither_symmetry(frames):
    model = _row("mlp")
    _assert_fails(_check(model, frames, "S_n"))
    _assert_fails(_check(model, frames, "E(3)"))


@pytest.mark.parametrize("selection", SELECTIONS)
def test_gradients_reach_both_factors_in_every_selection_mode(selection, frames):
    """One training-mode backward pass of ``cn_mlp``: every parameter of the VN canonicalizer, of the S_n
    scorer and of the MLP gets a finite, non-zero gradient (the scorer through the soft sort's relaxation)."""
    model = _row("cn_mlp", f"canonicalization.second.selection={selection}").train()
    loc, vel, charges = frames
    torch.manual_seed(1)  # the VN dropout mask and the Gumbel noise
    torch.nn.functional.mse_loss(model(loc, vel, charges), loc + vel).backward()
    h = model.network.canonicalizer
    for part, module in (("first", h.first), ("second", h.second), ("predictor", model.network.predictor)):
        for name, p in module.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{part}.{name}"
            assert p.grad.abs().sum() > 0, f"{part}.{name}: no gradient"


class _Losses(Callback):
    """Records each training step's loss (what ``training_step`` returned)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


@pytest.mark.usefixtures("one_thread")
def test_a_few_training_steps_lower_cn_mlps_loss(frames):
    """20 Adam steps on one batch of 16 real systems through the LightningModule and Lightning's loop (the
    row's own optimiser, lr 1e-3): every loss finite, the last ones below the first. The whole train entry
    point (``canonical_network.train.run``) runs every nbody row in tests/test_nbody_task.py."""
    loc, vel, charges = (x.float() for x in frames)
    target = loc + 0.5 * vel  # any smooth target the MLP can fit: the loop, not the physics, is tested
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(loc, vel, charges, target), batch_size=16)
    model = _row("cn_mlp", dtype=torch.float32).train()
    record = _Losses()
    trainer = Trainer(accelerator="cpu", max_steps=20, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, callbacks=[record])
    trainer.fit(model, train_dataloaders=loader)
    losses = torch.tensor(record.losses)
    assert len(losses) == 20 and torch.isfinite(losses).all()
    assert losses[-5:].mean() < losses[0], losses.tolist()


# -------------------------------------------------------------------------------------- ProductCanonicalizer
class _Affine(Canonicalizer):
    """A toy factor whose ``canonicalize`` and ``invert`` do not commute with the other's: ``x ↦ a·x + b``
    forward, ``y ↦ (y − b) / a`` back, with ``a, b`` recorded in the element; prior ``|a − 1|``."""

    group_name = "trivial"

    def __init__(self, a: float, b: float, freeze: bool = False) -> None:
        super().__init__(freeze=freeze)
        self.a, self.b = a, b
        self.weight = nn.Parameter(torch.ones(()))
        self.calls: list[str] = []

    def canonicalize(self, x):
        self.calls.append("canonicalize")
        return (self.a * x + self.b,), (self.a, self.b)

    def invert(self, output, group_element):
        self.calls.append("invert")
        a, b = group_element
        return (output - b) / a

    def prior(self, group_element):
        return torch.tensor(abs(group_element[0] - 1.0))

    def is_identity(self, group_element, batch_size):
        return torch.full((batch_size,), group_element == (1.0, 0.0))


def test_product_canonicalizes_first_then_second_and_inverts_second_then_first():
    first, second = _Affine(2.0, 0.0), _Affine(1.0, 3.0)
    h = ProductCanonicalizer(first, second)
    x = torch.tensor([[1.0]])
    (canonical,), g = h.canonicalize(x)
    assert canonical.item() == 2.0 * 1.0 + 3.0  # second(first(x)), not first(second(x)) = 8
    assert isinstance(g, ProductElement) and g.first == (2.0, 0.0) and g.second == (1.0, 3.0)
    # h₁' · h₂' · y: the second's inverse applied first; the composition undoes canonicalize exactly
    assert h.invert(canonical, g).item() == 1.0
    assert h.invert(torch.tensor([[7.0]]), g).item() == (7.0 - 3.0) / 2.0  # first(second⁻¹) order: 2, not 0.5
    g_first, g_second = g  # unpacks as the pair
    assert (g_first, g_second) == (g.first, g.second)


@pytest.mark.usefixtures("one_thread")
def test_the_real_product_inverts_its_own_canonical_positions(frames):
    """``invert(h(x)⁻¹ x, h(x)) = x`` for E(3) × S_n: the canonical positions go back to the input's, in the
    input's order (the 3-D frame and the order each undone once)."""
    h = _row("cn_mlp").network.canonicalizer
    loc, vel, charges = frames
    with torch.no_grad():
        (canonical, _, _), g = h.canonicalize(loc, vel, charges)
        assert not torch.allclose(canonical, loc)
        back = h.invert(canonical, g)
    assert (back - loc).abs().max() < EXACT_ABS


def test_product_prior_is_the_sum_of_the_factors_priors(frames):
    h = _row("cn_mlp").network.canonicalizer
    with torch.no_grad():
        _, g = h.canonicalize(*frames)
    prior = h.prior(g)
    assert prior.item() == pytest.approx((h.first.prior(g.first) + h.second.prior(g.second)).item(), rel=1e-12)
    assert h.first.prior(g.first) > 0 and h.second.prior(g.second) > 0  # both terms present at these inputs
    assert h.prior(None).item() == 0.0
    toy = ProductCanonicalizer(_Affine(3.0, 0.0), _Affine(0.5, 0.0))
    assert toy.prior(ProductElement((3.0, 0.0), (0.5, 0.0))).item() == 2.0 + 0.5


def test_product_is_identity_only_where_both_factors_are():
    h = _row("cn_mlp").network.canonicalizer
    batch, n = 3, 5
    eye = torch.eye(3, dtype=torch.float64).expand(batch, 3, 3)
    rotated = eye.clone()
    rotated[1] = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    order = torch.arange(n).expand(batch, n)
    swapped = order.clone()
    swapped[2, :2] = torch.tensor([1, 0])
    shift = torch.zeros(batch, 3, dtype=torch.float64)
    identity_both = ProductElement(EuclideanTransform(eye, shift), PermutationElement(order))
    assert h.is_identity(identity_both, batch).tolist() == [True] * 3
    mixed = ProductElement(EuclideanTransform(rotated, shift), PermutationElement(swapped))
    assert h.is_identity(mixed, batch).tolist() == [True, False, False]
    assert h.is_identity(None, batch).tolist() == [True] * 3


def test_freeze_freezes_both_factors():
    frozen = _row("cn_mlp", "canonicalization.freeze=true").network.canonicalizer
    for factor in (frozen.first, frozen.second):
        assert len(list(factor.parameters())) > 0 and not any(p.requires_grad for p in factor.parameters())
    assert frozen.train().training is False and frozen.first.training is False and frozen.second.training is False
    trainable = _row("cn_mlp").network.canonicalizer
    assert all(p.requires_grad for p in trainable.parameters())
    toy = ProductCanonicalizer(_Affine(1.0, 0.0), _Affine(1.0, 0.0), freeze=True)
    assert not toy.first.weight.requires_grad and not toy.second.weight.requires_grad


@pytest.mark.parametrize("which", ["first", "second"])
def test_a_factor_that_is_not_a_canonicalizer_is_refused_by_name(which):
    factors = {"first": _Affine(1.0, 0.0), "second": _Affine(1.0, 0.0), which: nn.Linear(3, 3)}
    with pytest.raises(TypeError, match=rf"canonicalization\.{which} must be a Canonicalizer, got Linear"):
        ProductCanonicalizer(**factors)


# -------------------------------------------------------------------------------------------------- NBodyMLP
def test_nbody_mlp_defaults_shapes_and_residual(frames):
    loc, vel, charges = (x.float() for x in frames)
    torch.manual_seed(0)
    mlp = NBodyMLP()
    linears = [m for m in mlp.net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(35, 128), (128, 128), (128, 128), (128, 15)]
    assert sum(p.numel() for p in mlp.parameters()) == 39_567  # as configs/prediction/nbody_mlp.yaml says
    out = mlp(loc, vel, charges)
    assert out.shape == loc.shape and out.dtype == torch.float32
    plain = NBodyMLP(residual=False)
    plain.load_state_dict(mlp.state_dict())
    assert torch.equal(out, loc + plain(loc, vel, charges))
    # the order matters: swapping two particles' inputs changes more than the order of the outputs
    swapped = [x[:, [1, 0, 2, 3, 4]] for x in (loc, vel, charges)]
    assert (plain(*swapped)[:, [1, 0, 2, 3, 4]] - plain(loc, vel, charges)).abs().max() > CONTROL_ABS


def test_nbody_mlp_names_the_key_for_another_number_of_particles(frames):
    loc, vel, charges = (x.float()[:, :4] for x in frames)  # 4 of the 5 particles
    with pytest.raises(ValueError, match=r"prediction\.num_particles is 5 but the inputs have N = 4 particles.*"
                                         r"set prediction\.num_particles=4"):
        NBodyMLP()(loc, vel, charges)
    assert NBodyMLP(num_particles=4)(loc, vel, charges).shape == loc.shape
    with pytest.raises(ValueError, match=r"charges must be \(B, N, 1\)"):
        NBodyMLP()(frames[0].float(), frames[1].float(), frames[2].float().squeeze(-1))


@pytest.mark.parametrize(("kwargs", "key"), [({"num_particles": 0}, "prediction.num_particles"),
                                             ({"hidden_dim": 2.5}, "prediction.hidden_dim"),
                                             ({"num_layers": 0}, "prediction.num_layers"),
                                             ({"residual": 1}, "prediction.residual")])
def test_nbody_mlp_invalid_arguments_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        NBodyMLP(**kwargs)
