"""One equivariance check for any model: ``φ(g·x)`` against ``ρ(g)·φ(x)`` over group elements.

:func:`check_equivariance` is in the spirit of escnn's ``EquivariantModule.check_equivariance``, for models
that are plain callables on tensors (a :class:`~canonical_network.canonicalization.base.CanonicalizedModel`,
a task LightningModule, a bare backbone): it moves the inputs by group elements, runs the model on them,
moves the original outputs by the output action, and compares, with a tolerance derived from the floating
point arithmetic (see :func:`check_equivariance` for the derivation). The tests of every canonicalizer and
equivariant backbone go through it (``tests/test_canonicalizer_contract.py``).

The actions are those of :mod:`canonical_network.groups`, the package's one implementation of them:

* images ``(B, C, H, W)``: :func:`~canonical_network.groups.image.act_exact` for an element shared by the
  batch (``torch.rot90`` and flips, exact on the pixel grid; other angles bilinear) and
  :func:`~canonical_network.groups.image.act` for one element per image;
* points and vectors ``(B, N, 3)`` (or ``(B, 3)``): :class:`~canonical_network.groups.euclidean.EuclideanTransform`,
  ``x ↦ x Rᵀ + t`` and ``v ↦ v Rᵀ`` (row vectors), with the Haar samplers of
  :mod:`canonical_network.groups.euclidean`.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from canonical_network.groups.euclidean import (
    EuclideanTransform,
    random_orthogonal,
    random_rotations,
    random_translations,
)
from canonical_network.groups.image import (
    PlanarElement,
    act,
    act_exact,
    constant_element,
    group_elements,
    planar_group,
)
from canonical_network.groups.permutation import PermutationElement, permute, random_permutations
from canonical_network.groups.product import ProductElement

#: the actions :func:`check_equivariance` knows by name, for inputs (``input_actions``) and outputs
#: (``output_action``); a callable ``(g, x) -> g·x`` is accepted wherever a name is
ACTIONS = ("invariant", "image", "points", "vectors", "elements")
#: the symmetric group by name: permutations of dim 1 of the inputs (``(B, n, ...)``)
PERMUTATIONS = "S_n"
#: continuous groups by name → (rotation sampler, whether translations are sampled too)
CONTINUOUS_3D: dict[str, tuple[Callable[..., torch.Tensor], bool]] = {
    "SO(3)": (random_rotations, False),
    "O(3)": (random_orthogonal, False),
    "SE(3)": (random_rotations, True),
    "E(3)": (random_orthogonal, True),
}
_ALIASES = {"SO3": "SO(3)", "O3": "O(3)", "SE3": "SE(3)", "E3": "E(3)", "SO2": "SO(2)"}
#: a relative tolerance above this no longer separates an equivariant model from one that is not (models
#: that are not equivariant miss by O(0.1..1) of their outputs' scale): the result then carries a warning
MEANINGFUL_RTOL = 1e-2
#: κ, the default conditioning bound for sampled continuous groups (module docstring of ``tests/helpers.py``):
#: a frame built by Gram–Schmidt from vectors 0.5° from parallel (1 / sin 0.5° ≈ 115), or a batch norm
#: dividing by a standard deviation 1 % of its features' scale, amplifies a relative error by ~1e2 ≤ 2⁷
CONTINUOUS_CONDITIONING = 2.0**7

Action = str | Callable[[Any, torch.Tensor], torch.Tensor]
Element = PlanarElement | EuclideanTransform | PermutationElement | ProductElement
#: a product of a 3-D group with S_n by name ("E(3)×S_n", also written "E(3)xS_n"): pairs of elements
PRODUCT_SEPARATORS = ("×", "x")


# ---------------------------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ElementCheck:
    """The comparison for one group element ``g`` (one per sample for sampled groups).

    Attributes:
        label: names the element (``"rot90"``, ``"rot90∘flip"``, ``"SO(3) #2"``).
        max_abs_error: ``max |φ(g·x) − ρ(g)·φ(x)|`` over the batch and the output's entries.
        scale: ``max |value|`` over both compared tensors: what the relative tolerance is taken of.
        max_rel_error: ``max_abs_error / scale`` (0 when both are 0).
        tolerance: ``atol + rtol · scale``, what ``max_abs_error`` is compared with.
        exact: whether the data represents ``g`` exactly (every 3-D element; on the pixel grid, quarter turns
            and the flip). A rounding tolerance can only be met by exact elements; an interpolated image
            rotation is compared all the same, and reported as inexact.
        passed: ``max_abs_error ≤ tolerance``.
    """

    label: str
    max_abs_error: float
    scale: float
    max_rel_error: float
    tolerance: float
    exact: bool
    passed: bool


@dataclass(frozen=True)
class EquivarianceResult:
    """What :func:`check_equivariance` found; true in a boolean context when every element passed.

    Attributes:
        passed: every element's error is within its tolerance.
        group: the group the elements come from (``"C4"``, ``"SO(3)"``, ``"custom"``).
        output_action: how ``ρ(g)`` acts on the outputs (``"invariant"``, ``"points"``, ...).
        elements: one :class:`ElementCheck` per element checked.
        max_abs_error, max_rel_error: the worst over the elements.
        rtol, atol: the tolerance ``atol + rtol · scale`` each element is held to.
        derivation: how ``rtol`` was obtained (the numbers of the rule, or "given").
        dtype: the dtype of the outputs.
        training: whether the model was in training mode (dropout and batch statistics make two passes differ).
        notes: warnings about the check itself (a tolerance too loose to mean much, interpolated elements).
    """

    passed: bool
    group: str
    output_action: str
    elements: tuple[ElementCheck, ...]
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    derivation: str
    dtype: str
    training: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "equivariant" if self.output_action != "invariant" else "invariant"
        head = (f"{'PASSED' if self.passed else 'FAILED'}: {verdict} under {self.group} "
                f"(output action: {self.output_action}, {self.dtype}) — max error {self.max_abs_error:.3g} "
                f"({self.max_rel_error:.3g} of the outputs' scale) vs rtol {self.rtol:.3g}"
                + (f" + atol {self.atol:.3g}" if self.atol else ""))
        lines = [head, f"  tolerance: {self.derivation}"]
        for e in self.elements:
            mark = "ok  " if e.passed else "FAIL"
            lines.append(f"  {mark} {e.label:<16} error {e.max_abs_error:.3g} (rel {e.max_rel_error:.3g}) "
                         f"tolerance {e.tolerance:.3g}" + ("" if e.exact else "  [interpolated]"))
        if not self.passed and self.output_action == "invariant":
            lines.append("  (outputs compared as invariant; pass output_action= if they transform)")
        if not self.passed and self.training:
            lines.append("  (the model is in training mode: dropout or batch statistics make passes differ; "
                         "call model.eval() first)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def raise_if_failed(self) -> EquivarianceResult:
        """Raise ``AssertionError`` with the report unless every element passed; return ``self`` otherwise."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


