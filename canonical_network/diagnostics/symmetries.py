"""Per task family: which group elements a diagnosis samples, and how they act on inputs and outputs.

A :class:`Symmetry` answers three questions for one task family:

* **exact elements** (:meth:`Symmetry.exact`) — the elements the data represents without approximation, so
  an equivariant model must satisfy ``φ(g·x) = ρ(g) φ(x)`` to rounding error:

  - images: rotations by multiples of 90° (``torch.rot90``) and, when the canonicalizer's group has
    reflections, the horizontal flip and its products with quarter turns. For a finite canonicalizer group
    C_N / D_N only the quarter turns that belong to it (k·90° with N | 4k); for a continuous or trivial
    canonicalizer all three quarter turns (the task's symmetry).
  - point clouds (classification and part segmentation): a rotation per cloud from the 3-D group of
    :func:`rotation_group_3d`, composed with a random permutation of the points; plus one element that
    only permutes.
  - N-body systems: a rotation (or roto-reflection) and a Gaussian translation per system, composed with
    a permutation of the particles; plus one element that only permutes.

* **continuous elements** (:meth:`Symmetry.continuous`) — images only: rotations by arbitrary angles (and
  flips for groups with reflections), which bilinear interpolation only approximates. Reported, never
  thresholded. In 3-D every rotation acts exactly on coordinates, so there is nothing beyond the exact set.

* **small perturbations** (:meth:`Symmetry.perturbations`) for the continuity measure: a rotation by
  ``rotation_deg`` (images: bilinear, ± at random; 3-D: about a random axis), and for points and particles a
  Gaussian jitter of ``jitter`` times the input's size (positions, and velocities by their own size).

and how an element acts on outputs (:meth:`Symmetry.act_output`, ρ): the identity on class logits, the
permutation on per-point part logits, rotation + translation + permutation on predicted N-body positions.
For canonicalizers with an S_n factor, :meth:`Symmetry.permute` reorders a set's elements alone (points,
particles; ``has_sets``), and ``per_element_outputs`` says whether the outputs follow that order.

Elements are drawn from a ``torch.Generator`` (one element per input sample, except the images' exact
elements, which are the same for the whole batch), so a diagnosis is reproducible from its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from canonical_network.groups.euclidean import (
    apply_rotation,
    axis_angle_rotation,
    random_axis_rotations,
    random_orthogonal,
    random_rotations,
)
from canonical_network.groups.image import (
    PlanarElement,
    act,
    constant_element,
    group_elements,
    orbit,
    planar_group,
    rotate_deg,
)
from canonical_network.utils.checks import check_choice

Inputs = tuple[torch.Tensor, ...]

#: the 3-D rotation groups a diagnosis can sample: Haar SO(3), Haar O(3), rotations about one axis ("z")
ROTATION_GROUPS = ("SO3", "O3", "z")
#: what ``diagnose.group`` accepts: one of those, or ``auto`` (see :func:`rotation_group_3d`)
GROUP_CHOICES = ("auto", *ROTATION_GROUPS)


@dataclass
class SampledElement:
    """One group element per input sample, as the measures need it.

    Attributes:
        label: names the element in ``diagnostics.json`` (``"rot90"``, ``"flip∘rot180"``, ``"SO(3)×S_P #2"``).
        matrix: ``(B, d, d)`` linear action on the coordinates (display coordinates of the image plane, d = 2;
            space, d = 3), compared with the canonicalizer's ``g.matrix()``.
        translation: ``(B, 3)`` or ``None`` (N-body: ``x ↦ x Rᵀ + t``).
        permutation: ``(B, P)`` or ``None``: ``(g·x)_i = R x_{perm_i} + t`` (points or particles reordered).
        exact: whether the data represents the element exactly (on the pixel grid, or any 3-D element).
    """

    label: str
    matrix: torch.Tensor
    translation: torch.Tensor | None = None
    permutation: torch.Tensor | None = None
    exact: bool = True


def _permute(x: torch.Tensor, permutation: torch.Tensor | None) -> torch.Tensor:
    """``x[b, permutation[b]]`` for ``x`` ``(B, P, ...)``."""
    if permutation is None:
        return x
    index = permutation.view(*permutation.shape, *(1,) * (x.dim() - 2)).expand(-1, -1, *x.shape[2:])
    return torch.gather(x, 1, index)


def _random_permutations(batch_size: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Uniform random permutations of ``size`` items, one per sample: ``(B, size)`` int64."""
    return torch.rand(batch_size, size, generator=generator).argsort(dim=1)


