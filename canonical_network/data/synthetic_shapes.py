"""Synthetic shapes: the embedded default for point-cloud classification and part segmentation (§5.3).

Procedurally generated surface point clouds of seven categories, each built from a few primitives (boxes,
cylinders, a dome, a torus arc, a triangle, a frustum) whose proportions vary per shape, with per-point
part labels laid out like ShapeNet-part's (global part ids, contiguous per category):

=========  ======================================  ========
category   parts (global ids)                      optional
=========  ======================================  ========
airplane   body 0, wing 1, tail 2, engine 3        engines (70 %)
cap        crown 4, visor 5
chair      back 6, seat 7, leg 8, arm 9            arms (50 %)
knife      blade 10, handle 11
lamp       base 12, pole 13, shade 14
mug        body 15, handle 16
table      top 17, leg 18, drawer 19
=========  ======================================  ========

Canonical pose: **z is up** (tables stand on z ≥ 0 before centring, shades hang above lamp bases) and
**+x is the front** (airplane nose, knife tip, cap visor, mug handle, lamp shade, table drawer; the chair
back is at −x). So the ``z`` rotation protocol rotates about the up axis, as azimuthal augmentation does.
No shape has a rotational symmetry (each has an off-axis part: a tail fin, a visor, a handle, a drawer set
off in x and y, ...), so a canonicalizer can recover its orientation.

Variation: every proportion is drawn per shape, then an anisotropic scale in [0.85, 1.15] per axis; points
are sampled uniformly on the primitives' surfaces with probability proportional to area (each present part
gets at least ``MIN_PART_SHARE`` of the points), the cloud is centred on its centroid, scaled into the unit
sphere, and Gaussian noise of ``noise_std`` is added. Everything is drawn from one NumPy generator, so a
seed fixes the data.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import TensorDataset

from canonical_network.data.pointclouds import PointCloudDataModule
from canonical_network.utils.checks import check_choice, check_int, check_number

log = logging.getLogger(__name__)

UP_AXIS = "z"
SYNTHETIC_PART_NAMES: dict[str, tuple[str, ...]] = {
    "airplane": ("body", "wing", "tail", "engine"),
    "cap": ("crown", "visor"),
    "chair": ("back", "seat", "leg", "arm"),
    "knife": ("blade", "handle"),
    "lamp": ("base", "pole", "shade"),
    "mug": ("body", "handle"),
    "table": ("top", "leg", "drawer"),
}
SYNTHETIC_CATEGORIES = tuple(SYNTHETIC_PART_NAMES)
_starts = np.cumsum([0] + [len(p) for p in SYNTHETIC_PART_NAMES.values()])
SYNTHETIC_CATEGORY_PARTS: tuple[tuple[int, ...], ...] = tuple(
    tuple(range(int(a), int(b))) for a, b in zip(_starts[:-1], _starts[1:], strict=True)
)
SYNTHETIC_NUM_PARTS = int(_starts[-1])
MIN_PART_SHARE = 0.08  # so that small parts (a mug handle, a tail fin) still get ~80 of 1,024 points
SCALE_JITTER = 0.15
TASKS = ("classification", "segmentation")


# ---------------------------------------------------------------------------------------------------------
# Surface samplers: n shapes at once, k points each; parameters are (n,) or (n, 3) arrays.
# Each returns points (n, k, 3) and the surface area (n,).
# ---------------------------------------------------------------------------------------------------------
def _choose_region(rng: np.random.Generator, areas: np.ndarray, k: int) -> np.ndarray:
    """Region index (n, k) drawn with probability proportional to ``areas`` (n, R)."""
    cum = np.cumsum(areas, axis=1)
    cum = cum / cum[:, -1:]
    return (rng.random((len(areas), k, 1)) > cum[:, None, :]).sum(-1).clip(max=areas.shape[1] - 1)


def _box(rng, k, center, half):
    face = np.stack([half[:, 1] * half[:, 2], half[:, 0] * half[:, 2], half[:, 0] * half[:, 1]], axis=1)
    axis = _choose_region(rng, face, k)  # which pair of faces: normal along x, y or z
    local = rng.uniform(-1.0, 1.0, (len(center), k, 3))
    sign = rng.choice([-1.0, 1.0], size=(len(center), k, 1))
    np.put_along_axis(local, axis[..., None], sign, axis=2)
    return center[:, None] + local * half[:, None], 8.0 * face.sum(1)


def _cylinder(rng, k, center, radius, half_length, axis=2, caps=(True, True)):
    """Side plus optional bottom/top discs of a cylinder along ``axis`` (0 = x, 2 = z)."""
    side = 4 * np.pi * radius * half_length
    disc = np.pi * radius**2
    areas = np.stack([side, disc * caps[0], disc * caps[1]], axis=1)
    region = _choose_region(rng, areas, k)  # 0 side, 1 disc at -L, 2 disc at +L
    n = len(center)
    theta = rng.uniform(0, 2 * np.pi, (n, k))
    rho = np.where(region == 0, radius[:, None], radius[:, None] * np.sqrt(rng.random((n, k))))
    along = np.where(
        region == 0,
        rng.uniform(-1, 1, (n, k)) * half_length[:, None],
        np.where(region == 1, -1.0, 1.0) * half_length[:, None],
    )
    points = np.empty((n, k, 3))
    points[..., axis] = along
    points[..., (axis + 1) % 3] = rho * np.cos(theta)
    points[..., (axis + 2) % 3] = rho * np.sin(theta)
    return center[:, None] + points, areas.sum(1)


def _dome(rng, k, center, radii):
    """Upper half (z ≥ 0) of an ellipsoid with semi-axes ``radii`` (n, 3)."""
    v = rng.normal(size=(len(center), k, 3))
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    v[..., 2] = np.abs(v[..., 2])
    # Half of Thomsen's approximation of an ellipsoid's area (exact for a sphere).
    a, b, c = (radii[:, i] ** 1.6 for i in range(3))
    area = 2 * np.pi * ((a * b + a * c + b * c) / 3) ** (1 / 1.6)
    return center[:, None] + v * radii[:, None], area


def _handle(rng, k, center, ring_radius, tube_radius):
    """Half torus in the xz-plane bulging towards +x (a mug handle), centred at ``center``."""
    n = len(center)
    theta = rng.uniform(-np.pi / 2, np.pi / 2, (n, k))
    phi = rng.uniform(0, 2 * np.pi, (n, k))
    ring = ring_radius[:, None] + tube_radius[:, None] * np.cos(phi)
    points = np.stack([ring * np.cos(theta), tube_radius[:, None] * np.sin(phi), ring * np.sin(theta)], -1)
    return center[:, None] + points, 2 * np.pi**2 * ring_radius * tube_radius


def _triangle_xz(rng, k, a, b, c, half_thickness):
    """Thin triangular plate in the xz-plane with corners ``a, b, c`` (n, 2) given as (x, z)."""
    n = len(a)
    u, v = rng.random((n, k, 1)), rng.random((n, k, 1))
    flip = (u + v) > 1  # reflect into the triangle: uniform on it
    u, v = np.where(flip, 1 - u, u), np.where(flip, 1 - v, v)
    xz = a[:, None] + u * (b - a)[:, None] + v * (c - a)[:, None]
    y = rng.uniform(-1, 1, (n, k)) * half_thickness[:, None]
    ab, ac = b - a, c - a
    area = np.abs(ab[:, 0] * ac[:, 1] - ab[:, 1] * ac[:, 0])  # both faces: 2 × ½|ab × ac|
    return np.stack([xz[..., 0], y, xz[..., 1]], -1), area


def _frustum(rng, k, bottom_center, r_bottom, r_top, height, axis=2):
    """Open lateral surface of a truncated cone rising along +``axis`` (a lamp shade, a nose cone)."""
    n = len(bottom_center)
    t = rng.random((n, k))
    theta = rng.uniform(0, 2 * np.pi, (n, k))
    r = r_bottom[:, None] + (r_top - r_bottom)[:, None] * t
    points = np.empty((n, k, 3))
    points[..., axis] = t * height[:, None]
    points[..., (axis + 1) % 3] = r * np.cos(theta)
    points[..., (axis + 2) % 3] = r * np.sin(theta)
    area = np.pi * (r_bottom + r_top) * np.sqrt((r_bottom - r_top) ** 2 + height**2)
    return bottom_center[:, None] + points, area


# ---------------------------------------------------------------------------------------------------------
# Categories: each builder draws the proportions of n shapes and returns their primitives.
# ---------------------------------------------------------------------------------------------------------
class _Primitive(NamedTuple):
    """One surface of n shapes: local part index, area (n,), presence (n,), and a sampler k → (n, k, 3)."""

    part: int
    area: np.ndarray
    present: np.ndarray
    sample: Callable[[int], np.ndarray]


def _prim(part: int, present: np.ndarray, sampler: Callable, rng: np.random.Generator, *args, **kwargs):
    """Bind a surface sampler to its parameters; its area comes from a draw of zero points."""
    area = sampler(rng, 0, *args, **kwargs)[1]
    return _Primitive(part, area, present, lambda k: sampler(rng, k, *args, **kwargs)[0])


def _xyz(n: int, x, y, z) -> np.ndarray:
    """Stack scalars and (n,) arrays into (n, 3)."""
    return np.stack([np.broadcast_to(np.asarray(v, dtype=float), (n,)) for v in (x, y, z)], axis=1)


def _airplane(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    length, radius = u(0.8, 1.1), u(0.07, 0.12)  # fuselage: half length along x (nose at +x), radius
    wing_x, chord, span = u(-0.15, 0.1) * length, u(0.12, 0.2), u(0.7, 1.0)  # chord, span: halves
    nose, fin_h, stabiliser = u(0.2, 0.35), u(0.12, 0.2), u(0.2, 0.3)
    engine_y, engine_r, engine_l = u(0.3, 0.5) * span, u(0.04, 0.06), u(0.1, 0.15)
    engines = rng.random(n) < 0.7
    prims = [
        _prim(0, always, _cylinder, rng, xyz(0, 0, 0), radius, length, axis=0, caps=(True, False)),
        # A pointed nose and a tall fin make front/back and up/down plain to see.
        _prim(0, always, _frustum, rng, xyz(length, 0, 0), radius, np.zeros(n), nose, axis=0),
        _prim(1, always, _box, rng, xyz(wing_x, 0, 0), xyz(chord, span, 0.015)),
        _prim(2, always, _box, rng, xyz(-0.85 * length, 0, radius + fin_h), xyz(0.12, 0.012, fin_h)),
        _prim(2, always, _box, rng, xyz(-0.88 * length, 0, 0.3 * radius), xyz(0.07, stabiliser, 0.012)),
    ]
    for side in (-1, 1):
        center = xyz(wing_x + 0.05, side * engine_y, -(0.015 + engine_r))
        prims.append(_prim(3, engines, _cylinder, rng, center, engine_r, engine_l, axis=0))
    return prims


def _cap(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    radii = xyz(u(0.45, 0.55), u(0.4, 0.5), u(0.3, 0.45))
    visor, visor_w = u(0.25, 0.4), u(0.6, 0.8) * radii[:, 1]
    return [
        _prim(0, always, _dome, rng, xyz(0, 0, 0), radii),
        _prim(
            1, always, _box, rng, xyz(radii[:, 0] + visor / 2 - 0.1, 0, 0.01), xyz(visor / 2, visor_w, 0.01)
        ),
    ]


def _chair(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    depth, width = u(0.2, 0.28), u(0.2, 0.28)  # halves
    seat_z, back_h, leg_r = u(0.4, 0.5), u(0.35, 0.6), u(0.02, 0.03)
    arms = rng.random(n) < 0.5
    top = seat_z + 0.03
    prims = [
        _prim(0, always, _box, rng, xyz(-depth + 0.03, 0, top + back_h / 2), xyz(0.03, width, back_h / 2)),
        _prim(1, always, _box, rng, xyz(0, 0, seat_z), xyz(depth, width, 0.03)),
    ]
    leg_half = (seat_z - 0.03) / 2
    for sx in (-1, 1):
        for sy in (-1, 1):
            center = xyz(sx * (depth - 0.04), sy * (width - 0.04), leg_half)
            prims.append(_prim(2, always, _cylinder, rng, center, leg_r, leg_half))
    for sy in (-1, 1):
        y = sy * (width - 0.02)
        prims.append(_prim(3, arms, _box, rng, xyz(0, y, top + 0.2), xyz(0.85 * depth, 0.025, 0.02)))
        prims.append(_prim(3, arms, _box, rng, xyz(0.7 * depth, y, top + 0.1), xyz(0.02, 0.02, 0.1)))
    return prims


def _knife(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    handle, blade, heel, grip = u(0.25, 0.35), u(0.5, 0.8), u(0.12, 0.18), u(0.03, 0.04)
    # Blade in the xz-plane: straight spine on top, edge rising from the heel to the tip at +x.
    corners = [xyz(0, 0, -0.6 * heel), xyz(0, 0, 0.4 * heel), xyz(blade, 0, 0.4 * heel)]
    return [
        _prim(0, always, _triangle_xz, rng, *(c[:, [0, 2]] for c in corners), np.full(n, 0.006)),
        # The handle is flush with the spine, not centred on the blade.
        _prim(1, always, _box, rng, xyz(-handle / 2, 0, 0.4 * heel - grip), xyz(handle / 2, 0.02, grip)),
    ]


def _lamp(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    height, arm, base_r, shade_h = u(0.5, 0.8), u(0.2, 0.35), u(0.12, 0.18), u(0.12, 0.2)
    shade_bottom, shade_top = u(0.1, 0.15), u(0.03, 0.06)
    thin, pole_half = np.full(n, 0.015), (height - 0.04) / 2
    return [
        _prim(0, always, _cylinder, rng, xyz(0, 0, 0.02), base_r, np.full(n, 0.02)),
        _prim(1, always, _cylinder, rng, xyz(0, 0, 0.04 + pole_half), thin, pole_half),
        _prim(1, always, _cylinder, rng, xyz(arm / 2, 0, height), thin, arm / 2, axis=0),
        # The shade hangs from the end of the arm, off the pole's axis: no symmetry about z.
        _prim(2, always, _frustum, rng, xyz(arm, 0, height - shade_h), shade_bottom, shade_top, shade_h),
    ]


def _mug(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    radius, height = u(0.3, 0.45), u(0.6, 1.0)
    handle_r = u(0.25, 0.35) * height
    return [
        # Open at the top: the bottom disc tells up from down.
        _prim(0, always, _cylinder, rng, xyz(0, 0, height / 2), radius, height / 2, caps=(True, False)),
        _prim(1, always, _handle, rng, xyz(radius, 0, height / 2), handle_r, u(0.04, 0.06)),
    ]


def _table(rng, n):
    u = lambda lo, hi: rng.uniform(lo, hi, n)
    xyz = lambda x, y, z: _xyz(n, x, y, z)
    always = np.ones(n, bool)
    length, width = u(0.4, 0.7), u(0.25, 0.4)  # halves
    height, leg_r, drawer_h = u(0.6, 0.8), u(0.025, 0.04), u(0.08, 0.12)
    thick = 0.025
    prims = [_prim(0, always, _box, rng, xyz(0, 0, height - thick), xyz(length, width, thick))]
    leg_half = (height - 2 * thick) / 2
    for sx in (-1, 1):
        for sy in (-1, 1):
            center = xyz(sx * (length - 0.06), sy * (width - 0.06), leg_half)
            prims.append(_prim(1, always, _cylinder, rng, center, leg_r, leg_half))
    # Set off in both x and y: breaks the 180° symmetry of the four legs.
    drawer = xyz(0.45 * length, 0.3 * width, height - 2 * thick - drawer_h)
    prims.append(_prim(2, always, _box, rng, drawer, xyz(0.35 * length, 0.45 * width, drawer_h)))
    return prims


_BUILDERS: dict[str, Callable[[np.random.Generator, int], list[_Primitive]]] = {
    "airplane": _airplane, "cap": _cap, "chair": _chair, "knife": _knife,
    "lamp": _lamp, "mug": _mug, "table": _table,
}  # fmt: skip


def _sample_surface(rng: np.random.Generator, prims: list[_Primitive], num_parts: int, num_points: int):
    """Sample ``num_points`` surface points per shape from its primitives.

    Part ``p`` of a shape gets a share ``max(area_p / area, MIN_PART_SHARE)`` of the points (0 if absent),
    split among its primitives by area. The number of points per primitive is multinomial, as for i.i.d.
    points on the surface; only that many are drawn from each primitive.

    Returns:
        points (n, P, 3) in random order and local part indices (n, P).
    """
    n = len(prims[0].area)
    part_area = np.zeros((n, num_parts))
    for prim in prims:
        part_area[:, prim.part] += prim.area * prim.present
    share = part_area / part_area.sum(1, keepdims=True)
    share = np.where(part_area > 0, np.maximum(share, MIN_PART_SHARE), 0.0)
    weight = np.stack(
        [share[:, p.part] * p.area * p.present / np.maximum(part_area[:, p.part], 1e-300) for p in prims], 1
    )
    counts = rng.multinomial(num_points, weight / weight.sum(1, keepdims=True))  # (n, J), rows sum to P
    blocks, keep, labels = [], [], []
    for j, prim in enumerate(prims):
        k = int(counts[:, j].max())  # every shape draws as many; each keeps only its own count
        blocks.append(prim.sample(k))
        keep.append(np.arange(k) < counts[:, j, None])
        labels.append(np.full(k, prim.part))
    # Exactly P kept candidates per row; random keys put them first, in random order (the primitive order
    # of the candidates must not tell the part).
    keys = np.where(np.concatenate(keep, axis=1), rng.random((n, sum(b.shape[1] for b in blocks))), 2.0)
    chosen = np.argsort(keys, axis=1)[:, :num_points]
    points = np.take_along_axis(np.concatenate(blocks, axis=1), chosen[..., None], axis=1)
    return points, np.concatenate(labels)[chosen]


def generate_synthetic_shapes(
    num_shapes: int,
    num_points: int = 1024,
    seed: int | np.random.Generator = 0,
    noise_std: float = 0.01,
) -> dict[str, np.ndarray]:
    """Generate ``num_shapes`` clouds, categories balanced (they differ by at most one) in random order.

    Args:
        num_shapes: number of clouds.
        num_points: points per cloud.
        seed: seed or NumPy generator; the output depends only on it and the other arguments.
        noise_std: standard deviation of the Gaussian noise added after scaling into the unit sphere.

    Returns:
        ``points`` (N, P, 3) float32 in canonical pose (z up, +x front, centred, inside the unit sphere up to
        noise), ``categories`` (N,) int64 (index into :data:`SYNTHETIC_CATEGORIES`), ``part_labels`` (N, P)
        int64 (global part ids, :data:`SYNTHETIC_CATEGORY_PARTS`).
    """
    check_int("num_shapes", num_shapes, low=0)
    check_int("num_points", num_points, low=1)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    categories = rng.permutation(np.arange(num_shapes) % len(SYNTHETIC_CATEGORIES)).astype(np.int64)
    points = np.zeros((num_shapes, num_points, 3))
    part_labels = np.zeros((num_shapes, num_points), dtype=np.int64)
    for c, name in enumerate(SYNTHETIC_CATEGORIES):
        index = np.flatnonzero(categories == c)
        if len(index) == 0:
            continue
        prims = _BUILDERS[name](rng, len(index))
        cloud, local = _sample_surface(rng, prims, len(SYNTHETIC_PART_NAMES[name]), num_points)
        points[index] = cloud * rng.uniform(1 - SCALE_JITTER, 1 + SCALE_JITTER, (len(index), 1, 3))
        part_labels[index] = np.asarray(SYNTHETIC_CATEGORY_PARTS[c])[local]
    points -= points.mean(axis=1, keepdims=True)
    points /= np.linalg.norm(points, axis=-1).max(axis=1)[:, None, None].clip(min=1e-12)
    points += rng.normal(scale=noise_std, size=points.shape)
    return {"points": points.astype(np.float32), "categories": categories, "part_labels": part_labels}


class SyntheticShapesDataModule(PointCloudDataModule):
    """Generated shapes (see the module docstring) for classification or part segmentation; no files.

    Batches: ``task="classification"``: ``(points (B, P, 3) float32, label (B,) int64)``;
    ``task="segmentation"``: ``(points (B, P, 3), category (B,) int64, part_labels (B, P) int64)``, the
    formats of :class:`~canonical_network.data.modelnet.ModelNet40DataModule` and
    :class:`~canonical_network.data.shapenet.ShapeNetPartDataModule`.

    Each split is generated from its own stream of ``data_seed`` (changing ``num_train`` leaves the test
    set as it is). The ``z`` protocol rotates about the up axis z.

    Args:
        task: ``classification`` or ``segmentation``.
        num_train, num_val, num_test: clouds per split.
        num_points: points per cloud.
        noise_std: Gaussian noise on the unit-sphere-scaled clouds.
        rotation: train/test rotation protocol (``z/z``, ``z/so3``, ``so3/so3``, ...).
        data_seed: seed of the shapes and of the fixed evaluation rotations.
        batch_size, num_workers, pin_memory: DataLoader arguments.
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "synthetic_shapes"  # configs/data/<config_name>.yaml
    display_name = "synthetic_shapes (not the paper's data)"
    paper_data = False  # the paper's numbers were measured on (a subset of) this data
    tasks = ("PointCloudClassificationTask", "PartSegmentationTask")  # the task classes (model._target_) that read it

    NUM_CATEGORIES = len(SYNTHETIC_CATEGORIES)
    NUM_PARTS = SYNTHETIC_NUM_PARTS
    CATEGORY_PARTS = SYNTHETIC_CATEGORY_PARTS

    def __init__(
        self,
        task: str = "classification",
        num_train: int = 2000,
        num_val: int = 400,
        num_test: int = 400,
        num_points: int = 1024,
        noise_std: float = 0.01,
        rotation: str = "z/z",
        data_seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(rotation, UP_AXIS, data_seed, batch_size, num_workers, pin_memory)
        check_choice("data.task", task, TASKS)
        for key, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            check_int(f"data.{key}", value, low=1)
        check_int("data.num_points", num_points, low=1)
        check_number("data.noise_std", noise_std, low=0)
        self.task = task
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.num_points = num_points
        self.noise_std = float(noise_std)
        self.num_classes = self.num_categories = self.NUM_CATEGORIES
        self.num_parts = self.NUM_PARTS
        self.category_parts = self.CATEGORY_PARTS

    def generate(self, size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``size`` clouds drawn from ``rng`` (:func:`generate_synthetic_shapes`'s arrays)."""
        return generate_synthetic_shapes(size, self.num_points, rng, self.noise_std)

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        for split, size in self.sizes.items():
            seed = np.random.SeedSequence([self.data_seed, zlib.crc32(split.encode())])
            data = self.generate(size, np.random.default_rng(seed))
            points = torch.from_numpy(data["points"])
            if split != "train":
                points = self.rotate_eval(points, split)
            tensors = [points, torch.from_numpy(data["categories"])]
            if self.task == "segmentation":
                tensors.append(torch.from_numpy(data["part_labels"]))
            self.splits[split] = TensorDataset(*tensors)
        log.info("%s sizes: %s", self.config_name, {k: len(v) for k, v in self.splits.items()})