# ---------------------------------------------------------------------------------------------------------
# Elements
# ---------------------------------------------------------------------------------------------------------
@dataclass
class _Sampled:
    """One element to check: a planar element shared by the batch (``grid``: (angle_deg, reflect)), one
    per sample (``element``: PlanarElement or EuclideanTransform)."""

    label: str
    element: Element | None = None
    grid: tuple[float, bool] | None = None
    exact: bool = True

    def as_element(self, batch: int, like: torch.Tensor) -> Element:
        if self.grid is not None:
            return constant_element(*self.grid, batch, dtype=like.dtype, device=like.device)
        assert self.element is not None
        return self.element


def _canonical_name(name: str) -> str:
    return _ALIASES.get(name.replace(" ", ""), name.replace(" ", ""))


def _planar_label(angle_deg: float, reflect: bool) -> str:
    if angle_deg == 0 and not reflect:
        return "identity"
    rotation = f"rot{angle_deg:g}"
    return ("flip" if angle_deg == 0 else f"{rotation}∘flip") if reflect else rotation


def _on_grid(angle_deg: float) -> bool:
    return float(angle_deg / 90.0).is_integer()


def _finite_planar(num_rotations: int, reflection: bool) -> list[_Sampled]:
    """Every element of C_N (D_N), in escnn's order, each shared by the batch."""
    elements = group_elements(num_rotations, reflection)
    return [_Sampled(_planar_label(a, r), grid=(a, r), exact=_on_grid(a)) for a, r in elements]


def default_group(model: Any) -> str:
    """The group a model claims: its canonicalizer's ``group_name``, restricted for images to the elements the
    pixel grid represents exactly (the quarter turns of C_N / D_N, with flips for D_N; all four quarter turns for
    a continuous SO(2) canonicalizer), returned as a group name :func:`check_equivariance` takes."""
    canonicalizer = getattr(model, "canonicalizer", None)
    name = getattr(canonicalizer, "group_name", None)
    if name is None:
        raise ValueError(f"check_equivariance: {type(model).__name__} has no canonicalizer to read its group from; "
                         "pass group= (e.g. 'C4', 'SO(3)', 'E(3)', a list of elements or a sampler)")
    if name == "trivial":
        raise ValueError("check_equivariance: the model's canonicalizer is the identity (group 'trivial'), so it "
                         "claims no symmetry; pass group= (e.g. group='C4' for an equivariant image backbone)")
    finite = planar_group(name)
    if finite is not None:
        n, reflection = finite
        quarter_turns = [a for a, _ in group_elements(n, False) if _on_grid(a)]
        if len(quarter_turns) == 1 and not reflection:
            raise ValueError(f"check_equivariance: {name} has no element but the identity that the pixel grid "
                             f"represents exactly; pass group='{name}' to compare the interpolated rotations")
        return f"{'D' if reflection else 'C'}{len(quarter_turns)}"
    if name in ("SO(2)", "O(2)"):
        return "D4" if name == "O(2)" else "C4"
    return name