def point_scale(points: torch.Tensor) -> torch.Tensor:
    """``(B,)`` root-mean-square distance of the points ``(B, P, 3)`` from their centroid: an input's size."""
    centred = points - points.mean(dim=1, keepdim=True)
    return centred.square().sum(-1).mean(-1).sqrt()


def rotation_group_3d(canonicalizer_group: str, data_protocol: str | None, override: str = "auto",
                      default: str = "SO3") -> str:
    """The 3-D rotation group whose elements count as exact for a point-cloud or N-body diagnosis.

    ``override`` (``diagnose.group``) wins unless it is ``auto``. Then the canonicalizer's group decides: the
    group a model claims is the one it is checked against (``O(3)``/``E(3)`` → ``O3``, ``SO(3)``/``SE(3)`` →
    ``SO3``). A model without one (the plain backbones: ``trivial``) is checked against the symmetry of its
    data: the point clouds' test rotation protocol (``z`` → rotations about the data's axis, ``so3`` →
    ``SO3``), or ``default`` (``O3`` for N-body, whose dynamics are E(3)-symmetric; ``SO3`` for clouds).
    """
    check_choice("diagnose.group", override, GROUP_CHOICES)
    if override != "auto":
        return override
    # a product's coordinate factor comes first ("E(3)×S_n"): the 3-D group is that factor's
    claimed = {"O(3)": "O3", "E(3)": "O3", "SO(3)": "SO3", "SE(3)": "SO3"}.get(canonicalizer_group.split("×")[0])
    if claimed is not None:
        return claimed
    return {"z": "z", "so3": "SO3"}.get(data_protocol or "", default)


def _sample_rotations(group: str, batch_size: int, generator: torch.Generator, axis: str) -> torch.Tensor:
    if group == "SO3":
        return random_rotations(batch_size, generator, dtype=torch.float64)
    if group == "O3":
        return random_orthogonal(batch_size, generator, dtype=torch.float64)
    return random_axis_rotations(batch_size, generator, axis=axis, dtype=torch.float64)


def _small_rotations(batch_size: int, angle_deg: float, generator: torch.Generator) -> torch.Tensor:
    """Rotations by ``angle_deg`` about uniformly random axes, ``(B, 3, 3)`` float64."""
    axis = torch.randn(batch_size, 3, generator=generator, dtype=torch.float64)
    angle = torch.full((batch_size,), angle_deg * torch.pi / 180.0, dtype=torch.float64)
    return axis_angle_rotation(axis, angle)


def _group_label(group: str, axis: str) -> str:
    return {"SO3": "SO(3)", "O3": "O(3)"}.get(group, f"SO(2)_{axis}")


class Symmetry:
    """What a diagnosis of one task family samples and how it acts (see the module docstring)."""

    #: the task family, as written into ``diagnostics.json``
    family: str = ""

    def __init__(self, num_elements: int, rotation_deg: float, jitter: float) -> None:
        self.num_elements = int(num_elements)
        self.rotation_deg = float(rotation_deg)
        self.jitter = float(jitter)

    def exact(self, inputs: Inputs, generator: torch.Generator) -> list[tuple[SampledElement, Inputs]]:
        """``[(g, g·x)]`` for the exact elements."""
        raise NotImplementedError

    def continuous(self, inputs: Inputs, generator: torch.Generator) -> list[tuple[SampledElement, Inputs]]:
        """``[(g, g·x)]`` for elements the data only approximates; none by default."""
        return []

    def perturbations(self, inputs: Inputs,
                      generator: torch.Generator) -> dict[str, tuple[SampledElement | None, Inputs]]:
        """``{name: (g or None, x′)}``: small perturbations ``x′`` of the inputs; ``g`` is the group element the
        perturbation is (its expected effect on the output), ``None`` for perturbations off the group."""
        raise NotImplementedError

    def act_output(self, g: SampledElement, output: torch.Tensor) -> torch.Tensor:
        """``ρ(g) φ(x)``; the identity (invariant outputs) by default."""
        return output

    #: whether the inputs are sets whose elements a permutation reorders (points, particles)
    has_sets: bool = False
    #: whether the outputs are per element of the set (permuted with it) rather than invariant
    per_element_outputs: bool = False

    def permute(self, inputs: Inputs, permutation: torch.Tensor) -> Inputs:
        """The inputs with their set's elements reordered, ``x ↦ x[perm]`` (``permutation`` ``(B, n)``), every
        per-element input alike and the per-sample ones unchanged; only for families with :attr:`has_sets`."""
        raise NotImplementedError(f"the {self.family} family has no set of elements to permute")

    def output_action(self) -> str:
        return "identity (invariant class logits)"

    def length_scale(self, inputs: Inputs) -> torch.Tensor | None:
        """``(B,)`` size of each input, that translation errors are relative to; ``None`` without translations."""
        return None

    def describe(self) -> dict:
        """The groups and actions, for ``diagnostics.json``."""
        raise NotImplementedError


