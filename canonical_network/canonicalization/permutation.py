"""The S_n canonicalizer: an order of the set's elements learned by a permutation-equivariant scorer.

``h(x)`` for inputs ``(B, n, ...)`` (N-body's ``loc, vel, charges``; a point cloud ``(B, n, 3)``):

* a Deep Sets scorer (Zaheer et al. 2017) gives each element a score: ``num_layers`` layers
  ``y_i = SiLU(W_self y_i + W_pool mean_j y_j + b)`` then a linear read-out ``s_i = w · y_i``. Every layer is
  permutation-equivariant, so permuting the elements permutes the scores. It reads the inputs listed in
  ``features`` (positions in the call; ``None``: all of them), each flattened per element and concatenated
  along the feature axis (``in_features`` numbers per element: 7 for N-body's ``[x, v, q]``);
* the canonical order is the sort of the scores (ascending, ``perm = argsort(s)``), the hard permutation
  ``P`` with ``P[k, perm[k]] = 1``; canonical inputs ``P x`` (every input, along dim 1) are exactly the same
  numbers for every permutation of ``x`` whenever the scores of distinct elements differ (beyond rounding);
* per-element outputs go back by ``Pᵀ``: ``φ(x) = Pᵀ f(P x)`` is permutation-equivariant whatever ``f``
  (``invert``); invariant outputs pass through (``output="invariant"``).

The relaxation (how training reaches the scorer through a discrete sort), ``selection``:

* the soft permutation: Sinkhorn (log domain) on the score-to-rank cost
  ``log α[k, i] = −|sort(s)_k − s_i| / temperature`` — SoftSort's matrix (Prillo & Eisenschlos 2020), made
  doubly stochastic by ``sinkhorn_iterations`` row/column normalisations. Row ``k``'s maximum is at the
  element of rank ``k`` (cost 0), so the matrix tends to ``P`` as the temperature goes to 0, and permuting
  the elements permutes its columns.
* ``ste`` (alias ``straight_through``): the hard ``P`` forward, the soft matrix's gradient backward
  (``P + S − stop_grad(S)``, applied as an exact gather plus a term that is 0 in the forward pass);
* ``gumbel`` (alias ``gumbel_sinkhorn``, Mena et al. 2018): in training, Gumbel(0, 1) noise scaled by the
  temperature is added to the scores before sorting and before the soft matrix is built (sorting
  Gumbel-perturbed scores samples a Plackett–Luce order: the Gumbel-max trick for orders, and the noise
  enters the Sinkhorn cost as in Gumbel–Sinkhorn; noise on the n scores rather than on the n² entries keeps
  the hard sample a sort, with no Hungarian matching), then straight-through as ``ste``; hard and noiseless
  in eval and when frozen;
* ``soft``: the doubly stochastic matrix ``S`` itself is applied (``S x``, and ``Sᵀ y`` on the way back), no
  single order; also exactly equivariant (``S`` of permuted inputs is ``S`` with permuted columns), but the
  predictor sees mixtures of elements.

When no gradient can flow (``torch.no_grad()``, or neither the scorer's weights nor its inputs require one:
evaluation, a frozen canonicalizer on fixed inputs), ``ste`` and ``gumbel`` skip the Sinkhorn matrix, which
would only carry a gradient: the element holds the sort alone (``relaxed=None``), O(n log n) instead of
O(n² · sinkhorn_iterations), and the outputs are the same numbers (the straight-through term is 0 forward).
``soft`` always builds it: its forward pass applies it.

The names ``ste | gumbel | soft`` are those of the G-CNN canonicalizer (DESIGN.md: every discrete
canonicalizer's ``selection``). The element is a :class:`~canonical_network.groups.permutation.PermutationElement`;
the canonicalization prior is ``‖M − I‖²_F / n`` with ``M`` the matrix the forward pass applied (hard with the
straight-through gradient, or soft): the fraction of displaced elements, times 2.

Sinkhorn and the soft sort are written here in torch, not taken from POT: they are a few lines of a
differentiable op on batched ``(B, n, n)`` tensors on any device, where POT's solvers are built for one
(or a few) transport problems with NumPy-style backends; no dependency for that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer, Inputs
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec
from canonical_network.groups.permutation import PermutationElement, permute, unpermute
from canonical_network.utils.checks import check_choice, check_int, check_positive

#: how the order is chosen from the scores (``canonicalization.selection``); the long names are aliases
SELECTIONS = ("ste", "gumbel", "soft")
ALIASES = {"straight_through": "ste", "gumbel_sinkhorn": "gumbel"}
#: how ``invert`` maps the predictor's output back: per element (``Pᵀ y``) or unchanged
OUTPUTS = ("elements", "invariant")


def sinkhorn(log_alpha: torch.Tensor, iterations: int) -> torch.Tensor:
    """``exp`` of ``iterations`` alternating row and column normalisations of ``log_alpha`` ``(..., n, n)``,
    in the log domain (``logsumexp``: no overflow or underflow whatever the temperature).

    The columns sum to 1 up to rounding after the last step; the rows' error shrinks geometrically
    (Birkhoff–Hopf: by ``tanh(Δ/4)²`` per iteration, ``Δ`` the log of ``α``'s largest cross ratio;
    ``tests/test_permutation_canonicalizer.py`` checks that bound).
    """
    for _ in range(iterations):
        log_alpha = log_alpha - log_alpha.logsumexp(dim=-1, keepdim=True)
        log_alpha = log_alpha - log_alpha.logsumexp(dim=-2, keepdim=True)
    return log_alpha.exp()


def soft_sort_logits(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(B, n, n)``: ``−|sort(s)_k − s_i| / temperature`` (SoftSort's cost; row ``k`` peaks at rank ``k``)."""
    ranked = scores.sort(dim=-1).values
    return -(ranked.unsqueeze(-1) - scores.unsqueeze(-2)).abs() / temperature