def _product_factors(name: str) -> tuple[str, str] | None:
    """``("E(3)", "S_n")`` for ``"E(3)×S_n"`` (or ``"E(3)xS_n"``); ``None`` for a name that is no such product."""
    for separator in PRODUCT_SEPARATORS:
        head, found, tail = name.rpartition(separator)
        if found and _canonical_name(tail) in (PERMUTATIONS, "Sn") and _canonical_name(head) in CONTINUOUS_3D:
            return _canonical_name(head), PERMUTATIONS
    return None


def _from_name(name: str, batch: int, points: torch.Tensor | None, num_samples: int,
               generator: torch.Generator, dtype: torch.dtype, device: torch.device) -> list[_Sampled]:
    name = _canonical_name(name)
    factors = _product_factors(name)
    if factors is not None:  # pairs: a 3-D element and a permutation per sample
        firsts = _from_name(factors[0], batch, points, num_samples, generator, dtype, device)
        seconds = _from_name(factors[1], batch, points, num_samples, generator, dtype, device)
        return [_Sampled(f"{factors[0]}×S_n #{j + 1}", element=ProductElement(a.element, b.element))
                for j, (a, b) in enumerate(zip(firsts, seconds, strict=True))]
    if name == "trivial":
        return [_Sampled("identity", grid=(0.0, False))]
    if name in (PERMUTATIONS, "Sn"):
        if points is None or points.dim() < 2:
            raise ValueError("check_equivariance: S_n permutes dim 1 of (B, n, ...) inputs")
        return [_Sampled(f"S_n #{j + 1}", element=PermutationElement(
            random_permutations(batch, points.shape[1], generator).to(device))) for j in range(num_samples)]
    finite = planar_group(name)
    if finite is not None:
        return _finite_planar(*finite)
    if name == "SO(2)":
        samples = []
        for j in range(num_samples):
            angle = 360.0 * torch.rand(batch, generator=generator, dtype=torch.float64)
            g = PlanarElement(angle_deg=angle.to(dtype=dtype, device=device),
                              reflect=torch.zeros(batch, dtype=dtype, device=device))
            samples.append(_Sampled(f"SO(2) #{j + 1}", element=g, exact=False))
        return samples
    if name in CONTINUOUS_3D:
        sampler, translations = CONTINUOUS_3D[name]
        samples = []
        for j in range(num_samples):
            rotation = sampler(batch, generator, dtype=torch.float64)
            translation = torch.zeros(batch, 3, dtype=torch.float64)
            if translations:
                # T(3) has no uniform measure: Gaussian shifts of the size of each input (its RMS radius)
                translation = random_translations(batch, generator, dtype=torch.float64)
                if points is not None:
                    translation = translation * _rms_radius(points).to(torch.float64).cpu().unsqueeze(-1)
            g = EuclideanTransform(rotation.to(dtype=dtype, device=device), translation.to(dtype=dtype, device=device))
            samples.append(_Sampled(f"{name} #{j + 1}", element=g))
        return samples
    raise ValueError(f"check_equivariance: unknown group {name!r}; expected C<N>, D<N>, SO(2), SO(3), O(3), SE(3), "
                     "E(3), S_n, a product such as E(3)×S_n, trivial, a list of elements or a sampler")


def _rms_radius(points: torch.Tensor) -> torch.Tensor:
    """``(B,)`` root-mean-square distance of ``(B, N, 3)`` points from their centroid (1 for ``(B, 3)``)."""
    if points.dim() != 3:
        return torch.ones(points.shape[0], dtype=points.dtype, device=points.device)
    centred = points - points.mean(dim=1, keepdim=True)
    return centred.square().sum(-1).mean(-1).sqrt()


