"""The S_n canonicalizer (canonicalization/permutation.py): Sinkhorn's marginals, the hard order, φ = Pᵀ f(P x)
around a non-equivariant MLP, gradients in every selection mode, eval determinism, freeze and the prior."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import canonical_network as cn
from canonical_network.canonicalization.permutation import SELECTIONS, sinkhorn, soft_sort_logits
from canonical_network.groups.permutation import permute

B, N, D = 4, 6, 3
EPS64 = torch.finfo(torch.float64).eps


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, D, generator=gen, dtype=torch.float64), torch.randn(B, N, 1, generator=gen,
                                                                                  dtype=torch.float64)


def _h(**kwargs) -> cn.PermutationCanonicalizer:
    torch.manual_seed(0)
    return cn.PermutationCanonicalizer(in_features=D + 1, **kwargs).double()


def _row_error_bound(log_alpha: torch.Tensor, iterations: int) -> torch.Tensor:
    """Birkhoff–Hopf: a positive matrix contracts Hilbert's projective metric by κ = tanh(Δ/4), Δ = the log
    of its largest cross ratio α_ik α_jl / (α_jk α_il). After the first row-and-column normalisation the row
    sums r (mean 1, the columns summing to 1) are within Δ of the all-ones vector in that metric, and each
    further iteration (two maps by α, αᵀ and reciprocals, which are isometries) multiplies the distance by
    κ²; so d_k ≤ κ^{2(k−1)} Δ, and max |r_i − 1| ≤ exp(d_k) − 1 (min r ≤ 1 ≤ max r, max/min ≤ e^{d_k})."""
    c = log_alpha
    # Δ = max over row pairs (i, l) of the oscillation over columns of c_i· − c_l·
    diff = c.unsqueeze(-2) - c.unsqueeze(-3)  # (B, i, l, j)
    delta = (diff.amax(-1) - diff.amin(-1)).amax(dim=(-2, -1))
    kappa = torch.tanh(delta / 4)
    return torch.expm1(kappa ** (2 * (iterations - 1)) * delta)


@pytest.mark.parametrize(("temperature", "iterations"), [(1.0, 3), (1.0, 30), (0.3, 10), (3.0, 5), (3.0, 30)])
def test_sinkhorn_is_doubly_stochastic_within_the_derived_bound(temperature, iterations):
    scores = torch.randn(B, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    log_alpha = soft_sort_logits(scores, temperature)
    s = sinkhorn(log_alpha, iterations)
    rounding = 4 * N * iterations * EPS64  # each normalisation rounds by ~n·eps
    assert (s.sum(-2) - 1).abs().max() <= rounding  # columns: normalised last
    bound = _row_error_bound(log_alpha, iterations)
    assert ((s.sum(-1) - 1).abs().amax(-1) <= bound + rounding).all()
    assert (s >= 0).all()
    if (temperature, iterations) == (3.0, 30):  # a mild cost and enough iterations: the bound itself is small
        assert bound.max() < 1e-6


def test_the_hard_order_sorts_the_scores_and_canonicalize_is_exactly_invariant():
    h = _h().eval()
    x, q = _inputs()
    with torch.no_grad():
        scores = h.scores(x, q)
        (cx, cq), g = h.canonicalize(x, q)
        assert (scores.unsqueeze(-1) - scores.unsqueeze(-2)).abs().add(torch.eye(N)).min() > 1e-6  # distinct
        assert (scores.gather(1, g.perm).diff(dim=-1) > 0).all()
        gen = torch.Generator().manual_seed(2)
        for _ in range(5):
            sigma = cn.random_permutations(B, N, gen)
            (px, pq), _ = h.canonicalize(permute(x, sigma), permute(q, sigma))
            assert torch.equal(px, cx) and torch.equal(pq, cq)  # the same numbers, in the same order


class _FlatMLP(nn.Module):
    """Not permutation-equivariant: an MLP on the flattened (B, n·d) array, per-element outputs (B, n, d)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N * (D + 1), 64), nn.SiLU(), nn.Linear(64, N * D))

    def forward(self, x, q):
        return self.net(torch.cat([x, q], dim=-1).flatten(1)).view(x.shape[0], N, D)