class DeepSetsLayer(nn.Module):
    """``y_i = SiLU(W_self x_i + W_pool mean_j x_j + b)`` on ``(B, n, C_in)``: permutation-equivariant."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.self_map = nn.Linear(in_features, out_features)
        self.pool_map = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.self_map(x) + self.pool_map(x.mean(dim=1, keepdim=True)))


class PermutationCanonicalizer(Canonicalizer):
    """``h(x) ∈ S_n``: the order of the elements by a Deep Sets score (module docstring).

    Args:
        in_features: numbers per element the scorer reads (the flattened features of the inputs in
            ``features``, concatenated): 7 for N-body's ``loc (3), vel (3), charges (1)``.
        features: positions of the inputs the scorer reads (e.g. ``[0]``: N-body positions only);
            ``None`` (default): all of them.
        hidden_dim: width of the Deep Sets layers.
        num_layers: Deep Sets layers before the read-out (≥ 1).
        selection: "ste" (alias "straight_through"), "gumbel" (alias "gumbel_sinkhorn") or "soft".
        temperature: of the soft-sort cost ``−|sort(s)_k − s_i| / temperature`` (and the Gumbel noise's scale).
        sinkhorn_iterations: row/column normalisations of the soft matrix.
        output: "elements" (per-element outputs ``(B, n, ...)``, mapped back by ``Pᵀ``) or "invariant".
        freeze: keep the initial weights.
    """

    #: the tasks (model._target_'s class) whose inputs h takes: sets, (B, n, ...) along dim 1 (particles, points),
    #: not images (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask", "PointCloudClassificationTask", "PartSegmentationTask")
    group_name = "S_n"

    def __init__(
        self,
        in_features: int = 7,
        features: list[int] | None = None,
        hidden_dim: int = 32,
        num_layers: int = 2,
        selection: str = "ste",
        temperature: float = 1.0,
        sinkhorn_iterations: int = 20,
        output: str = "elements",
        freeze: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        self.in_features = check_int("canonicalization.in_features", in_features, low=1)
        self.features = None if features is None else [
            check_int("canonicalization.features[]", f, low=0) for f in features
        ]
        hidden_dim = check_int("canonicalization.hidden_dim", hidden_dim, low=1)
        num_layers = check_int("canonicalization.num_layers", num_layers, low=1)
        self.selection = check_choice(
            "canonicalization.selection", ALIASES.get(selection, selection), SELECTIONS
        )
        self.temperature = check_positive("canonicalization.temperature", temperature)
        self.sinkhorn_iterations = check_int("canonicalization.sinkhorn_iterations", sinkhorn_iterations, low=1)
        self.output = check_choice("canonicalization.output", output, OUTPUTS)
        widths = [self.in_features] + [hidden_dim] * num_layers
        self.layers = nn.ModuleList(DeepSetsLayer(a, b) for a, b in zip(widths, widths[1:], strict=False))
        # no bias: the order and the soft sort depend on score differences only (a bias would get no gradient)
        self.readout = nn.Linear(hidden_dim, 1, bias=False)

    def element_features(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``(B, n, in_features)``: what the scorer reads of each element (the inputs in ``features``, flattened
        per element and concatenated). Elements with equal rows here get equal scores: ``diagnose`` uses it to
        tell duplicated elements from distinct ones whose scores happen to tie."""
        chosen = inputs if self.features is None else [inputs[i] for i in self.features]
        batch, n = inputs[0].shape[:2]
        for x in chosen:
            if x.dim() < 2 or x.shape[:2] != (batch, n):
                raise ValueError(f"PermutationCanonicalizer: every input must be (B, n, ...) with B, n = {batch}, {n}; "
                                 f"got {tuple(x.shape)}")
        y = torch.cat([x.reshape(batch, n, -1).to(inputs[0].dtype) for x in chosen], dim=-1)
        if y.shape[-1] != self.in_features:
            raise ValueError(f"PermutationCanonicalizer: the scorer reads {y.shape[-1]} numbers per element but "
                             f"in_features is {self.in_features}")
        return y

    def hidden_features(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``(B, n, hidden_dim)``: the last Deep Sets layer's features, which the read-out turns into scores
        (``diagnose`` bounds the scores' rounding by the read-out's terms ``|w_j y_ij|``)."""
        y = self.element_features(*inputs)
        for layer in self.layers:
            y = layer(y)
        return y

    def scores(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``(B, n)``: one score per element, permutation-equivariant."""
        return self.readout(self.hidden_features(*inputs)).squeeze(-1)

    def group_element(self, *inputs: torch.Tensor) -> PermutationElement:
        """The hard order and the matrix the forward pass applies (module docstring)."""
        scores = self.scores(*inputs)
        if self.selection == "gumbel" and self.training:
            tiny = torch.finfo(scores.dtype).tiny
            noise = -torch.empty_like(scores).exponential_().clamp_min(tiny).log()
            scores = scores + self.temperature * noise.detach()
        return self._element_from_scores(scores)

    def _element_from_scores(self, scores: torch.Tensor) -> PermutationElement:
        """The sort of ``scores`` ``(B, n)`` and, when a gradient can flow, the relaxed matrix (module docstring)."""
        perm = scores.argsort(dim=-1, stable=True)
        if self.selection != "soft" and not scores.requires_grad:
            # The fast path: the hard forward reads the sort alone; the Sinkhorn matrix only carries the
            # straight-through gradient, and no gradient can flow (no_grad, or neither the scorer's weights nor
            # its inputs require one). O(n log n) instead of O(n² · sinkhorn_iterations) time and O(n²) memory.
            return PermutationElement(perm)
        soft = sinkhorn(soft_sort_logits(scores, self.temperature), self.sinkhorn_iterations)
        if self.selection == "soft":
            return PermutationElement(perm, soft)
        hard = F.one_hot(perm, perm.shape[-1]).to(soft.dtype)
        return PermutationElement(perm, hard + soft - soft.detach())

    @staticmethod
    def _mix(matrix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``matrix @ x`` along dim 1 of ``x`` ``(B, n, ...)``."""
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        return (matrix.to(flat.dtype) @ flat).view_as(x)

    def _move(self, g: PermutationElement, x: torch.Tensor, inverse: bool) -> torch.Tensor:
        moved = unpermute(x, g.perm) if inverse else permute(x, g.perm)
        # integer inputs (labels) are moved exactly, without a gradient; so is everything when the element
        # carries no matrix (the fast path, or an element built from a ``perm`` alone)
        if not x.is_floating_point() or g.relaxed is None:
            return moved
        matrix = g.relaxed.transpose(-1, -2) if inverse else g.relaxed
        if self.selection == "soft":
            return self._mix(matrix, x)
        if not (torch.is_grad_enabled() and matrix.requires_grad):
            return moved
        # straight-through: the exact gather, plus (S − stop_grad(S)) x, which is 0 forward
        return moved + self._mix(matrix - matrix.detach(), x)

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, PermutationElement]:
        """``(P x for every per-element input, P)``: every input ``(B, n, ...)`` (``n`` the first input's) reordered
        along dim 1; the others (one per sample, e.g. ShapeNet's category ``(B, 16)``) pass through."""
        g = self.group_element(*inputs)
        n = inputs[0].shape[1]
        return tuple(self._move(g, x, inverse=False) if x.dim() >= 2 and x.shape[1] == n else x
                     for x in inputs), g

    def symmetrization_error(self, mode: str) -> str | None:
        if mode == "full":
            return "S_n has n! elements: averaging over all orders is infeasible; use sampled"
        if mode == "weighted_frame":
            return ("no weighted frame of S_n is implemented (a continuous one needs candidate orders around every "
                    "near-tie of the scores); use sampled, or canonical")
        if mode == "sampled" and self.selection == "soft":
            return "canonicalization.selection=soft applies a doubly stochastic matrix, not an order to sample"
        return None

    def build_frame(self, inputs: Inputs, spec: FrameSpec) -> Frame:
        """``sampled``: ``frame_size`` orders, each the sort of the scores plus ``frame_temperature`` times
        i.i.d. Gumbel(0, 1) noise — a Plackett–Luce draw (the Gumbel-max trick for orders). Permuting the
        elements permutes the scores and leaves the noise's law unchanged, so the law of the order of ``P·x``
        is ``P`` composed with that of ``x``: equivariant in distribution. In training the drawn orders carry
        the straight-through Sinkhorn gradient of the ``ste`` selection."""
        scores = self.scores(*inputs)
        k = spec.size
        tiny = torch.finfo(scores.dtype).tiny
        noise = -torch.empty(k * scores.shape[0], scores.shape[1], dtype=scores.dtype,
                             device=scores.device).exponential_().clamp_min(tiny).log()
        g = self._element_from_scores(scores.repeat(k, 1) + spec.temperature * noise)
        repeated = self.repeat_inputs(inputs, k)
        n = inputs[0].shape[1]
        canonical = tuple(self._move(g, x, inverse=False) if x.dim() >= 2 and x.shape[1] == n else x
                          for x in repeated)
        weights = torch.full((scores.shape[0], k), 1.0 / k, dtype=scores.dtype, device=scores.device)
        return self.frame_of(canonical, g, weights)

    def invert(self, output: torch.Tensor, group_element: PermutationElement) -> torch.Tensor:
        """``Pᵀ y`` for per-element outputs ``(B, n, ...)``; invariant outputs unchanged."""
        if self.output == "invariant":
            return output
        return self._move(group_element, output, inverse=True)

    def prior(self, group_element: PermutationElement | None) -> torch.Tensor:
        """``‖M − I‖²_F / n`` (batch mean), ``M`` the applied matrix: twice the fraction of displaced elements
        for a hard order, with the soft matrix's gradient (the hard ``P``, without one, for an element of the
        fast path)."""
        if group_element is None:
            return torch.zeros(())
        matrix = group_element.relaxed
        if matrix is None:  # the sort alone: its hard matrix, in the scorer's dtype
            matrix = group_element.matrix().to(self.readout.weight)
        eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
        return (matrix - eye).square().sum(dim=(-2, -1)).mean() / matrix.shape[-1]

    def is_identity(self, group_element: PermutationElement | None, batch_size: int) -> torch.Tensor:
        if group_element is None:
            return torch.ones(batch_size, dtype=torch.bool)
        return group_element.is_identity()


__all__ = ["ALIASES", "OUTPUTS", "SELECTIONS", "DeepSetsLayer", "PermutationCanonicalizer", "sinkhorn",
           "soft_sort_logits"]