def _convert(item: Any, batch: int, dtype: torch.dtype, device: torch.device) -> _Sampled:
    """One user-given element as a :class:`_Sampled`."""
    if isinstance(item, (int, float)) and not isinstance(item, bool):
        return _Sampled(_planar_label(float(item), False), grid=(float(item), False), exact=_on_grid(float(item)))
    if isinstance(item, tuple) and len(item) == 2 and all(isinstance(v, (int, float)) for v in item):
        angle, reflect = float(item[0]), bool(item[1])
        return _Sampled(_planar_label(angle, reflect), grid=(angle, reflect), exact=_on_grid(angle))
    if isinstance(item, EuclideanTransform):
        rotation, translation = (t.to(dtype=dtype, device=device) for t in item)
        return _Sampled("E(3) element", element=EuclideanTransform(rotation.expand(batch, 3, 3),
                                                                   translation.expand(batch, 3)))
    if isinstance(item, PlanarElement):
        angle = item.angle_deg.to(dtype=dtype, device=device).expand(batch)
        reflect = item.reflect.to(dtype=dtype, device=device).expand(batch)
        shared = bool((angle == angle[0]).all() and (reflect == reflect[0]).all())
        if shared and _on_grid(float(angle[0])):
            grid = (float(angle[0]), bool(reflect[0]))
            return _Sampled(_planar_label(*grid), grid=grid)
        return _Sampled("SO(2) element", element=PlanarElement(angle_deg=angle, reflect=reflect), exact=False)
    if torch.is_tensor(item) and item.shape[-2:] == (3, 3):
        rotation = item.to(dtype=dtype, device=device).expand(batch, 3, 3)
        return _Sampled("O(3) element", element=EuclideanTransform.from_rotation(rotation))
    raise TypeError(f"check_equivariance: cannot use {type(item).__name__} as a group element; expected an angle in "
                    "degrees, (angle_deg, reflect), a PlanarElement, an EuclideanTransform or a (3, 3) / (B, 3, 3) "
                    "orthogonal matrix")