@pytest.mark.parametrize("selection", SELECTIONS)
def test_phi_is_permutation_equivariant_around_a_non_equivariant_mlp(selection):
    torch.manual_seed(1)
    f = _FlatMLP().double().eval()
    model = cn.CanonicalizedModel(_h(selection=selection), f).eval()
    inputs = _inputs()
    result = cn.check_equivariance(model, inputs, "S_n", output_action="elements")
    assert result.passed and result.rtol < 1e-9, str(result)
    control = cn.check_equivariance(f, inputs, "S_n", output_action="elements")
    worst = max(control.elements, key=lambda e: e.max_abs_error)
    assert not control.passed and worst.max_abs_error > 1e6 * worst.tolerance, str(control)
    # invariant outputs pass through
    pooled = cn.CanonicalizedModel(_h(selection=selection, output="invariant"), lambda x, q: f(x, q).sum(1)).eval()
    assert cn.check_equivariance(pooled, inputs, "S_n").passed


@pytest.mark.parametrize("selection", [*SELECTIONS, "straight_through", "gumbel_sinkhorn"])
def test_gradients_reach_the_scorer_in_every_selection_mode(selection):
    torch.manual_seed(1)
    h = _h(selection=selection).train()
    model = cn.CanonicalizedModel(h, _FlatMLP().double())
    x, q = _inputs()
    model(x, q).square().mean().backward()
    for name, p in h.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gumbel_is_stochastic_in_training_and_deterministic_in_eval():
    h = _h(selection="gumbel", temperature=3.0)
    x, q = _inputs()
    with torch.no_grad():
        h.train()
        perms = {tuple(h.canonicalize(x, q)[1].perm.flatten().tolist()) for _ in range(10)}
        assert len(perms) > 1
        h.eval()
        (a, _), g1 = h.canonicalize(x, q)
        (b, _), g2 = h.canonicalize(x, q)
        assert torch.equal(a, b) and torch.equal(g1.perm, g2.perm)
        assert torch.equal(g1.perm, h.scores(x, q).argsort(dim=-1))


def test_freeze_and_prior_weight():
    frozen = _h(freeze=True)
    assert not any(p.requires_grad for p in frozen.parameters()) and frozen.train().training is False
    h = _h(prior_weight=0.5)
    assert h.prior_weight == 0.5 and _h().prior_weight == 0.0
    x, q = _inputs()
    _, g = h.train().canonicalize(x, q)
    displaced = (g.perm != torch.arange(N)).sum(-1).double()
    prior = h.prior(g)
    assert math.isclose(prior.item(), (2 * displaced / N).mean().item(), rel_tol=1e-12)  # ‖P − I‖²_F / n
    loss = torch.zeros((), dtype=torch.float64)
    total = h.add_prior_regularizer(loss, g)
    assert math.isclose(total.item(), 0.5 * prior.item(), rel_tol=1e-12)
    total.backward()  # the prior's straight-through gradient reaches the scorer
    assert h.readout.weight.grad.abs().sum() > 0
    assert h.is_identity(g, B).tolist() == (displaced == 0).tolist()
    identity = cn.PermutationElement(torch.arange(N).expand(B, N))
    assert h.is_identity(identity, B).all() and h.prior(identity).item() == 0.0
    with pytest.raises(ValueError, match="prior_weight must be a finite number >= 0"):
        _h(prior_weight=-1.0)