class ImageSymmetry(Symmetry):
    """Images ``(B, C, H, W)`` → class logits (Rotated MNIST): rotations and flips of the image plane.

    Args:
        canonicalizer_group: the canonicalizer's ``group_name`` (``"C4"``, ``"D8"``, ``"SO(2)"``, ``"trivial"``).
        num_elements: arbitrary angles per image for the continuous check.
        rotation_deg: the continuity check's rotation.
    """

    family = "images"

    def __init__(self, canonicalizer_group: str, num_elements: int = 4, rotation_deg: float = 1.0,
                 jitter: float = 0.0) -> None:
        super().__init__(num_elements, rotation_deg, jitter)
        finite = planar_group(canonicalizer_group)
        self.reflections = (finite is not None and finite[1]) or canonicalizer_group == "O(2)"

        def in_group(angle_deg: float, reflect: bool) -> bool:
            if reflect and not self.reflections:
                return False
            return finite is None or (round(angle_deg / 90.0) * finite[0]) % 4 == 0

        # the elements of D4 (C4 without reflections) the pixel grid represents exactly, minus the identity
        self.grid_elements = [e for e in group_elements(4, self.reflections)[1:] if in_group(*e)]

    @staticmethod
    def label(angle_deg: float, reflect: bool) -> str:
        rotation = f"rot{round(angle_deg)}"
        return ("flip" if angle_deg == 0 else f"{rotation}∘flip") if reflect else rotation

    def exact(self, inputs, generator):
        (images,) = inputs
        moved = []
        for (angle_deg, reflect), images_moved in orbit(images, self.grid_elements):
            g = constant_element(angle_deg, reflect, len(images), dtype=images.dtype, device=images.device)
            moved.append((SampledElement(self.label(angle_deg, reflect), g.matrix()), (images_moved,)))
        return moved

    def continuous(self, inputs, generator):
        (images,) = inputs
        moved = []
        for j in range(self.num_elements):
            angle = 360.0 * torch.rand(len(images), generator=generator, dtype=torch.float64)
            reflect = torch.randint(0, 2, (len(images),), generator=generator) if self.reflections else None
            reflect = torch.zeros(len(images)) if reflect is None else reflect
            g = PlanarElement(angle_deg=angle.to(images), reflect=reflect.to(images))
            name = "O(2)" if self.reflections else "SO(2)"
            moved.append((SampledElement(f"{name} #{j + 1}", g.matrix(), exact=False), (act(images, g),)))
        return moved

    def perturbations(self, inputs, generator):
        (images,) = inputs
        sign = 2.0 * torch.randint(0, 2, (len(images),), generator=generator) - 1.0
        g = PlanarElement(angle_deg=(self.rotation_deg * sign).to(images), reflect=torch.zeros_like(sign).to(images))
        element = SampledElement(f"rotation ±{self.rotation_deg:g}°", g.matrix(), exact=False)
        return {"rotation": (element, (rotate_deg(images, g.angle_deg),))}

    def describe(self):
        return {
            "exact": [self.label(*e) for e in self.grid_elements],
            "exact_action": "torch.rot90 and flip(-1): exact on the pixel grid",
            "continuous": f"{'O(2)' if self.reflections else 'SO(2)'}: uniform angles, "
                          f"{self.num_elements} per image, bilinear rotation (kornia) about the centre",
            "output_action": self.output_action(),
        }


