"""The N-body canonicalizer of §5.2: a Vector Neuron Deep Sets network that outputs an element of E(3).

Paper §4.1 ("Point Cloud Input") splits ``h(x) = (h^O(x), h^t(x))``: ``h^O`` must be O(3)-equivariant and
translation invariant, ``h^t`` E(3)-equivariant. Here

* every particle gets the Vector Neuron feature ``[x_i − x̄, q_i (x_i − x̄), v_i, q_i v_i]`` (4 channels; ``features="p"``
  keeps the first alone, as the authors' code, ``"pv"`` the first and third; "p" is degenerate, see below):
  positions centred on the centroid ``x̄`` (translation invariant), velocities (translations do not act on
  them), and the invariant charge ``q_i`` entering as a scalar factor — scaling a vector by an invariant
  keeps it equivariant and lets the network tell the charges apart;
* ``num_layers`` VN Deep Sets layers (Appendix G.2: two layers, hidden dimension 32),
  ``y_i = VN-ReLU(W_self x_i + W_pool mean_j x_j)`` followed by vector dropout and, when the widths match,
  a residual connection; all maps are O(3)-equivariant and permutation-equivariant;
* a mean over particles and a VN linear read-out give four vectors: three orthonormalised by
  :func:`~canonical_network.groups.euclidean.gram_schmidt` (its O(3) form: reflections are symmetries of the
  dynamics, so ``R`` may have determinant −1) and a learned offset ``o`` with ``t = x̄ + o``. With
  ``translation="centroid"`` (the "CN-GNN-O(3)" row of the §5.2 table), ``t = x̄``.

Under ``g = (Q, s)``: ``R ↦ Q R`` and ``t ↦ Q t + s``, so the canonical inputs ``(x − t) R`` and ``v R`` are
invariant and ``invert(f(...), h(x)) = f(...) Rᵀ + t`` is E(3)-equivariant whatever the predictor ``f``.

Dropout (Appendix G.2: ``p = 0.5``) drops whole vectors
(:class:`~canonical_network.nn.vector_neurons.VNDropout`), so even in training mode the canonicalizer is
exactly equivariant for a given dropout mask.

Positions alone (``features="p"``) leave an exactly equivariant network nothing to build a frame from: the
centred positions average to 0, and VN layers on one channel per particle only rescale it (the VN-ReLU of a
vector along its own direction keeps or zeroes it, the same choice for every particle), so every hidden
feature of particle ``i`` is ``c (x_i − x̄)`` with one ``c`` for all particles and the pooled frame vectors are
``c · 0``. Without dropout only the VN-ReLU's ``VN_EPS`` guard and rounding make them non-zero (~1e-5 of the
input's scale untrained, ~1e-7 after 1,000 epochs, below :func:`gram_schmidt`'s zero-frame threshold, hence the
identity, for 42-99 % of the test systems: ``scripts/nbody_frame_scale.py``); in training, vector dropout gives frames of random particle
subsets. It is kept as the ablation it was run as (``docs/nbody.md``), with a warning. The authors' code escapes
the degeneracy through the biases of ``authors_code``, which break equivariance.

``authors_code=True`` is an ablation, not a model: it puts back the three details of the authors' public
N-body canonicalizer (oumarkaba/canonical_network, ``models/euclideangraph_base_models.py`` and
``models/euclideangraph_model.py``) that break O(3) equivariance — a bias on every VN feature (their
``nn.Linear`` on the channel axis adds ``b_c`` to each coordinate of channel ``c``), element-wise dropout, and
Gram–Schmidt over the coordinate rows of the output instead of over its vectors — to measure how much of the
paper's CN-GNN number (0.0043) those details carry. Translations still act correctly (the inputs are
centred); rotations and reflections do not (``tests/test_canonicalizers3d.py`` shows it failing the check the
default passes).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.canonicalization.symmetrization import Frame, FrameSpec, vector_frame
from canonical_network.groups.euclidean import EuclideanTransform, gram_schmidt_frame, random_orthogonal
from canonical_network.nn.vector_neurons import VNDropout, VNLinear, vn_leaky_relu, vn_mean_pool
from canonical_network.utils.checks import check_bool, check_choice, check_fraction, check_int

log = logging.getLogger(__name__)

TRANSLATIONS = ("learned", "centroid")
#: What the canonicalizer sees of each particle, as VN channels: ``p`` the centred position ``x_i − x̄``,
#: ``v`` the velocity, ``q`` charge-scaled copies of those (``q_i (x_i − x̄)``, ``q_i v_i``). "pvq" is ours
#: (Appendix G.2 names no inputs); "p" is the authors' N-body code (``canon_feature="p"``), degenerate without
#: its non-equivariant biases (module docstring).
FEATURES = {"pvq": 4, "pv": 2, "p": 1}


class VNDeepSetsLayer(nn.Module):
    """One VN Deep Sets layer on ``(B, C_in, 3, N)`` → ``(B, C_out, 3, N)``.

    ``y_i = σ(W_self x_i + W_pool mean_j x_j)`` with the VN leaky ReLU ``σ`` along a learned direction of the
    pre-activation, then vector dropout, then ``+ x_i`` if ``C_in = C_out``. Equivariance: O(3) and
    permutations of the particles.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        negative_slope: float,
        dropout: float,
        authors_code: bool = False,
    ) -> None:
        super().__init__()
        self.self_map = VNLinear(in_channels, out_channels)
        self.pool_map = VNLinear(in_channels, out_channels)
        self.direction = VNLinear(out_channels, out_channels)
        # authors_code: one bias per output channel added to all three coordinates, and dropout of single
        # coordinates; both break O(3) equivariance (module docstring)
        self.bias = _coordinate_bias(in_channels, out_channels) if authors_code else None
        self.dropout = nn.Dropout(dropout) if authors_code else VNDropout(dropout)
        self.negative_slope = negative_slope
        self.residual = in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.self_map(x) + self.pool_map(vn_mean_pool(x, -1, keepdim=True))
        if self.bias is not None:
            pre = pre + self.bias.view(1, -1, 1, 1)
        out = self.dropout(vn_leaky_relu(pre, self.direction(pre), self.negative_slope))
        return out + x if self.residual else out