@pytest.mark.parametrize("selection", ["ste", "gumbel"])
def test_the_fast_path_skips_sinkhorn_and_gives_the_same_outputs(selection):
    """Without a gradient to carry, ``ste``/``gumbel`` hold the sort alone (``relaxed=None``); the outputs, the
    order and the prior's value are those of the full path (Sinkhorn built, straight-through term 0 forward)."""
    torch.manual_seed(1)
    h = _h(selection=selection)
    model = cn.CanonicalizedModel(h, _FlatMLP().double()).eval()
    x, q = _inputs()
    with torch.no_grad():
        fast = model(x, q)
        _, g_fast = h.canonicalize(x, q)
    full = model(x, q)  # the scorer's weights require a gradient: Sinkhorn is built
    _, g_full = h.canonicalize(x, q)
    assert g_fast.relaxed is None and g_full.relaxed is not None and g_full.relaxed.requires_grad
    assert torch.equal(fast, full.detach()) and torch.equal(g_fast.perm, g_full.perm)
    # hard + S − S rounds to within an ulp of the hard matrix's entries
    assert math.isclose(h.prior(g_fast).item(), h.prior(g_full).item(), rel_tol=4 * N * N * EPS64)
    assert h.is_identity(g_fast, B).tolist() == h.is_identity(g_full, B).tolist()
    # frozen scorer, grad mode on, inputs without a gradient: nothing to carry, the fast path again
    frozen = _h(selection=selection, freeze=True)
    assert frozen.canonicalize(x, q)[1].relaxed is None
    # inputs that require a gradient (a product's first factor upstream): the full path, the gradient flows
    x_grad = x.clone().requires_grad_(True)
    (cx, _), g = frozen.canonicalize(x_grad, q)
    assert g.relaxed is not None
    cx.square().sum().backward()
    assert x_grad.grad is not None
    # soft applies the matrix forward: never the fast path
    with torch.no_grad():
        assert _h(selection="soft").eval().canonicalize(x, q)[1].relaxed is not None


# ----------------------------------------------- the check itself: integer inputs, n = 3, part logits (a review)

def test_integer_inputs_are_moved_so_the_check_is_not_vacuous():
    """Integer inputs were returned unmoved whatever their action: a model privileging element 0's integer type
    passed S_n, and a plain CNN on uint8 images passed C4 with error exactly 0 (model(x) against model(x))."""
    types = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]])
    positions = torch.randn(2, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def first_type(p, t):  # not S_n-invariant: reads element 0
        return (t[:, :1].to(p.dtype) * 3.0 + p.sum(dim=(1, 2))[:, None])

    def type_counts(p, t):  # S_n-invariant
        return torch.nn.functional.one_hot(t, 3).sum(1).to(p.dtype) + p.sum(dim=(1, 2))[:, None]

    assert not cn.check_equivariance(first_type, (positions, types), "S_n").passed
    assert cn.check_equivariance(type_counts, (positions, types), "S_n").passed
    images = torch.randint(0, 255, (3, 1, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    corner = lambda x: x[:, :, :2, :2].float().flatten(1)  # noqa: E731 (not rotation invariant)
    assert not cn.check_equivariance(corner, images, "C4").passed
    with pytest.raises(TypeError, match="floating-point coordinates, got torch.int64"):
        cn.check_equivariance(lambda p: p.float(), torch.ones(2, 4, 3, dtype=torch.long), "SO(3)")


def test_with_three_elements_a_per_sample_vector_is_not_taken_for_three_elements():
    """(B, 3) is one point per sample, not 3 elements, even when the set has 3: the centroid of 3 particles is
    E(3) x S_n-equivariant (it failed), and an ambiguous (B, 3) input must be named (it was permuted)."""
    particles = torch.randn(4, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert cn.check_equivariance(lambda p: p.mean(dim=1), particles, "E(3)×S_n", output_action="points").passed
    assert not cn.check_equivariance(lambda p: p[:, 0], particles, "E(3)×S_n", output_action="points").passed
    per_sample = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"input 1 has shape \(4, 3\) with a set of 3 elements"):
        cn.check_equivariance(lambda p, u: p.sum(1) + u, (particles, per_sample), "S_n")
    pairs = lambda p, u: (p[:, :, 0] * u).sum(-1, keepdim=True)  # noqa: E731 (pairs particle k with u's coordinate k)
    assert not cn.check_equivariance(pairs, (particles, per_sample), "S_n", input_actions=("elements", "invariant"))


def test_part_segmentation_refuses_part_logits_left_in_the_sorted_order():
    import hydra

    from tests.helpers import compose_config

    cfg = compose_config(["experiment=shapenet/pointnet", "canonicalization=so3_permutation"])
    with pytest.raises(Exception, match="canonicalization.second.output=invariant: part segmentation"):
        hydra.utils.instantiate(cfg.model)
    cfg = compose_config(["experiment=shapenet/pointnet", "canonicalization=so3_permutation",
                          "canonicalization.second.output=elements"])
    hydra.utils.instantiate(cfg.model)
