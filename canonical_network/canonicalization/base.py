"""The canonicalization interface and the paper's composition, written once.

Paper Eq. (1) (§3.2):  φ(x) = h'(x) · f(h(x)⁻¹ · x)

* ``h``  — a :class:`Canonicalizer`: a small equivariant network that picks one group element per input.
* ``f``  — the prediction network: any backbone, usually not equivariant.
* ``h'`` — the same group element acting on the output (``Canonicalizer.invert``); the identity for
  invariant outputs (class logits), a rotation/translation for equivariant ones (N-body positions).

:class:`CanonicalizedModel` is the only place where this composition is written. Baselines use
:class:`~canonical_network.canonicalization.identity.IdentityCanonicalizer` (h = e), so a plain backbone and
a canonicalized one share every code path.

The canonicalization prior (Mondal et al., NeurIPS 2023, "Equivariant Adaptation of Large Pretrained
Models", §3): a canonicalizer is free to pick any pose as canonical, but a predictor (pretrained or not)
sees its training data mostly upright, so a penalty pulls h(x) toward the identity on the (upright)
training inputs. Every canonicalizer says how far its chosen element is from the identity
(:meth:`Canonicalizer.prior`); the task adds ``prior_weight · prior`` to its training loss, in one place
(:meth:`~canonical_network.tasks.base.CanonicalizedTask.model_step`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from canonical_network.canonicalization.symmetrization import (
    SYMMETRIZATIONS,
    Frame,
    FrameSpec,
    repeat_inputs,
    select_elements,
    top_member_rows,
)
from canonical_network.groups import GroupElement
from canonical_network.utils.checks import check_bool, check_number

Inputs = tuple[torch.Tensor, ...]

#: A continuous group's element counts as the identity when ``‖R − I‖_F`` is below this (R = ``g.matrix()``).
#: For a planar rotation ``‖R − I‖_F = 2√2 |sin(θ/2)|``, so 1e-3 means |θ| < 7.1e-4 rad (0.04°); a 3-D
#: frame rebuilt from float32 vectors is off the exact one by ~1e-6..1e-5 (Gram–Schmidt's rounding, see
#: ``canonicalization/pointcloud.py``), two orders of magnitude below it.
IDENTITY_TOLERANCE = 1e-3


class _AppliesBaseOptions(type(nn.Module)):
    """Metaclass of :class:`Canonicalizer`: the options every canonicalizer has, without a subclass having a
    step to remember.

    * ``freeze`` is applied once the outermost ``__init__`` has returned, i.e. after every parameter of
      every subclass exists;
    * ``prior_weight`` and the symmetrization options ``symmetrization``, ``frame_size``,
      ``frame_temperature`` and ``frame_weights`` (keyword only) are taken out of the constructor's
      arguments, checked and set here, so a subclass's ``__init__`` never sees them and every canonicalizer
      honours them. A mode the canonicalizer cannot build (:meth:`Canonicalizer.symmetrization_error`) is
      refused here, at construction, with the reason and the modes it has.
    """

    def __call__(cls, *args: Any, prior_weight: float = 0.0, symmetrization: str = "canonical",
                 frame_size: int = 2, frame_temperature: float = 1.0, frame_weights: str = "gap", **kwargs: Any):
        prior_weight = check_number("canonicalization.prior_weight", prior_weight, low=0, finite=True)
        spec = FrameSpec.checked(symmetrization, frame_size, frame_temperature, frame_weights)
        canonicalizer = super().__call__(*args, **kwargs)
        canonicalizer.prior_weight = prior_weight
        canonicalizer.frame_spec = spec
        reason = canonicalizer.symmetrization_error(spec.mode)
        if reason is not None:
            valid = [m for m in SYMMETRIZATIONS if canonicalizer.symmetrization_error(m) is None]
            raise ValueError(f"canonicalization.symmetrization={spec.mode!r} is not available for "
                             f"{cls.__name__} ({canonicalizer.group_name}): {reason}; valid here: {valid}")
        if canonicalizer.freeze:
            canonicalizer.set_frozen(True)
        return canonicalizer


class Canonicalizer(nn.Module, metaclass=_AppliesBaseOptions):
    """Base class of every canonicalization function h; it owns the contract every subclass gets for free.

    A subclass implements :meth:`canonicalize` and, when the task's outputs transform, :meth:`invert`:

    * ``canonicalize(*inputs)`` takes the *same positional inputs as the predictor* (e.g. ``(images,)`` or
      ``(loc, vel, charges)``) and returns ``(canonical_inputs, g)``: ``canonical_inputs`` a tuple of as many
      tensors as there were inputs, in the same order, each mapped to its canonical pose (invariant inputs
      such as charges or the object category pass through), and ``g`` the chosen element h(x), a
      :class:`~canonical_network.groups.GroupElement` (``None`` only for the trivial group). One shape for
      one input or several; :class:`CanonicalizedModel` checks it.
    * ``freeze`` is applied by the base class after construction (whatever the subclass builds in its
      ``__init__``), and a frozen canonicalizer stays in eval mode.
    * ``prior_weight`` is accepted by every canonicalizer's constructor (the base class's metaclass takes it;
      subclasses do not declare it) and read by the task, which adds ``prior_weight ·``
      :meth:`prior` to its training loss.
    * :meth:`prior` and :meth:`is_identity` say how far the chosen element is from the identity, from the
      group element alone (the one the forward pass used).
    * ``symmetrization`` (with ``frame_size``, ``frame_temperature``, ``frame_weights``; keywords taken by
      the metaclass, like ``prior_weight``) says over which weighted elements :class:`CanonicalizedModel`
      sums φ: ``canonical`` (the one element of :meth:`canonicalize`, the default), ``weighted_frame``,
      ``sampled`` or ``full`` (``canonicalization/symmetrization.py``). :meth:`frame` builds them; a
      subclass offering more than ``canonical`` implements :meth:`build_frame` and says which modes it
      refuses, and why, in :meth:`symmetrization_error`.
    * ``group_name`` names the group in mathematical notation: ``"C4"``, ``"D8"``, ``"SO(2)"``, ``"SO(3)"``,
      ``"O(3)"``, ``"E(3)"``, ``"trivial"``.
    * equiadapt's names, for a training loop written by hand (docs/api.md): ``x_canonical, g = canonicalizer(x)``
      (:meth:`forward`), :meth:`invert_canonicalization` and :meth:`add_prior_regularizer`, with the element
      ``g`` passed explicitly instead of kept in the canonicalizer.

    Args:
        freeze: keep the weights at their initial values (the paper's "CN(frozen)" rows). The network is
            still evaluated, but no gradient flows into it and optimisers never see its parameters.
        prior_weight: (keyword, taken by the base class) weight of the canonicalization prior in the
            training loss, ≥ 0; 0 (default) turns it off. A frozen canonicalizer gets no gradient from it.
        symmetrization: (keyword, taken by the base class) ``canonical`` | ``weighted_frame`` | ``sampled`` |
            ``full``; ``frame_size`` (k ≥ 1, default 2), ``frame_temperature`` (> 0, default 1) and
            ``frame_weights`` (``gap`` | ``softmax_gap``) are its options (:class:`FrameSpec`). The predictor
            runs once on ``k·B`` inputs: ``k`` = 1 (canonical), ``frame_size`` (weighted_frame, sampled; 2 ×
            for an O(3) weighted frame) or ``|G|`` (full).
    """

    #: the tasks (task classes by name, as ``model._target_`` ends, like a data module's ``tasks``) whose inputs
    #: h takes; ``utils/run_config.py`` refuses h under any other task before anything is built. ``None``: any
    #: task (the identity; a product, whose factors say).
    tasks: tuple[str, ...] | None = None
    #: the group the canonicalizer is equivariant to, in mathematical notation (for logs and docs).
    group_name: str = "trivial"
    #: the identity's index in a finite group's enumeration (escnn's order starts with it: no flip, angle 0)
    identity_index: int = 0
    #: weight of the canonicalization prior in the training loss (set by the metaclass; 0 = off)
    prior_weight: float = 0.0
    #: the symmetrization options (set by the metaclass; the default is the paper's single element)
    frame_spec: FrameSpec = FrameSpec()

    @property
    def symmetrization(self) -> str:
        """``canonicalization.symmetrization``: ``canonical``, ``weighted_frame``, ``sampled`` or ``full``."""
        return self.frame_spec.mode

    def __init__(self, freeze: bool = False) -> None:
        super().__init__()
        self.freeze = check_bool("canonicalization.freeze", freeze)

    def set_frozen(self, freeze: bool = True) -> Canonicalizer:
        """Freeze (or unfreeze) every parameter; called by the base class after ``__init__``, and usable later
        (e.g. on a canonicalizer whose trained weights were loaded, as CN(pretrained) does)."""
        self.freeze = check_bool("canonicalization.freeze", freeze)
        for p in self.parameters():
            p.requires_grad_(not self.freeze)
        if self.freeze:
            self.train(False)
        return self

    def __getstate__(self) -> dict:
        # the owner's weak reference neither pickles (DDP's spawn) nor may survive a copy: the model re-binds it
        state = dict(super().__getstate__())
        state.pop("_owner", None)
        return state

    @property
    def model_training(self) -> bool:
        """Whether the model this canonicalizer is part of is training: its :class:`CanonicalizedModel`'s mode
        (bound there), else the canonicalizer's own. A frozen canonicalizer's own flag stays False, and Lightning
        restores the modes of submodules after validation by setting their flags, not through ``train()``, so
        a training-only behaviour of a frozen canonicalizer (``frame_augmentation``) reads this."""
        owner = self.__dict__.get("_owner")
        model = owner() if owner is not None else None
        return model.training if model is not None else self.training

    #: whether h scores its candidates with the predictor f itself (test-time canonicalization,
    #: ``canonicalization/test_time.py``); :class:`CanonicalizedModel` then hands f over through
    #: :meth:`bind_predictor`.
    needs_predictor: bool = False

    def bind_predictor(self, predictor: nn.Module) -> None:
        """Receive the predictor f; called by :class:`CanonicalizedModel` (once, in its ``__init__``) for a
        canonicalizer with :attr:`needs_predictor`.

        The hook for canonicalizers that need f to choose h(x) (e.g. the pose f is most confident in). An
        override must keep f out of its submodules (store it in ``self.__dict__``, not as an attribute
        ``nn.Module`` would register): f belongs to the model as ``predictor``, so registering it again
        would duplicate its weights in the ``state_dict`` and in the canonicalizer's ``parameters()``.
        """
        raise NotImplementedError(f"{type(self).__name__} sets needs_predictor but does not bind the predictor")

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, GroupElement | None]:
        """Return ``(canonical_inputs, group_element)`` with ``canonical_inputs = h(x)⁻¹ · x``, a tuple."""
        raise NotImplementedError

    def invert(self, output: torch.Tensor, group_element: GroupElement | None) -> torch.Tensor:
        """Apply h'(x) to the predictor's output. Default: invariant output, returned unchanged."""
        return output

    # --- symmetrization over a frame (canonicalization/symmetrization.py) ---------------------------------

    def symmetrization_error(self, mode: str) -> str | None:
        """Why this canonicalizer cannot build ``mode`` (``None``: it can). The hook a subclass overrides when
        it implements :meth:`build_frame`; by default only ``canonical`` is available."""
        if mode == "canonical":
            return None
        return f"{type(self).__name__} builds no frame but its canonical element"

    def build_frame(self, inputs: Inputs, spec: FrameSpec) -> Frame:
        """The :class:`~canonical_network.canonicalization.symmetrization.Frame` of ``spec.mode`` (never
        ``canonical``, which :meth:`frame` builds from :meth:`canonicalize`): the ``k·B`` canonical inputs,
        elements and ``(B, k)`` weights. Implemented by the canonicalizers that support a mode."""
        raise NotImplementedError(f"{type(self).__name__} builds no {spec.mode} frame")

    def frame(self, *inputs: torch.Tensor, spec: FrameSpec | None = None) -> Frame:
        """The weighted members φ sums over, for this canonicalizer's ``symmetrization`` (or ``spec``).

        ``canonical``: :meth:`canonicalize`'s inputs and element, weight 1 (``k = 1``). Other modes:
        :meth:`build_frame`, checked to hold ``k·B`` rows per input and weights ``(B, k)``."""
        spec = self.frame_spec if spec is None else spec
        batch = inputs[0].shape[0]
        if spec.mode == "canonical":
            canonical, group_element = self.canonicalize(*inputs)
            weights = torch.ones(batch, 1, dtype=_weight_dtype(inputs), device=inputs[0].device)
            frame = Frame(canonical, group_element, weights, group_element)
        else:
            reason = self.symmetrization_error(spec.mode)
            if reason is not None:
                raise ValueError(f"canonicalization.symmetrization={spec.mode!r} is not available for "
                                 f"{type(self).__name__}: {reason}")
            frame = self.build_frame(tuple(inputs), spec)
        if not isinstance(frame.canonical, tuple) or len(frame.canonical) != len(inputs):
            got = type(frame.canonical).__name__ + (
                f" of {len(frame.canonical)}" if isinstance(frame.canonical, tuple) else "")
            raise TypeError(
                f"{type(self).__name__}.canonicalize must return (a tuple of {len(inputs)} "
                f"canonical input(s), group element); got {got}"
            )
        rows = frame.size * batch
        if frame.weights.shape[0] != batch or any(x.shape[0] != rows for x in frame.canonical):
            raise ValueError(f"{type(self).__name__}: a frame of {frame.size} members needs {rows} canonical rows "
                             f"per input and weights ({batch}, {frame.size}); got "
                             f"{[tuple(x.shape) for x in frame.canonical]} and {tuple(frame.weights.shape)}")
        return frame

    def frame_of(self, canonical: Inputs, elements: Any, weights: torch.Tensor) -> Frame:
        """A :class:`Frame` from its members, with the largest-weight member as the per-sample element."""
        return Frame(canonical, elements, weights, select_elements(elements, top_member_rows(weights)))

    @staticmethod
    def repeat_inputs(inputs: Inputs, k: int) -> Inputs:
        """Every input repeated ``k`` times along the batch, frame-major (``k·B`` rows)."""
        return repeat_inputs(inputs, k)

    # --- equiadapt's names, for a training loop written by hand (docs/api.md) -----------------------------
    # equiadapt keeps the chosen element inside the canonicalizer between calls; here it is returned and
    # passed back explicitly, so one canonicalizer can serve several batches (or threads) at once.

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor | Inputs, GroupElement | None]:
        """``x_canonical, g = canonicalizer(x)``: :meth:`canonicalize`, with the canonical inputs shaped as the
        call: one tensor for one input, a tuple for several (``(loc, vel, q), g = h(loc, vel, q)``)."""
        canonical, group_element = self.canonicalize(*inputs)
        if len(inputs) == 1 and isinstance(canonical, tuple) and len(canonical) == 1:
            return canonical[0], group_element
        return canonical, group_element

    def invert_canonicalization(self, output: torch.Tensor, group_element: GroupElement | None) -> torch.Tensor:
        """equiadapt's name for :meth:`invert`: map the predictor's output on the canonical input back by h'(x)
        (``g`` is the element ``canonicalizer(x)`` returned). The identity for invariant outputs (class logits)."""
        return self.invert(output, group_element)

    def add_prior_regularizer(self, loss: torch.Tensor, group_element: GroupElement | None) -> torch.Tensor:
        """``loss + prior_weight · prior(g)`` (equiadapt's name): what the tasks add to their training loss
        (:meth:`prior`); ``loss`` unchanged when ``prior_weight`` is 0."""
        if self.prior_weight <= 0:
            return loss
        return loss + self.prior_weight * self.prior(group_element).to(loss)

    def group_element_index(self, group_element: GroupElement | None) -> torch.Tensor | None:
        """Finite groups: the index of the chosen element per sample, (B,) int64; ``None`` otherwise."""
        return None if group_element is None else group_element.index

    def prior(self, group_element: GroupElement | None) -> torch.Tensor:
        """The canonicalization prior (Mondal et al. 2023): how far h(x) is from the identity, a scalar ≥ 0,
        the mean over the batch, unweighted (the task multiplies it by ``prior_weight``).

        The hook a canonicalizer overrides if its group needs another distance. By default:

        * trivial group (``None``): 0;
        * an element carrying ``logits`` (B, |G|) (finite groups chosen from scores): the cross-entropy of
          those logits toward :attr:`identity_index`, i.e. ``−log p(e | x)`` under the selection
          distribution ``softmax(scores / temperature)``; it is 0 only in the limit of a certain choice;
        * otherwise (continuous groups: PCA and OPT in SO(2), N-body E(3), point-cloud SO(3)/O(3)):
          ``‖R − I‖²_F`` with ``R = g.matrix()``. Translations are not penalised: the prior is about
          orientation, the pose a predictor has seen upright.

        Computed from the element of the forward pass (no second forward), so its gradient reaches h
        through the same graph (the straight-through or implicit gradient of the chosen element).
        """
        if group_element is None:
            return torch.zeros(())
        logits = getattr(group_element, "logits", None)
        if logits is not None:
            identity = torch.full(logits.shape[:1], self.identity_index, dtype=torch.long, device=logits.device)
            return F.cross_entropy(logits, identity)
        matrix = group_element.matrix()
        eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
        return (matrix - eye).square().sum(dim=(-2, -1)).mean()

    def is_identity(self, group_element: GroupElement | None, batch_size: int) -> torch.Tensor:
        """(B,) bool: whether each input's chosen element is the identity (what ``{split}/identity_rate``
        averages). Finite groups compare ``index`` with :attr:`identity_index`; continuous groups test
        ``‖R − I‖_F <`` :data:`IDENTITY_TOLERANCE`; the trivial group's only element is the identity."""
        if group_element is None:
            return torch.ones(batch_size, dtype=torch.bool)
        index = self.group_element_index(group_element)
        if index is not None:
            return index == self.identity_index
        matrix = group_element.matrix().detach()
        eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
        return torch.linalg.matrix_norm(matrix - eye) < IDENTITY_TOLERANCE

    def train(self, mode: bool = True) -> Canonicalizer:
        # A frozen canonicalizer stays in eval mode: batch-norm statistics or dropout would otherwise
        # change the "frozen at initialisation" function during training.
        return super().train(mode and not self.freeze)


def _weight_dtype(inputs: Inputs) -> torch.dtype:
    return next((x.dtype for x in inputs if x.is_floating_point()), torch.get_default_dtype())


class CanonicalizedModel(nn.Module):
    """φ(x) = h'(x) · f(h(x)⁻¹ · x): any predictor made equivariant by a canonicalizer.

    Args:
        canonicalizer: h, a :class:`Canonicalizer` (the identity for baselines).
        predictor: f, any ``nn.Module`` taking the same positional inputs.

    A canonicalizer with ``needs_predictor`` (test-time canonicalization) is given ``predictor`` here,
    through :meth:`Canonicalizer.bind_predictor`, without becoming its parent module.

    ``forward(*inputs)`` returns the predictor's output mapped back by ``h'``. If ``h`` is equivariant
    (tested for every canonicalizer in ``tests/``), φ is equivariant (invariant for ``invert = id``)
    whatever ``f`` is.
    """

    def __init__(self, canonicalizer: Canonicalizer, predictor: nn.Module) -> None:
        super().__init__()
        if not isinstance(canonicalizer, Canonicalizer):
            raise TypeError(
                f"canonicalizer must be a canonical_network Canonicalizer, got {type(canonicalizer).__name__}"
            )
        self.canonicalizer = canonicalizer
        self.predictor = predictor
        self._bind_owner()
        if canonicalizer.needs_predictor:  # h scores with f itself (test-time canonicalization)
            canonicalizer.bind_predictor(predictor)

    def __setstate__(self, state: dict) -> None:  # unpickled or copied: the canonicalizer reads this model's mode
        super().__setstate__(state)
        self._bind_owner()

    def _bind_owner(self) -> None:
        """The model's mode, for :attr:`Canonicalizer.model_training`, given to every canonicalizer inside h (the
        factors of a product canonicalizer too): a weak reference kept out of the submodules."""
        for module in self.canonicalizer.modules():
            if isinstance(module, Canonicalizer):
                module.__dict__["_owner"] = weakref.ref(self)

    def canonicalize(self, *inputs: torch.Tensor) -> tuple[Inputs, Any]:
        """``(h(x)⁻¹ · x as a tuple, h(x))``: what the predictor sees, for logging and figures (the canonical
        element, whatever the symmetrization)."""
        frame = self.canonicalizer.frame(*inputs, spec=FrameSpec())
        return frame.canonical, frame.element

    def frame_outputs(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, Frame]:
        """``(h_i'(x) · f(h_i(x)⁻¹ · x) for every member i, the frame)``: outputs ``(k, B, ...)``, one predictor
        call on the ``k·B`` canonical inputs, each output mapped back by its own element (``invert``)."""
        frame = self.canonicalizer.frame(*inputs)
        outputs = self.canonicalizer.invert(self.predictor(*frame.canonical), frame.elements)
        return outputs.reshape(frame.size, inputs[0].shape[0], *outputs.shape[1:]), frame

    def forward_with_element(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(φ(x), h(x))``: the output and the group element that produced it, from one forward pass (the
        task reads the canonicalization prior and the identity rate from that element).

        φ(x) = Σ_i w_i(x) · h_i'(x) · f(h_i(x)⁻¹ · x) over the canonicalizer's frame (one member of weight 1
        for ``symmetrization=canonical``: the paper's Eq. (1), the same numbers); the element returned is the
        member of largest weight."""
        outputs, frame = self.frame_outputs(*inputs)
        weights = frame.weights.t().to(outputs.dtype).reshape(*frame.weights.t().shape, *([1] * (outputs.dim() - 2)))
        return (weights * outputs).sum(dim=0), frame.element

    def invert_canonicalization(self, output: torch.Tensor, group_element: Any) -> torch.Tensor:
        """h'(x) on an output of the predictor (equiadapt's name; :meth:`Canonicalizer.invert`)."""
        return self.canonicalizer.invert(output, group_element)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.forward_with_element(*inputs)[0]