class PointCloudSymmetry(Symmetry):
    """Point clouds ``(B, P, 3)`` (plus the category for part segmentation) → class logits (ModelNet40) or
    per-point part logits ``(B, P, parts)`` (ShapeNet-part), which a permutation of the points reorders.

    Args:
        group: ``"SO3"``, ``"O3"`` or ``"z"`` (:func:`rotation_group_3d`).
        per_point_outputs: part segmentation (outputs permute with the points).
        axis: the axis of the ``z`` group.
    """

    family = "point_clouds"
    has_sets = True

    def __init__(self, group: str, per_point_outputs: bool, num_elements: int = 4, rotation_deg: float = 1.0,
                 jitter: float = 1e-3, axis: str = "z") -> None:
        super().__init__(num_elements, rotation_deg, jitter)
        self.group = check_choice("diagnose.group", group, ROTATION_GROUPS)
        self.per_point_outputs = bool(per_point_outputs)
        self.per_element_outputs = self.per_point_outputs
        self.axis = axis
        if self.per_point_outputs:
            self.family = "part_segmentation"

    def _move(self, inputs: Inputs, rotation: torch.Tensor, translation: torch.Tensor | None,
              permutation: torch.Tensor | None) -> Inputs:
        """The inputs ``(points, *invariant)`` moved: points permuted, rotated (and translated)."""
        points, *rest = inputs
        moved = apply_rotation(_permute(points, permutation), rotation)
        if translation is not None:
            moved = moved + translation.unsqueeze(1)
        return (moved, *rest)

    def _elements(self, inputs: Inputs, generator: torch.Generator,
                  translations: bool) -> list[SampledElement]:
        points = inputs[0]
        batch, size = points.shape[:2]
        dtype, device = points.dtype, points.device
        eye = torch.eye(3, dtype=dtype, device=device).expand(batch, 3, 3)
        elements = [SampledElement("S_P", eye, permutation=_random_permutations(batch, size, generator).to(device))]
        label = _group_label(self.group, self.axis) + ("⋉T(3)" if translations else "")
        scale = self.length_scale(inputs) if translations else None
        for j in range(self.num_elements):
            rotation = _sample_rotations(self.group, batch, generator, self.axis).to(device=device, dtype=dtype)
            translation = None
            if translations:
                noise = torch.randn(batch, 3, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
                translation = noise * scale.unsqueeze(-1)
            permutation = _random_permutations(batch, size, generator).to(device)
            elements.append(SampledElement(f"{label}×S_P #{j + 1}", rotation, translation, permutation))
        return elements

    def exact(self, inputs, generator):
        return [(g, self._move(inputs, g.matrix, g.translation, g.permutation))
                for g in self._elements(inputs, generator, translations=False)]

    def _jittered(self, inputs: Inputs, generator: torch.Generator) -> Inputs:
        points, *rest = inputs
        noise = torch.randn(points.shape, generator=generator, dtype=torch.float64).to(points)
        return (points + self.jitter * point_scale(points).view(-1, 1, 1) * noise, *rest)

    def perturbations(self, inputs, generator):
        points = inputs[0]
        rotation = _small_rotations(len(points), self.rotation_deg, generator).to(points)
        element = SampledElement(f"rotation {self.rotation_deg:g}° about a random axis", rotation)
        return {
            "rotation": (element, self._move(inputs, rotation, None, None)),
            "jitter": (None, self._jittered(inputs, generator)),
        }

    def permute(self, inputs, permutation):
        points, *rest = inputs  # the category (part segmentation) is one per cloud
        return (_permute(points, permutation), *rest)

    def act_output(self, g, output):
        return _permute(output, g.permutation) if self.per_point_outputs else output

    def output_action(self) -> str:
        if self.per_point_outputs:
            return "the points' permutation (invariant per-point part logits)"
        return super().output_action()

    def describe(self):
        return {
            "exact": f"{_group_label(self.group, self.axis)} × S_P: {self.num_elements} sampled rotations per "
                     "input, each with a random permutation of the points, and one permutation alone",
            "exact_action": "points x ↦ x[perm] Rᵀ (rotations about the origin; the category is invariant)",
            "rotation_group": self.group,
            "continuous": None,
            "output_action": self.output_action(),
        }


class NBodySymmetry(PointCloudSymmetry):
    """N-body systems ``(loc, vel, charges)`` ``(B, N, 3), (B, N, 3), (B, N, 1)`` → positions ``(B, N, 3)``:
    E(3) (SE(3) for ``group="SO3"``) and permutations of the particles act on inputs and outputs alike."""

    family = "nbody"

    def __init__(self, group: str, num_elements: int = 4, rotation_deg: float = 1.0, jitter: float = 1e-3,
                 axis: str = "z") -> None:
        super().__init__(group, False, num_elements, rotation_deg, jitter, axis)
        self.per_element_outputs = True  # predicted positions, one per particle

    def permute(self, inputs, permutation):
        return tuple(_permute(x, permutation) for x in inputs)

    def _move(self, inputs, rotation, translation, permutation):
        loc, vel, charges = inputs
        moved = apply_rotation(_permute(loc, permutation), rotation)
        if translation is not None:
            moved = moved + translation.unsqueeze(1)
        return moved, apply_rotation(_permute(vel, permutation), rotation), _permute(charges, permutation)

    def exact(self, inputs, generator):
        return [(g, self._move(inputs, g.matrix, g.translation, g.permutation))
                for g in self._elements(inputs, generator, translations=True)]

    def _jittered(self, inputs, generator):
        loc, vel, charges = inputs
        noise = torch.randn((2, *loc.shape), generator=generator, dtype=torch.float64).to(loc)
        speed = vel.square().sum(-1).mean(-1).sqrt().view(-1, 1, 1)
        return (loc + self.jitter * point_scale(loc).view(-1, 1, 1) * noise[0],
                vel + self.jitter * speed * noise[1], charges)

    def act_output(self, g, output):
        moved = apply_rotation(_permute(output, g.permutation), g.matrix)
        return moved if g.translation is None else moved + g.translation.unsqueeze(1)

    def output_action(self) -> str:
        return "positions x ↦ x[perm] Rᵀ + t (E(3) and particle permutations)"

    def length_scale(self, inputs):
        return point_scale(inputs[0])

    def describe(self):
        described = super().describe()
        described["exact"] = (f"{_group_label(self.group, self.axis)} ⋉ T(3) × S_N: {self.num_elements} sampled "
                              "(R, t) per system (t ~ N(0, s²), s the system's RMS radius), each with a random "
                              "permutation of the particles, and one permutation alone")
        described["exact_action"] = "loc ↦ loc[perm] Rᵀ + t, vel ↦ vel[perm] Rᵀ, charges ↦ charges[perm]"
        return described


def symmetry_for(model, datamodule, *, group: str = "auto", num_elements: int = 4, rotation_deg: float = 1.0,
                 jitter: float = 1e-3) -> Symmetry:
    """The :class:`Symmetry` of a task LightningModule, from its class and its canonicalizer's group (and,
    for point clouds, the data module's test rotation protocol)."""
    from canonical_network.tasks.image_classification import ImageClassificationTask
    from canonical_network.tasks.nbody_dynamics import NBodyDynamicsTask
    from canonical_network.tasks.part_segmentation import PartSegmentationTask
    from canonical_network.tasks.pointcloud_classification import PointCloudClassificationTask

    claimed = model.canonicalizer.group_name
    axis = getattr(datamodule, "rotation_axis", "z")
    if isinstance(model, ImageClassificationTask):
        return ImageSymmetry(claimed, num_elements, rotation_deg)
    if isinstance(model, NBodyDynamicsTask):
        return NBodySymmetry(rotation_group_3d(claimed, None, group, default="O3"), num_elements, rotation_deg,
                             jitter, axis)
    if isinstance(model, (PointCloudClassificationTask, PartSegmentationTask)):
        protocol = getattr(datamodule, "test_rotation", None)
        return PointCloudSymmetry(rotation_group_3d(claimed, protocol, group), isinstance(model, PartSegmentationTask),
                                  num_elements, rotation_deg, jitter, axis)
    raise TypeError(f"no diagnosis is defined for {type(model).__name__}: expected one of the tasks of "
                    "canonical_network.tasks (image classification, N-body, point-cloud classification, "
                    "part segmentation)")