def _takes_dtype(sampler: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(sampler).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "dtype" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _elements(group: Any, model: Any, inputs: tuple[torch.Tensor, ...], num_samples: int, seed: int,
              dtype: torch.dtype, device: torch.device) -> tuple[str, list[_Sampled]]:
    batch = inputs[0].shape[0]
    generator = torch.Generator().manual_seed(seed)
    points = inputs[0] if inputs[0].dim() in (2, 3) else None
    if isinstance(group, str) and (_canonical_name(group) in (PERMUTATIONS, "Sn")
                                   or _product_factors(_canonical_name(group)) is not None):
        points = inputs[0]
    if group is None:
        group = default_group(model)
    if isinstance(group, str):
        name = _canonical_name(group)
        return name, _from_name(name, batch, points, num_samples, generator, dtype, device)
    if callable(group):  # a sampler: sampler(batch_size, generator, dtype=...)
        samples = []
        for j in range(num_samples):
            drawn = group(batch, generator, dtype=torch.float64) if _takes_dtype(group) else group(batch, generator)
            item = _convert(drawn, batch, dtype, device)
            samples.append(_Sampled(f"sample #{j + 1}", item.element, item.grid, item.exact))
        return getattr(group, "__name__", "sampler"), samples
    if isinstance(group, Iterable):
        samples = [_convert(item, batch, dtype, device) for item in group]
        for j, sample in enumerate(samples):
            if sample.grid is None:  # planar grid elements keep their name (rot90, flip)
                sample.label = f"element #{j + 1}"
        return "custom", samples
    raise TypeError(f"check_equivariance: group must be None, a name, a list of elements or a sampler; got "
                    f"{type(group).__name__}")


# ---------------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------------
def _apply(action: Action, sample: _Sampled, x: torch.Tensor) -> torch.Tensor:
    """``g · x`` under one action."""
    if callable(action):
        return action(sample.as_element(x.shape[0], x), x)
    if action == "invariant" or not torch.is_tensor(x):
        return x
    if not x.is_floating_point() and action in ("points", "vectors"):
        raise TypeError(f"check_equivariance: the {action!r} action needs floating-point coordinates, got {x.dtype} "
                        "(an integer tensor cannot be rotated; pass it as float, or as input_actions 'invariant' "
                        "if the group leaves it as it is)")
    if action == "image":
        if x.dim() != 4:
            raise ValueError(f"check_equivariance: the 'image' action needs (B, C, H, W) tensors, got {tuple(x.shape)}")
        if sample.grid is not None:
            return act_exact(x, *sample.grid)  # quarter turns and flips reorder pixels: exact for any dtype
        if not x.is_floating_point():
            raise TypeError(f"check_equivariance: a rotation off the pixel grid resamples the image, which needs "
                            f"floating-point images; got {x.dtype} (pass images.float())")
        if not isinstance(sample.element, PlanarElement):
            raise TypeError("check_equivariance: an image moves by a planar element (C_N, D_N, SO(2)), got a 3-D one")
        return act(x, sample.element)
    g = sample.element
    if isinstance(g, ProductElement):  # the 3-D factor's action, then the order (the two commute)
        if action != "elements":
            x = _apply(action, _Sampled(sample.label, element=g.first), x)
        return _permute_elements(action, x, g.second)
    if isinstance(g, PermutationElement):  # every per-element action permutes dim 1
        return _permute_elements(action, x, g)
    if action == "elements":
        raise TypeError("check_equivariance: the 'elements' action needs a permutation (S_n)")
    if sample.grid is not None or not isinstance(g, EuclideanTransform):
        raise TypeError(f"check_equivariance: the {action!r} action needs a 3-D element (SO(3), O(3), E(3), "
                        "a rotation matrix), got a planar one")
    if x.shape[-1] != 3:
        raise ValueError(f"check_equivariance: the {action!r} action needs (..., 3) tensors, got {tuple(x.shape)}")
    if action == "vectors":
        return g.apply_to_vectors(x)
    if x.dim() == 2:  # one point per sample, (B, 3): as a cloud of one point
        return g.apply_to_points(x.unsqueeze(1)).squeeze(1)
    return g.apply_to_points(x)


def _per_element(action: str, x: torch.Tensor, n: int) -> bool:
    """Whether ``x`` holds one entry per set element along dim 1 (so S_n permutes it): ``(B, n, ...)`` for
    "elements"; ``(B, n, 3)`` for "points"/"vectors", whose ``(B, 3)`` is one point or vector per sample (never
    its 3 coordinates taken for 3 elements when n = 3)."""
    if action in ("points", "vectors"):
        return x.dim() >= 3 and x.shape[1] == n
    return x.dim() >= 2 and x.shape[1] == n


def _permute_elements(action: str, x: torch.Tensor, g: PermutationElement) -> torch.Tensor:
    """S_n's part of ``g · x``: dim 1 permuted where it holds one entry per element (:func:`_per_element`)."""
    if _per_element(action, x, g.n):
        return permute(x, g.perm)
    if action == "elements":
        raise ValueError(f"check_equivariance: the 'elements' action needs (B, n, ...) tensors with n = {g.n}, got "
                         f"{tuple(x.shape)}")
    return x  # one point or vector per sample: S_n leaves it as it is


def _check_action(action: Action, where: str) -> None:
    if not callable(action) and action not in ACTIONS:
        raise ValueError(f"check_equivariance: {where} must be one of {list(ACTIONS)} or a callable (g, x) -> g·x; "
                         f"got {action!r}")


def default_input_actions(inputs: Sequence[torch.Tensor], planar: bool) -> tuple[str, ...]:
    """How the group acts on each input unless ``input_actions`` says otherwise: with a planar group, the first
    input is an image and the others are invariant; with a 3-D group, the first input is points, any later input
    of the same shape is vectors (the N-body velocities), the others are invariant (charges, the category)."""
    if planar:
        return ("image",) + ("invariant",) * (len(inputs) - 1)
    first = inputs[0].shape
    return ("points",) + tuple("vectors" if x.shape == first else "invariant" for x in inputs[1:])


def _permuted_inputs(inputs: Sequence[torch.Tensor]) -> tuple[str, ...]:
    """Under S_n: every input ``(B, n, ...)`` with the first input's ``n`` is permuted ("elements"), the others
    are invariant."""
    n = inputs[0].shape[1]
    _refuse_ambiguous(inputs, n)
    return tuple("elements" if x.dim() >= 2 and x.shape[1] == n else "invariant" for x in inputs)


def _refuse_ambiguous(inputs: Sequence[torch.Tensor], n: int | None) -> None:
    """With 3 set elements in 3-D (a first input ``(B, 3, 3)``), a later ``(B, 3)`` input is one value per element
    or one 3-vector per sample: the shapes cannot say which, so the caller must (``input_actions``)."""
    first = inputs[0]
    if n != 3 or first.dim() < 3 or first.shape[-1] != 3:
        return
    for i, x in enumerate(inputs[1:], start=1):
        if torch.is_tensor(x) and x.dim() == 2 and x.shape[1] == 3:
            raise ValueError(f"check_equivariance: input {i} has shape {tuple(x.shape)} with a set of 3 elements in "
                             "3-D: one value per element, or one 3-vector per sample? Say it with input_actions "
                             "('elements', 'vectors', 'points' or 'invariant' for each input)")


def _product_inputs(inputs: Sequence[torch.Tensor]) -> tuple[str, ...]:
    """Under a 3-D group × S_n: the 3-D actions of :func:`default_input_actions`, with the per-element inputs that
    the 3-D group leaves invariant (N-body's charges) permuted ("elements"); one-per-sample inputs invariant."""
    n = inputs[0].shape[1] if inputs[0].dim() >= 2 else None
    actions = default_input_actions(inputs, False)
    _refuse_ambiguous(inputs, n)
    return tuple("elements" if a == "invariant" and x.dim() >= 2 and x.shape[1] == n else a
                 for a, x in zip(actions, inputs, strict=True))


# ---------------------------------------------------------------------------------------------------------
# Tolerance
# ---------------------------------------------------------------------------------------------------------
def accumulation_length(model: nn.Module, inputs: Sequence[torch.Tensor]) -> int:
    """``n``: a bound on the number of terms summed along the longest chain of the model's forward pass.

    The sum of the fan-ins of its layers (``nn.Linear``: ``in_features``; ``nn.Conv*``: ``in_channels / groups ×
    kernel area``; escnn's ``R2Conv``: its input field size × kernel area), plus the largest per-sample input
    size (a mean or sum over pixels, points or particles), rounded up to a power of two. Layers it cannot see
    (custom einsums, tensor products) are not counted: pass ``terms=`` for those models.
    """
    total = 0
    for module in model.modules() if isinstance(model, nn.Module) else ():
        if isinstance(module, nn.Linear):
            total += module.in_features
        elif isinstance(module, nn.modules.conv._ConvNd):
            total += module.in_channels // module.groups * math.prod(module.kernel_size)
        elif hasattr(module, "in_type") and isinstance(getattr(module, "kernel_size", None), int):
            total += getattr(module.in_type, "size", 1) * module.kernel_size ** 2  # escnn R2Conv
    total += max((x[0].numel() for x in inputs if torch.is_tensor(x) and x.dim() > 0 and len(x)), default=1)
    return 2 ** math.ceil(math.log2(max(total, 2)))


def derived_rtol(dtype: torch.dtype, terms: int, conditioning: float) -> float:
    """``rtol = n · κ · eps(dtype)`` (see :func:`check_equivariance`)."""
    return terms * conditioning * torch.finfo(dtype).eps


# ---------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------
def check_equivariance(
    model: Callable[..., torch.Tensor],
    inputs: torch.Tensor | Sequence[torch.Tensor],
    group: str | Iterable[Any] | Callable[..., Any] | None = None,
    *,
    output_action: Action = "invariant",
    input_actions: Sequence[Action] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    terms: int | None = None,
    conditioning: float | None = None,
    num_samples: int = 4,
    seed: int = 0,
    raise_on_failure: bool = False,
) -> EquivarianceResult:
    """Check ``model(g·x) = ρ(g)·model(x)`` for group elements ``g``, to a tolerance derived from the arithmetic.

    Args:
        model: any callable on ``*inputs`` returning one tensor: a ``CanonicalizedModel``, a task
            LightningModule, a bare backbone. It is called as it is (put it in eval mode first: dropout and
            batch statistics make two passes differ), without gradients.
        inputs: a tensor or a tuple of tensors, the model's positional inputs, batch first.
        group: which elements ``g``:

            * ``None`` (default): the group the model's canonicalizer claims (``model.canonicalizer.group_name``),
              for images restricted to the elements the pixel grid represents exactly — the quarter turns
              of C_N / D_N (and flips for D_N), the four quarter turns for a continuous SO(2) canonicalizer;
              a C8 canonicalizer is checked on C4. Models without one (bare backbones, the identity
              canonicalizer) must name their group.
            * a name: ``"C4"``, ``"D8"`` (every element, the identity included; those off the pixel grid are
              interpolated and reported as inexact), ``"SO(2)"`` (``num_samples`` random angles per image,
              interpolated), ``"SO(3)"``, ``"O(3)"`` (Haar samples), ``"SE(3)"``, ``"E(3)"`` (with Gaussian
              translations of each input's RMS radius), ``"S_n"`` (random permutations of dim 1), a product of a
              3-D group with S_n (``"E(3)×S_n"``, ``"SO(3)×S_n"``: a pair per sample, the 3-D element acting on the
              coordinates and the permutation on the order), ``"trivial"``.
            * a list of elements: angles in degrees, ``(angle_deg, reflect)`` pairs, ``PlanarElement``,
              ``EuclideanTransform``, ``(3, 3)`` or ``(B, 3, 3)`` orthogonal matrices.
            * a sampler, called ``num_samples`` times as ``sampler(batch_size, generator, dtype=torch.float64)``
              and returning any of those elements, e.g. ``cn.random_rotations`` or ``cn.random_axis_rotations``.

            3-D elements are drawn in float64 from a generator seeded with ``seed``, one per sample.
        output_action: ``ρ`` on the output: ``"invariant"`` (default: class logits; per-point part logits under
            rotations alone, but ``"elements"`` under S_n or a product with it: they follow the points' order),
            ``"points"`` (``x Rᵀ + t``: predicted positions), ``"vectors"`` (``v Rᵀ``), ``"image"`` (dense
            outputs that rotate with the image), ``"elements"`` (per-element outputs ``(B, n, ...)`` that the
            permutation reorders and a 3-D group leaves alone; under a product, ``"points"`` and ``"vectors"``
            are reordered too), or a callable ``(g, output) -> ρ(g)·output`` receiving the
            element as a ``PlanarElement`` or ``EuclideanTransform`` (one per sample).
        input_actions: one action per input (the same names or callables); by default
            :func:`default_input_actions` (an image; or points, same-shaped vectors, and invariant rest).
        atol, rtol: the tolerance of each element is ``atol + rtol · scale``, ``scale`` being ``max |·|`` over
            both compared tensors. ``rtol`` defaults to the derivation below; ``atol`` to 0.
        terms: ``n`` of the derivation (default :func:`accumulation_length`).
        conditioning: ``κ`` of the derivation (default 1 for elements of finite planar groups, 2⁷ for sampled
            continuous groups).
        num_samples: elements drawn from a continuous group or a sampler.
        seed: of the generator the elements are drawn from.
        raise_on_failure: raise ``AssertionError`` with the report when an element fails (as
            ``result.raise_if_failed()``).

    Returns:
        An :class:`EquivarianceResult`: per element the max absolute and relative errors and the tolerance,
        ``passed``, the tolerance used and its derivation; ``print(result)`` gives a readable report.

    Tolerance (derived, not tuned). Float results differ in their last bits between kernels and machines, and
    an exactly equivariant model computes ``φ(g·x)`` and ``ρ(g)φ(x)`` through different roundings. A sum of
    ``n`` terms errs by at most ``≈ n·eps`` relative to the sum of their magnitudes, whatever order a kernel
    sums them in (worst-case recursive summation), and a computation of conditioning ``κ`` amplifies a
    relative error by at most ``κ``; so two exact evaluations agree to::

        rtol = n · κ · eps(dtype)        relative to the outputs' scale max |·|

    * ``eps`` is the machine epsilon of the outputs' dtype (2⁻²³ ≈ 1.2e-7 for float32, 2⁻⁵² ≈ 2.2e-16 for
      float64);
    * ``n`` (``terms``) bounds the terms accumulated along the longest chain of the forward pass:
      :func:`accumulation_length` counts the fan-ins of the model's linear and convolution layers plus the
      largest per-sample input size, rounded up to a power of two (2¹⁶ for a C8 G-CNN canonicalizer around a
      ResNet-18 on 3 × 32 × 32 images);
    * ``κ`` (``conditioning``) bounds the amplification of a relative error: 1 for the elements of a finite
      planar group (quarter turns and flips permute the pixels exactly: the model sees the same numbers,
      reordered; eval-mode batch norm and ReLU scale errors and outputs alike), 2⁷ for sampled continuous
      groups (a rotation matrix rounds each coordinate, and a canonicalizer's Gram–Schmidt frame built from
      vectors 0.5° from parallel amplifies by 1 / sin 0.5° ≈ 115; pass the measured conditioning of your
      frames when it is worse).

    The bound is worst case (observed errors are orders of magnitude below it); it only has to stay far below
    the O(0.1..1) relative error of a model that is not equivariant. Deep models checked under a continuous
    group need float64 for that (``model.double()`` and float64 inputs; float32 gives ``rtol`` ≈ 0.1 for
    ``n = 2¹³, κ = 2⁷``, and the result then carries a note). Models built with escnn (the G-CNN
    canonicalizer and backbone) are checked in float32, where finite planar groups (κ = 1) leave a tight
    bound: escnn shares each sampled basis between all layers built with the same parameters, so ``.double()``
    on one such model turns the bases of every escnn layer built later in the process to float64. A discrete choice (a canonicalizer's argmax)
    within rounding of a tie may flip under ``g`` and change the output by O(1): the check reports it as a
    failure, as it is one at that input (the relaxed equivariance of the paper's Appendix A).
    """
    inputs = (inputs,) if torch.is_tensor(inputs) else tuple(inputs)
    if not inputs or not torch.is_tensor(inputs[0]):
        raise TypeError("check_equivariance: inputs must be a tensor or a non-empty tuple of tensors")
    _check_action(output_action, "output_action")
    if num_samples < 1:
        raise ValueError(f"check_equivariance: num_samples must be >= 1, got {num_samples}")
    dtype = next((x.dtype for x in inputs if x.is_floating_point()), torch.get_default_dtype())
    device = inputs[0].device
    group_name, samples = _elements(group, model, inputs, num_samples, seed, dtype, device)
    planar = all(s.grid is not None or isinstance(s.element, PlanarElement) for s in samples)
    permutations = all(isinstance(s.element, PermutationElement) for s in samples)
    products = all(isinstance(s.element, ProductElement) for s in samples)
    if input_actions is None:
        trivial = group_name == "trivial"
        input_actions = (("invariant",) * len(inputs) if trivial
                         else _permuted_inputs(inputs) if permutations
                         else _product_inputs(inputs) if products else default_input_actions(inputs, planar))
    input_actions = tuple(input_actions)
    if len(input_actions) != len(inputs):
        raise ValueError(f"check_equivariance: {len(inputs)} input(s) but {len(input_actions)} input action(s)")
    for action in input_actions:
        _check_action(action, "input_actions")

    training = bool(getattr(model, "training", False))
    outputs_moved: list[tuple[_Sampled, torch.Tensor, torch.Tensor]] = []
    with torch.no_grad():
        output = model(*inputs)
        if not torch.is_tensor(output):
            raise TypeError(f"check_equivariance: the model must return one tensor, got {type(output).__name__}")
        for sample in samples:
            moved = tuple(_apply(a, sample, x) for a, x in zip(input_actions, inputs, strict=True))
            actual, expected = model(*moved), _apply(output_action, sample, output)
            if actual.shape != expected.shape:
                raise ValueError(f"check_equivariance: model(g·x) has shape {tuple(actual.shape)} but ρ(g)·model(x) "
                                 f"has {tuple(expected.shape)}; check output_action")
            outputs_moved.append((sample, actual, expected))

    out_dtype = output.dtype if output.is_floating_point() else dtype
    notes: list[str] = []
    if rtol is None:
        n = int(terms) if terms is not None else accumulation_length(model, inputs)
        # permutations reorder the same numbers exactly, as quarter turns do: κ = 1
        continuous = any(s.grid is None and not isinstance(s.element, PermutationElement) for s in samples)
        kappa = float(conditioning) if conditioning is not None else (CONTINUOUS_CONDITIONING if continuous else 1.0)
        rtol = derived_rtol(out_dtype, n, kappa)
        derivation = (f"rtol = n·κ·eps = {_power(n)} terms × κ {_power(kappa)} × eps({_dtype_name(out_dtype)}) "
                      f"{torch.finfo(out_dtype).eps:.3g} = {rtol:.3g} of the outputs' scale")
        if rtol > MEANINGFUL_RTOL:
            notes.append(f"rtol {rtol:.3g} is above {MEANINGFUL_RTOL:g} of the outputs' scale: too loose to tell "
                         "an equivariant model from one that is not; check in float64 (model.double(), float64 inputs)")
    else:
        derivation = f"rtol = {rtol:.3g} (given)"
    atol = 0.0 if atol is None else float(atol)
    if any(not s.exact for s in samples):
        notes.append("interpolated elements (image rotations off the pixel grid) are compared to the rounding "
                     "tolerance too; only elements marked exact can be expected to meet it")

    checks = []
    for sample, actual, expected in outputs_moved:
        error = (actual - expected).abs().max().item() if actual.numel() else 0.0
        scale = max(actual.abs().max().item(), expected.abs().max().item()) if actual.numel() else 0.0
        tol = atol + rtol * scale
        if not math.isfinite(error):
            error = math.inf
        checks.append(ElementCheck(sample.label, error, scale, error / scale if scale else (0.0 if error == 0 else math.inf),
                                   tol, sample.exact, error <= tol))
    result = EquivarianceResult(
        passed=all(c.passed for c in checks),
        group=group_name,
        output_action=output_action if isinstance(output_action, str) else getattr(output_action, "__name__", "custom"),
        elements=tuple(checks),
        max_abs_error=max(c.max_abs_error for c in checks),
        max_rel_error=max(c.max_rel_error for c in checks),
        rtol=float(rtol),
        atol=atol,
        derivation=derivation,
        dtype=_dtype_name(out_dtype),
        training=training,
        notes=tuple(notes),
    )
    for note in notes[:1]:
        if note.startswith("rtol"):
            warnings.warn(f"check_equivariance: {note}", stacklevel=2)
    if raise_on_failure:
        result.raise_if_failed()
    return result


def _power(value: float) -> str:
    exponent = math.log2(value) if value > 0 else 0.0
    return f"2^{int(exponent)}" if exponent.is_integer() else f"{value:.4g}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


__all__ = [
    "ACTIONS",
    "ElementCheck",
    "EquivarianceResult",
    "accumulation_length",
    "check_equivariance",
    "default_group",
    "default_input_actions",
    "derived_rtol",
]