def _coordinate_bias(in_channels: int, out_channels: int) -> nn.Parameter:
    """A bias ``(C_out,)`` initialised as ``nn.Linear``'s: uniform in ``±1/sqrt(C_in)``."""
    bound = in_channels**-0.5
    return nn.Parameter(torch.empty(out_channels).uniform_(-bound, bound))


class VNDeepSetsCanonicalizer(Canonicalizer):
    """``h(loc, vel, charges) = (R, t) ∈ E(3)`` for the N-body task (paper §5.2, Appendix G.2).

    Args:
        hidden_dim: VN channels of the hidden layers (Appendix G.2: 32).
        num_layers: VN Deep Sets layers before pooling (Appendix G.2: 2).
        dropout: probability of dropping a whole hidden vector (Appendix G.2: 0.5).
        translation: "learned" (``t = x̄ + o(x)``, the "CN-GNN" rows) or "centroid" (``t = x̄``,
            "CN-GNN-O(3)").
        negative_slope: of the VN leaky ReLU; 0 (VN-ReLU) as in the authors' public N-body configuration.
        freeze: keep the initial weights (the "CN-GNN (frozen)" row).
        features: the VN input channels of each particle (:data:`FEATURES`): "pvq" (default), "pv" or "p"
            (the centred positions alone, as the authors' code). All are equivariant inputs.
        authors_code: the ablation of the module docstring — the authors' three non-equivariant details
            (biases on VN features, element-wise dropout, Gram–Schmidt over coordinate rows). Not equivariant.
        frame_augmentation: in training, turn each canonical frame by its own Haar-random element S of O(3)
            (``R ← R S``): the predictor learns on randomly turned canonical systems, as with data augmentation
            (which a canonicalizer would undo, acting before it), the model is equivariant in distribution while
            training and exactly in evaluation, where S = I. ``R S`` is Haar whatever ``R``, so a learned
            canonicalizer gets no signal from it: meant with ``freeze`` ("CN-GNN (frozen, turned frames)",
            ``docs/nbody.md``). The model's training mode decides, also when the canonicalizer is frozen.
            ``symmetrization=canonical`` only.
        frozen_dropout: with ``freeze``, keep the vector dropout acting while the model trains (evaluation
            unchanged), as in the authors' code, which freezes the canonicalizer with Lightning's ``freeze()``
            and, under the Lightning 1.x it was written for, most likely trained with its dropout on after the
            first validation (``docs/nbody.md``). The frozen function then hands the predictor the frames of
            random particle subsets in training. Equivariant for each dropout mask, exactly in evaluation.

    Inputs of :meth:`canonicalize`: ``loc`` ``(B, N, 3)``, ``vel`` ``(B, N, 3)``, ``charges`` ``(B, N, 1)``.
    """

    #: the tasks (model._target_'s class) whose inputs h takes (utils/run_config.py checks it)
    tasks = ("NBodyDynamicsTask",)

    group_name = "E(3)"

    def __init__(
        self,
        hidden_dim: int = 32,
        num_layers: int = 2,
        dropout: float = 0.5,
        translation: str = "learned",
        negative_slope: float = 0.0,
        freeze: bool = False,
        authors_code: bool = False,
        features: str = "pvq",
        frame_augmentation: bool = False,
        frozen_dropout: bool = False,
    ) -> None:
        super().__init__(freeze=freeze)
        self.frame_augmentation = check_bool("canonicalization.frame_augmentation", frame_augmentation)
        self.frozen_dropout = check_bool("canonicalization.frozen_dropout", frozen_dropout)
        if self.frozen_dropout and not self.freeze:
            raise ValueError("canonicalization.frozen_dropout=true keeps a frozen canonicalizer's dropout acting in "
                             "training; it needs canonicalization.freeze=true (a canonicalizer that trains drops "
                             "vectors in training anyway)")
        self.features = check_choice("canonicalization.features", features, tuple(FEATURES))
        self.authors_code = check_bool("canonicalization.authors_code", authors_code)
        hidden_dim = check_int("canonicalization.hidden_dim", hidden_dim, low=1)
        num_layers = check_int("canonicalization.num_layers", num_layers, low=1)
        dropout = check_fraction("canonicalization.dropout", dropout)
        negative_slope = check_fraction("canonicalization.negative_slope", negative_slope)
        self.translation = check_choice("canonicalization.translation", translation, TRANSLATIONS)
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers

        if self.features == "p" and not self.authors_code:
            log.warning(
                "canonicalization.features=p: an equivariant VN Deep Sets network on the centred positions alone "
                "outputs frame vectors that are zero up to VN_EPS and rounding outside training (docs/nbody.md); "
                "its frames are not equivariant in practice. Use features=pvq (default) or pv.")
        in_channels = FEATURES[self.features]
        widths = [in_channels] + [hidden_dim] * num_layers
        self.layers = nn.ModuleList(
            VNDeepSetsLayer(c_in, c_out, negative_slope, dropout, authors_code)
            for c_in, c_out in zip(widths, widths[1:], strict=False)
        )
        # three frame vectors, plus the translation offset when it is learned
        self.readout = VNLinear(hidden_dim, 4 if translation == "learned" else 3)
        self.readout_bias = (
            _coordinate_bias(hidden_dim, self.readout.weight.shape[0]) if authors_code else None
        )

    @staticmethod
    def _check_inputs(loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor) -> torch.Tensor:
        if loc.dim() != 3 or loc.shape[-1] != 3 or vel.shape != loc.shape:
            raise ValueError(
                f"loc and vel must both have shape (B, N, 3), got {tuple(loc.shape)} and {tuple(vel.shape)}"
            )
        if charges.dim() == 2:
            charges = charges.unsqueeze(-1)
        if charges.shape != loc.shape[:2] + (1,):
            raise ValueError(f"charges must have shape (B, N, 1), got {tuple(charges.shape)}")
        return charges

    def frame_vectors(
        self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw network outputs: ``(vectors (B, 3 or 4, 3), centroid (B, 3))``; rows are vectors."""
        charges = self._check_inputs(loc, vel, charges)
        centroid = loc.mean(dim=1)  # (B, 3)
        centred = loc - centroid.unsqueeze(1)
        channels = {"p": [centred], "pv": [centred, vel], "pvq": [centred, charges * centred, vel, charges * vel]}
        features = torch.stack(channels[self.features], dim=1)  # (B, C, N, 3)
        x = features.transpose(2, 3)  # (B, C, 3, N): VN layout
        if self.frozen_dropout:  # the frozen modules stay in eval mode; their dropout follows the model's mode
            for layer in self.layers:
                layer.dropout.train(self.model_training)
        for layer in self.layers:
            x = layer(x)
        vectors = self.readout(vn_mean_pool(x, -1))
        if self.readout_bias is not None:
            vectors = vectors + self.readout_bias.view(1, -1, 1)
        return vectors, centroid

    def group_element(
        self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor
    ) -> EuclideanTransform:
        """``h(x) = (R (B, 3, 3), t (B, 3))``; the columns of ``R`` are the learned frame axes."""
        vectors, centroid = self.frame_vectors(loc, vel, charges)
        # gram_schmidt orthonormalises columns: the vectors (rows of `vectors`), or with authors_code the
        # coordinate rows, as the authors' code does
        frame = vectors[:, :3] if self.authors_code else vectors[:, :3].transpose(1, 2)
        # degenerate: no O(3)-equivariant frame exists for the system (one particle, a planar or collinear
        # system): Gram–Schmidt fell back to a fixed axis, and the element says so
        rotation, degenerate = gram_schmidt_frame(frame, "O3")
        if self.frame_augmentation and self.model_training:  # in training: R S, S Haar on O(3), one per system
            rotation = rotation @ random_orthogonal(rotation.shape[0], dtype=rotation.dtype, device=rotation.device)
        translation = centroid + vectors[:, 3] if self.translation == "learned" else centroid
        return EuclideanTransform(rotation, translation).marked(degenerate)

    def canonicalize(
        self, loc: torch.Tensor, vel: torch.Tensor, charges: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], EuclideanTransform]:
        """``((loc − t) R, vel R, charges), (R, t)``: the system seen in its learned frame."""
        g = self.group_element(loc, vel, charges)
        return (g.inverse_on_points(loc), g.inverse_on_vectors(vel), charges), g

    def invert(self, output: torch.Tensor, group_element: EuclideanTransform) -> torch.Tensor:
        """Predicted positions ``(B, N, 3)`` back to the input frame: ``pred Rᵀ + t``."""
        return group_element.apply_to_points(output)

    def symmetrization_error(self, mode: str) -> str | None:
        if mode == "full":
            return "E(3) is infinite: there is no full frame to average over; use weighted_frame or sampled"
        if mode != "canonical" and self.authors_code:
            return "canonicalization.authors_code=true is not equivariant, so neither is any frame built from it"
        if mode != "canonical" and self.frame_augmentation:
            return "canonicalization.frame_augmentation turns the canonical frame only (symmetrization=canonical)"
        return None

    def build_frame(self, inputs: tuple[torch.Tensor, ...], spec: FrameSpec) -> Frame:
        """``weighted_frame`` or ``sampled`` rotations from the three frame vectors
        (``symmetrization.vector_frame``, O(3) Gram–Schmidt: an O(3) weighted frame has ``2·frame_size``
        members), each with the canonical mode's translation ``t``, which is deterministic in every mode."""
        loc, vel, charges = inputs
        vectors, centroid = self.frame_vectors(loc, vel, charges)
        rotations, weights = vector_frame(vectors[:, :3], "O3", spec)
        k = weights.shape[1]
        translation = centroid + vectors[:, 3] if self.translation == "learned" else centroid
        g = EuclideanTransform(rotations, translation.repeat(k, 1))
        loc, vel, charges = self.repeat_inputs(inputs, k)
        return self.frame_of((g.inverse_on_points(loc), g.inverse_on_vectors(vel), charges), g, weights)


__all__ = ["FEATURES", "TRANSLATIONS", "VNDeepSetsCanonicalizer", "VNDeepSetsLayer"]
