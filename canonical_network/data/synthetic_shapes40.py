"""Synthetic shapes, 40 classes: an embedded classification set with headroom (``data=synthetic_shapes40``).

The 7 categories of :mod:`~canonical_network.data.synthetic_shapes` are told apart by almost any model
(DGCNN 100 % under z/z at the CPU budget), so differences between canonicalizers cannot show there. This
variant has ModelNet40's class count and is built to be hard in the ways real scans are:

* **Families of look-alike classes.** Ten families of four classes each share their parts and differ in
  proportions and in one or two parts (a chair has a back, a stool a round seat and a footrest, a bench a
  long seat; a car, a truck and a bus differ in length, height and wheels). Proportion ranges of siblings
  overlap, and each shape gets an anisotropic scale of ±``SCALE_JITTER`` per axis on top.
* **Missing parts.** Each part marked optional in a builder (the one that tells a class from its siblings,
  mostly) is left out of a shape with probability ``part_dropout``, independently per part and shape: a
  chair without its back looks like a bench or a stool. This is the knob of the error floor.
* **Non-uniform sampling.** Points are drawn uniformly on the surface (each part gets at least
  ``synthetic_shapes.MIN_PART_SHARE`` of them), then ``num_points`` of twice as many candidates are kept with weights
  ``exp(s · <x, d>)``, a random direction ``d`` and strength ``s ~ U[0, sampling_bias]`` per shape (x in the
  unit sphere): one side of a shape is denser than the other, as in a scan.
* **Noise.** Gaussian noise of ``noise_std`` after scaling into the unit sphere.

Canonical pose as in the 7-class set: z up, +x front (noses, blades, spouts and doors point to +x). Every
class has some part off its z axis (a visor, a spout, a door, a tag), but in 12 classes that part is small, so
that a turn about z maps the shape nearly onto itself, as ModelNet40's bottles, cups and vases are: rocket
(three fins, C₃ up to its pod), lighthouse, table lamp, bottle, cabinet, coffee table, cup, and less so bucket
hat, bed, umbrella, bus and hat (tests/test_synthetic_shapes40.py measures it). A canonicalizer's pose of these
is ambiguous; their class is not. Part labels are global ids, contiguous per class (:data:`SHAPES40_CLASS_PARTS`),
for readers that want them (the dress rehearsal's ShapeNet-layout files); the data module serves
classification only.

Everything is drawn from one NumPy generator, so a seed fixes the data. How hard it is — a z-invariant
descriptor with extra trees at each setting, the knobs moved one at a time, and the DGCNN runs that exist — is
in docs/measurements.md ("Synthetic shapes, 40 classes"), with the commands that measure it
(``scripts/shapes40_difficulty.py``, ``scripts/reproduce.sh shapes40``). The default ``scale_jitter`` was moved
from 0.35 to 0.65 on 2026-12-02 by DGCNN's own runs (z/z, 1,024 points, 4,000 clouds, one seed, 10 epochs):
above issue 37's 85-95 % band at 0.35, inside it at 0.65. Runs at the earlier default are another data set
(``records.dataset_of`` reads each run's recorded difficulty); DGCNN trained to convergence (the paper's 200
epochs, more seeds) is not measured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from canonical_network.data.synthetic_shapes import (
    SyntheticShapesDataModule,
    _box,
    _cylinder,
    _dome,
    _frustum,
    _handle,
    _prim,
    _Primitive,
    _sample_surface,
    _triangle_xz,
    _xyz,
)
from canonical_network.utils.checks import check_choice, check_int, check_number

log = logging.getLogger(__name__)

SCALE_JITTER = 0.65  # configs/data/synthetic_shapes40.yaml says why (tests hold the two equal)
CANDIDATES_PER_POINT = 2  # candidates drawn per kept point for the non-uniform sampling


# ---------------------------------------------------------------------------------------------------------
# Extra surfaces: any sampler of synthetic_shapes.py turned by an orthogonal matrix, and a full ellipsoid.
# ---------------------------------------------------------------------------------------------------------
def _mapped(rng, k, center, matrix, sampler, *args, **kwargs):
    """``sampler(rng, k, *args)``'s surface (built about the origin) mapped by the orthogonal ``matrix`` (3, 3),
    then moved by ``center`` (n, 3). Orthogonal maps keep areas."""
    points, area = sampler(rng, k, *args, **kwargs)
    return center[:, None] + points @ np.asarray(matrix, dtype=float).T, area


def _ellipsoid(rng, k, center, radii):
    """Whole ellipsoid with semi-axes ``radii`` (n, 3)."""
    v = rng.normal(size=(len(center), k, 3))
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    a, b, c = (radii[:, i] ** 1.6 for i in range(3))
    area = 4 * np.pi * ((a * b + a * c + b * c) / 3) ** (1 / 1.6)  # Thomsen's approximation
    return center[:, None] + v * radii[:, None], area


def _about_z(angle_deg: float) -> np.ndarray:
    t = np.deg2rad(angle_deg)
    return np.array([[np.cos(t), -np.sin(t), 0.0], [np.sin(t), np.cos(t), 0.0], [0.0, 0.0, 1.0]])


SWAP_YZ = np.array([[1.0, 0, 0], [0, 0, 1], [0, 1, 0]])  # an xz-plane surface into the xy-plane
FLIP_X = np.diag([-1.0, 1, 1])  # a handle bulging to −x
FLIP_Z = np.diag([1.0, 1, -1])  # a dome opening upwards
X_TO_Z = np.array([[0.0, 0, 1], [0, 1, 0], [1, 0, 0]])  # a handle arching upwards (an arc lamp)


class _Shapes:
    """The draws and surfaces of ``n`` shapes of one class, filled by a builder.

    ``u(lo, hi)`` draws one proportion per shape, ``at(x, y, z)`` stacks coordinates, ``optional(part)`` is
    the per-shape mask of an optional part (kept with probability ``1 − part_dropout``, the same mask for
    every surface of that part), ``add(part, sampler, *args)`` adds a surface of a local part.
    """

    def __init__(self, rng: np.random.Generator, n: int, part_dropout: float) -> None:
        self.rng, self.n, self.part_dropout = rng, n, part_dropout
        self.prims: list[_Primitive] = []
        self._kept: dict[int, np.ndarray] = {}

    def u(self, lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, self.n)

    def at(self, x, y, z) -> np.ndarray:
        return _xyz(self.n, x, y, z)

    def optional(self, part: int) -> np.ndarray:
        if part not in self._kept:
            self._kept[part] = self.rng.random(self.n) >= self.part_dropout
        return self._kept[part]

    def add(self, part: int, sampler: Callable, *args, present: np.ndarray | None = None, **kwargs) -> None:
        present = np.ones(self.n, bool) if present is None else present
        self.prims.append(_prim(part, present, sampler, self.rng, *args, **kwargs))

    def add_optional(self, part: int, sampler: Callable, *args, **kwargs) -> None:
        self.add(part, sampler, *args, present=self.optional(part), **kwargs)


def _legs(s: _Shapes, part: int, x: np.ndarray, y: np.ndarray, top: np.ndarray, radius: np.ndarray) -> None:
    """Four cylinder legs at (±x, ±y), from the floor up to ``top``."""
    for sx in (-1, 1):
        for sy in (-1, 1):
            s.add(part, _cylinder, s.at(sx * x, sy * y, top / 2), radius, top / 2)


def _wheels(s: _Shapes, part: int, xs: list[np.ndarray], half_width: np.ndarray, radius: np.ndarray) -> None:
    """A pair of wheels (discs along y) at each x of ``xs``, touching the floor."""
    for x in xs:
        for sy in (-1, 1):
            s.add(part, _cylinder, s.at(x, sy * half_width, radius), radius, np.full(s.n, 0.03), axis=1)


# ---------------------------------------------------------------------------------------------------------
# Aircraft: body 0, wing 1, tail 2, engine / propeller 3
# ---------------------------------------------------------------------------------------------------------
def _airliner(s: _Shapes) -> None:
    length, r, wing_x = s.u(0.8, 1.1), s.u(0.07, 0.11), s.u(-0.15, 0.1)
    chord, span, fin = s.u(0.12, 0.2), s.u(0.8, 1.0), s.u(0.12, 0.2)
    s.add(0, _cylinder, s.at(0, 0, 0), r, length, axis=0, caps=(True, False))
    s.add(0, _frustum, s.at(length, 0, 0), r, 0 * r, s.u(0.15, 0.3), axis=0)
    s.add(1, _box, s.at(wing_x * length, 0, 0), s.at(chord, span, 0.015))
    s.add(2, _box, s.at(-0.85 * length, 0, r + fin), s.at(0.12, 0.012, fin))
    s.add(2, _box, s.at(-0.88 * length, 0, 0.3 * r), s.at(0.07, s.u(0.2, 0.3), 0.012))
    engine_y = s.u(0.3, 0.5) * span
    for sy in (-1, 1):
        s.add_optional(3, _cylinder, s.at(wing_x * length + 0.05, sy * engine_y, -0.07), np.full(s.n, 0.05),
                       s.u(0.1, 0.14), axis=0)


def _fighter(s: _Shapes) -> None:
    length, r, span = s.u(0.6, 0.85), s.u(0.06, 0.09), s.u(0.45, 0.65)
    s.add(0, _cylinder, s.at(0, 0, 0), r, length, axis=0, caps=(True, False))
    s.add(0, _frustum, s.at(length, 0, 0), r, 0 * r, s.u(0.25, 0.4), axis=0)
    apex, back = s.u(0.1, 0.35) * length, -0.7 * length
    # One delta wing through the body: apex forward, trailing edge across y.
    corners = [np.stack([apex, 0 * apex], 1), np.stack([back, span], 1), np.stack([back, -span], 1)]
    s.add(1, _mapped, s.at(0, 0, 0), SWAP_YZ, _triangle_xz, *corners, np.full(s.n, 0.01))
    fin_h = s.u(0.15, 0.25)
    for sy in (-1, 1):  # twin fins
        s.add(2, _box, s.at(-0.8 * length, sy * 0.08, r + fin_h), s.at(0.1, 0.01, fin_h))
    s.add_optional(3, _cylinder, s.at(-length - 0.06, 0, 0), 0.8 * r, np.full(s.n, 0.06), axis=0)


def _glider(s: _Shapes) -> None:
    length, r, span = s.u(0.7, 0.95), s.u(0.04, 0.06), s.u(1.1, 1.5)
    s.add(0, _cylinder, s.at(0, 0, 0), r, length, axis=0)
    s.add(0, _dome, s.at(0.3 * length, 0, r), s.at(0.2, 0.8 * r, 0.6 * r))  # canopy
    s.add(1, _box, s.at(0.05, 0, r), s.at(s.u(0.06, 0.1), span, 0.01))
    fin = s.u(0.12, 0.2)
    s.add(2, _box, s.at(-0.9 * length, 0, r + fin), s.at(0.08, 0.01, fin))
    s.add_optional(2, _box, s.at(-0.92 * length, 0, r + 2 * fin), s.at(0.06, s.u(0.15, 0.25), 0.01))  # T-tail


def _biplane(s: _Shapes) -> None:
    length, r, span, gap = s.u(0.5, 0.7), s.u(0.08, 0.12), s.u(0.6, 0.8), s.u(0.15, 0.22)
    chord = s.u(0.12, 0.18)
    s.add(0, _cylinder, s.at(0, 0, 0), r, length, axis=0)
    for z in (-gap / 2, gap / 2):
        s.add(1, _box, s.at(0.2 * length, 0, z), s.at(chord, span, 0.012))
    for sy in (-1, 1):  # struts between the wings
        s.add(1, _cylinder, s.at(0.2 * length, sy * 0.7 * span, 0), np.full(s.n, 0.01), gap / 2)
    fin = s.u(0.1, 0.16)
    s.add(2, _box, s.at(-0.9 * length, 0, r + fin), s.at(0.08, 0.01, fin))
    s.add(2, _box, s.at(-0.9 * length, 0, 0), s.at(0.06, s.u(0.15, 0.22), 0.01))
    s.add_optional(3, _box, s.at(length + 0.02, 0, 0), s.at(0.01, s.u(0.2, 0.3), 0.03))  # propeller


# ---------------------------------------------------------------------------------------------------------
# Seats: back 0, seat 1, leg 2, arm 3 (a stool: seat 0, leg 1, footrest 2)
# ---------------------------------------------------------------------------------------------------------
def _chair(s: _Shapes) -> None:
    depth, width, seat_z, back = s.u(0.2, 0.28), s.u(0.2, 0.28), s.u(0.4, 0.5), s.u(0.35, 0.6)
    s.add_optional(0, _box, s.at(-depth + 0.03, 0, seat_z + 0.03 + back / 2), s.at(0.03, width, back / 2))
    s.add(1, _box, s.at(0, 0, seat_z), s.at(depth, width, 0.03))
    _legs(s, 2, depth - 0.04, width - 0.04, seat_z - 0.03, s.u(0.015, 0.03))


def _armchair(s: _Shapes) -> None:
    depth, width, seat_z, back = s.u(0.25, 0.33), s.u(0.25, 0.33), s.u(0.3, 0.42), s.u(0.3, 0.5)
    s.add(0, _box, s.at(-depth + 0.05, 0, seat_z + back / 2), s.at(0.05, width, back / 2))
    s.add(1, _box, s.at(0, 0, seat_z), s.at(depth, width, 0.05))
    _legs(s, 2, depth - 0.05, width - 0.05, seat_z - 0.05, s.u(0.02, 0.03))
    arm_z = s.u(0.15, 0.22)
    for sy in (-1, 1):
        s.add_optional(3, _box, s.at(0, sy * width, seat_z + arm_z), s.at(0.9 * depth, 0.04, 0.03))
        s.add_optional(3, _box, s.at(0.8 * depth, sy * width, seat_z + arm_z / 2), s.at(0.03, 0.03, arm_z / 2))


def _stool(s: _Shapes) -> None:
    seat_r, seat_z, spread = s.u(0.15, 0.22), s.u(0.5, 0.75), s.u(0.8, 1.0)
    s.add(0, _cylinder, s.at(0, 0, seat_z), seat_r, np.full(s.n, 0.025))
    for angle in (0, 120, 240):  # three legs, one under the front
        t = np.deg2rad(angle)
        x, y = spread * seat_r * np.cos(t), spread * seat_r * np.sin(t)
        s.add(1, _cylinder, s.at(0.85 * x, 0.85 * y, seat_z / 2), np.full(s.n, 0.02), seat_z / 2)
    s.add_optional(2, _box, s.at(0.6 * seat_r, 0, 0.35 * seat_z), s.at(0.02, 0.6 * seat_r, 0.015))  # footrest


def _bench(s: _Shapes) -> None:
    depth, width, seat_z = s.u(0.14, 0.22), s.u(0.5, 0.8), s.u(0.35, 0.45)
    s.add(1, _box, s.at(0, 0, seat_z), s.at(depth, width, 0.025))
    for sy in (-1, 1):  # slab legs
        s.add(2, _box, s.at(0, sy * (width - 0.05), (seat_z - 0.025) / 2), s.at(0.8 * depth, 0.02,
                                                                                 (seat_z - 0.025) / 2))
    back = s.u(0.15, 0.3)
    s.add_optional(0, _box, s.at(-depth, 0, seat_z + 0.05 + back / 2), s.at(0.02, width, back / 2))


# ---------------------------------------------------------------------------------------------------------
# Tables: top 0, leg 1, drawer / shelf 2
# ---------------------------------------------------------------------------------------------------------
def _table(s: _Shapes) -> None:
    length, width, height = s.u(0.4, 0.7), s.u(0.25, 0.4), s.u(0.55, 0.8)
    s.add(0, _box, s.at(0, 0, height - 0.025), s.at(length, width, 0.025))
    _legs(s, 1, length - 0.06, width - 0.06, height - 0.05, s.u(0.02, 0.04))
    drawer = s.u(0.07, 0.12)
    s.add_optional(2, _box, s.at(0.45 * length, 0.3 * width, height - 0.05 - drawer),
                   s.at(0.35 * length, 0.45 * width, drawer))


def _round_table(s: _Shapes) -> None:
    radius, height = s.u(0.35, 0.5), s.u(0.55, 0.8)
    s.add(0, _cylinder, s.at(0, 0, height - 0.02), radius, np.full(s.n, 0.02))
    s.add(1, _cylinder, s.at(0, 0, height / 2), s.u(0.03, 0.05), height / 2)
    foot = s.u(0.2, 0.3)
    s.add(1, _box, s.at(0, 0, 0.02), s.at(foot, 0.03, 0.02))
    s.add(1, _box, s.at(0, 0, 0.02), s.at(0.03, 0.7 * foot, 0.02))
    s.add_optional(2, _box, s.at(0.5 * radius, 0, height - 0.09), s.at(0.25 * radius, 0.3 * radius, 0.05))


def _coffee_table(s: _Shapes) -> None:
    length, width, height = s.u(0.5, 0.8), s.u(0.3, 0.45), s.u(0.25, 0.4)
    s.add(0, _box, s.at(0, 0, height - 0.025), s.at(length, width, 0.025))
    _legs(s, 1, length - 0.05, width - 0.05, height - 0.05, s.u(0.02, 0.035))
    s.add_optional(2, _box, s.at(0.1 * length, 0, 0.3 * height), s.at(0.8 * length, 0.8 * width, 0.012))


def _desk(s: _Shapes) -> None:
    depth, width, height = s.u(0.28, 0.4), s.u(0.6, 0.9), s.u(0.6, 0.75)
    s.add(0, _box, s.at(0, 0, height - 0.025), s.at(depth, width, 0.025))
    for sx in (-1, 1):  # legs at the −y end
        s.add(1, _cylinder, s.at(sx * (depth - 0.05), -width + 0.05, (height - 0.05) / 2), np.full(s.n, 0.025),
              (height - 0.05) / 2)
    pedestal = s.u(0.15, 0.25)  # a drawer pedestal under the +y end
    s.add_optional(2, _box, s.at(0, width - pedestal, (height - 0.05) / 2),
                   s.at(0.9 * depth, pedestal, (height - 0.05) / 2))


# ---------------------------------------------------------------------------------------------------------
# Lamps: base 0, pole / arm 1, shade 2
# ---------------------------------------------------------------------------------------------------------
def _desk_lamp(s: _Shapes) -> None:
    height, arm, shade = s.u(0.5, 0.8), s.u(0.2, 0.35), s.u(0.12, 0.2)
    s.add(0, _cylinder, s.at(0, 0, 0.02), s.u(0.12, 0.18), np.full(s.n, 0.02))
    s.add(1, _cylinder, s.at(0, 0, 0.02 + height / 2), np.full(s.n, 0.015), height / 2)
    s.add(1, _cylinder, s.at(arm / 2, 0, height), np.full(s.n, 0.015), arm / 2, axis=0)
    s.add_optional(2, _frustum, s.at(arm, 0, height - shade), s.u(0.1, 0.15), s.u(0.03, 0.06), shade)


def _floor_lamp(s: _Shapes) -> None:
    height, offset, shade = s.u(1.2, 1.6), s.u(0.05, 0.12), s.u(0.15, 0.25)
    s.add(0, _cylinder, s.at(0, 0, 0.02), s.u(0.12, 0.18), np.full(s.n, 0.02))
    s.add(1, _cylinder, s.at(0, 0, height / 2), np.full(s.n, 0.015), height / 2)
    s.add(1, _cylinder, s.at(offset / 2, 0, height), np.full(s.n, 0.012), offset / 2, axis=0)
    s.add_optional(2, _frustum, s.at(offset, 0, height - 0.3 * shade), s.u(0.15, 0.22), s.u(0.08, 0.12), shade)


def _table_lamp(s: _Shapes) -> None:
    body, pole, shade = s.u(0.15, 0.25), s.u(0.1, 0.2), s.u(0.2, 0.3)
    radius = s.u(0.12, 0.18)
    s.add(0, _ellipsoid, s.at(0, 0, body), s.at(radius, radius, body))
    s.add(0, _box, s.at(radius, 0, 0.5 * body), s.at(0.02, 0.02, 0.03))  # switch, off the axis
    s.add(1, _cylinder, s.at(0, 0, 2 * body + pole / 2), np.full(s.n, 0.015), pole / 2)
    s.add_optional(2, _frustum, s.at(0, 0, 2 * body + 0.6 * pole), s.u(0.2, 0.3), s.u(0.12, 0.18), shade)


def _arc_lamp(s: _Shapes) -> None:
    height, reach, shade = s.u(0.5, 0.8), s.u(0.25, 0.4), s.u(0.1, 0.16)
    s.add(0, _box, s.at(0, 0, 0.03), s.at(0.15, 0.12, 0.03))
    s.add(1, _cylinder, s.at(0, 0, height / 2), np.full(s.n, 0.015), height / 2)
    # Half a ring standing over +x: from the pole's top to 2·reach in front, `reach` higher at its middle.
    s.add(1, _arc, s.at(reach, 0, height), reach)
    s.add_optional(2, _dome, s.at(2 * reach, 0, height - shade), s.at(shade, shade, 0.8 * shade))


def _arc(rng, k, center, reach):
    """Half a thin ring arching over +x from ``center − (reach, 0, 0)`` to ``center + (reach, 0, 0)``."""
    return _mapped(rng, k, center, X_TO_Z, _handle, np.zeros_like(center), reach, np.full(len(center), 0.015))


# ---------------------------------------------------------------------------------------------------------
# Vessels: body 0, handle / neck 1, spout / saucer / label 2
# ---------------------------------------------------------------------------------------------------------
def _mug(s: _Shapes) -> None:
    radius, height = s.u(0.3, 0.45), s.u(0.6, 1.0)
    s.add(0, _cylinder, s.at(0, 0, height / 2), radius, height / 2, caps=(True, False))
    s.add_optional(1, _handle, s.at(radius, 0, height / 2), s.u(0.25, 0.35) * height, s.u(0.04, 0.06))


def _cup(s: _Shapes) -> None:
    radius, height = s.u(0.35, 0.45), s.u(0.3, 0.45)
    s.add(0, _frustum, s.at(0, 0, 0.04), 0.75 * radius, radius, height)
    s.add(0, _cylinder, s.at(0, 0, 0.04), 0.75 * radius, np.full(s.n, 0.005), caps=(False, True))
    s.add(1, _handle, s.at(0.9 * radius, 0, 0.04 + height / 2), s.u(0.25, 0.3) * height, s.u(0.025, 0.04))
    s.add_optional(2, _cylinder, s.at(0, 0, 0.01), s.u(1.5, 1.8) * radius, np.full(s.n, 0.01))  # saucer


def _pitcher(s: _Shapes) -> None:
    bottom, top, height = s.u(0.3, 0.4), s.u(0.22, 0.3), s.u(0.8, 1.1)
    s.add(0, _frustum, s.at(0, 0, 0), bottom, top, height)
    s.add(0, _cylinder, s.at(0, 0, 0), bottom, np.full(s.n, 0.002), caps=(True, False))
    s.add(1, _back_handle, s.at(-0.5 * (bottom + top), 0, 0.55 * height), s.u(0.2, 0.3) * height)
    lip = s.u(0.12, 0.2)
    corners = [np.stack([top, height - lip], 1), np.stack([top, height], 1), np.stack([top + lip, height + 0.05], 1)]
    s.add_optional(2, _triangle_xz, *corners, np.full(s.n, 0.02))


def _back_handle(rng, k, center, ring_radius):
    """A mug handle bulging to −x (tube radius 0.04)."""
    return _mapped(rng, k, center, FLIP_X, _handle, np.zeros_like(center), ring_radius, np.full(len(center), 0.04))


def _bottle(s: _Shapes) -> None:
    radius, height, shoulder, neck = s.u(0.2, 0.3), s.u(0.5, 0.8), s.u(0.1, 0.2), s.u(0.1, 0.2)
    neck_r = s.u(0.06, 0.1)
    s.add(0, _cylinder, s.at(0, 0, height / 2), radius, height / 2, caps=(True, False))
    s.add(1, _frustum, s.at(0, 0, height), radius, neck_r, shoulder)
    s.add(1, _cylinder, s.at(0, 0, height + shoulder + neck / 2), neck_r, neck / 2, caps=(False, False))
    s.add_optional(2, _box, s.at(radius + 0.01, 0, 0.5 * height), s.at(0.01, 0.6 * radius, 0.25 * height))


# ---------------------------------------------------------------------------------------------------------
# Blades and tools, lying along x: blade / head 0, handle 1, guard / claw 2
# ---------------------------------------------------------------------------------------------------------
def _knife(s: _Shapes) -> None:
    handle, blade, heel, grip = s.u(0.25, 0.35), s.u(0.5, 0.8), s.u(0.12, 0.18), s.u(0.03, 0.04)
    zero = np.zeros(s.n)
    corners = [np.stack([zero, -0.6 * heel], 1), np.stack([zero, 0.4 * heel], 1), np.stack([blade, 0.4 * heel], 1)]
    s.add(0, _triangle_xz, *corners, np.full(s.n, 0.006))
    s.add(1, _box, s.at(-handle / 2, 0, 0.4 * heel - grip), s.at(handle / 2, 0.02, grip))
    s.add_optional(2, _box, s.at(0.005, 0, 0.4 * heel - grip), s.at(0.005, 0.03, 1.4 * grip))  # bolster


def _sword(s: _Shapes) -> None:
    blade, width, handle, guard = s.u(0.9, 1.3), s.u(0.05, 0.08), s.u(0.2, 0.3), s.u(0.12, 0.2)
    zero = np.zeros(s.n)
    corners = [np.stack([zero, -width], 1), np.stack([zero, width], 1), np.stack([blade, zero], 1)]
    s.add(0, _triangle_xz, *corners, np.full(s.n, 0.008))
    s.add(1, _cylinder, s.at(-handle / 2, 0, 0), np.full(s.n, 0.025), handle / 2, axis=0)
    s.add(1, _ellipsoid, s.at(-handle - 0.03, 0, 0), s.at(0.04, 0.035, 0.035))  # pommel
    s.add_optional(2, _box, s.at(0.01, 0, 0), s.at(0.015, guard, 0.02))
    s.add(2, _box, s.at(0.01, 0, width + 0.02), s.at(0.012, 0.012, 0.02))  # a ring on the upper side


def _axe(s: _Shapes) -> None:
    handle, head, drop = s.u(0.7, 1.0), s.u(0.08, 0.14), s.u(0.15, 0.25)
    s.add(1, _cylinder, s.at(handle / 2, 0, 0), s.u(0.025, 0.035), handle / 2, axis=0)
    s.add(0, _box, s.at(handle - 0.04, 0, 0.02), s.at(0.04, 0.025, head))
    corners = [np.stack([handle - 0.08, -0.1 * head], 1), np.stack([handle, -0.1 * head], 1),
               np.stack([handle + 0.05, -head - drop], 1)]
    s.add(0, _triangle_xz, *corners, np.full(s.n, 0.01))  # the bit, hanging below the handle
    s.add_optional(2, _box, s.at(handle - 0.04, 0, head + 0.05), s.at(0.02, 0.02, 0.05))  # a spike on top


def _hammer(s: _Shapes) -> None:
    handle, head, face = s.u(0.5, 0.8), s.u(0.12, 0.2), s.u(0.04, 0.06)
    s.add(1, _cylinder, s.at(handle / 2, 0, 0), s.u(0.02, 0.03), handle / 2, axis=0)
    s.add(0, _cylinder, s.at(handle, 0, -head / 2), face, head / 2)  # the striking face points down
    s.add_optional(2, _frustum, s.at(handle, 0, 0), face, 0.3 * face, s.u(0.12, 0.2))  # the claw, up
    s.add(1, _box, s.at(0.03, 0, 0), s.at(0.03, 0.035, 0.035))  # grip end


# ---------------------------------------------------------------------------------------------------------
# Headwear: crown 0, visor / brim 1, band / strap / tag 2
# ---------------------------------------------------------------------------------------------------------
def _cap(s: _Shapes) -> None:
    radii = s.at(s.u(0.45, 0.55), s.u(0.4, 0.5), s.u(0.3, 0.45))
    visor = s.u(0.25, 0.4)
    s.add(0, _dome, s.at(0, 0, 0), radii)
    s.add_optional(1, _box, s.at(radii[:, 0] + visor / 2 - 0.1, 0, 0.01), s.at(visor / 2, 0.7 * radii[:, 1], 0.01))
    s.add(2, _ellipsoid, s.at(0, 0, radii[:, 2]), s.at(0.04, 0.04, 0.02))  # button


def _hat(s: _Shapes) -> None:
    crown_r, crown_h, brim = s.u(0.3, 0.38), s.u(0.12, 0.2), s.u(0.55, 0.7)
    s.add(0, _cylinder, s.at(0, 0, crown_h), crown_r, crown_h, caps=(False, True))
    s.add_optional(1, _cylinder, s.at(0, 0, 0), brim, np.full(s.n, 0.008))
    corners = [np.stack([np.full(s.n, -0.05), np.zeros(s.n)], 1), np.stack([np.full(s.n, 0.05), np.zeros(s.n)], 1),
               np.stack([-0.1 + 0 * crown_h, 0.3 + crown_h], 1)]
    s.add(2, _feather, s.at(0, crown_r + 0.01, crown_h), corners)


def _feather(rng, k, center, corners):
    """A thin triangle in the yz-plane (a feather on the hat's +y side)."""
    return _mapped(rng, k, center, _about_z(90), _triangle_xz, *corners, np.full(len(center), 0.005))


def _helmet(s: _Shapes) -> None:
    radii = s.at(s.u(0.45, 0.55), s.u(0.4, 0.5), s.u(0.45, 0.6))
    s.add(0, _dome, s.at(0, 0, 0), radii)
    s.add_optional(1, _box, s.at(radii[:, 0], 0, 0.05), s.at(0.01, 0.6 * radii[:, 1], 0.08))  # face guard
    s.add(1, _box, s.at(-radii[:, 0] + 0.02, 0, -0.08), s.at(0.02, 0.6 * radii[:, 1], 0.08))  # neck guard
    for sy in (-1, 1):
        s.add(2, _box, s.at(0.1, sy * radii[:, 1], -0.12), s.at(0.02, 0.005, 0.12))  # straps


def _bucket_hat(s: _Shapes) -> None:
    bottom, top, height = s.u(0.35, 0.42), s.u(0.25, 0.32), s.u(0.25, 0.35)
    s.add(0, _frustum, s.at(0, 0, 0), bottom, top, height)
    s.add(0, _cylinder, s.at(0, 0, height), top, np.full(s.n, 0.002), caps=(False, True))
    s.add_optional(1, _frustum, s.at(0, 0, -0.12), s.u(0.5, 0.6), bottom, np.full(s.n, 0.12))
    s.add(2, _box, s.at(-bottom - 0.01, 0, 0.1), s.at(0.01, 0.04, 0.04))  # a tag at the back


# ---------------------------------------------------------------------------------------------------------
# Vehicles: body 0, wheel 1, cabin / cargo / handlebar 2
# ---------------------------------------------------------------------------------------------------------
def _car(s: _Shapes) -> None:
    length, width, height, wheel = s.u(0.45, 0.6), s.u(0.2, 0.25), s.u(0.1, 0.14), s.u(0.08, 0.11)
    s.add(0, _box, s.at(0, 0, wheel + height), s.at(length, width, height))
    s.add_optional(2, _box, s.at(-s.u(0.05, 0.15), 0, wheel + 2 * height + 0.08), s.at(0.5 * length, 0.9 * width,
                                                                                        np.full(s.n, 0.08)))
    _wheels(s, 1, [length - 0.12, -length + 0.12], width, wheel)


def _truck(s: _Shapes) -> None:
    cargo, width, wheel, cab = s.u(0.45, 0.6), s.u(0.2, 0.25), s.u(0.08, 0.11), s.u(0.12, 0.18)
    s.add(0, _box, s.at(cab, 0, wheel + 0.15), s.at(cab, width, np.full(s.n, 0.15)))
    s.add_optional(2, _box, s.at(-cargo, 0, wheel + 0.22), s.at(cargo, width, np.full(s.n, 0.22)))
    _wheels(s, 1, [cab, -0.5 * cargo, -1.6 * cargo], width, wheel)


def _bus(s: _Shapes) -> None:
    length, width, height, wheel = s.u(0.7, 0.9), s.u(0.2, 0.24), s.u(0.22, 0.3), s.u(0.08, 0.1)
    s.add(0, _box, s.at(0, 0, wheel + height), s.at(length, width, height))
    s.add_optional(2, _box, s.at(0.8 * length, width + 0.01, wheel + 0.8 * height), s.at(0.08, 0.01, 0.7 * height))
    _wheels(s, 1, [0.7 * length, -0.7 * length], width, wheel)


def _motorbike(s: _Shapes) -> None:
    base, wheel, seat = s.u(0.45, 0.55), s.u(0.2, 0.28), s.u(0.1, 0.16)
    for x in (base, -base):
        s.add(1, _cylinder, s.at(x, 0, wheel), wheel, np.full(s.n, 0.03), axis=1)
    s.add(0, _box, s.at(0, 0, 1.3 * wheel), s.at(0.6 * base, 0.08, 0.12))
    s.add(0, _box, s.at(-0.3 * base, 0, 1.3 * wheel + 0.15), s.at(seat, 0.07, 0.03))
    s.add(0, _cylinder, s.at(0.9 * base, 0, 1.5 * wheel), np.full(s.n, 0.02), 0.5 * wheel)  # fork
    s.add_optional(2, _cylinder, s.at(0.8 * base, 0, 2 * wheel + 0.05), np.full(s.n, 0.015), s.u(0.15, 0.22), axis=1)


# ---------------------------------------------------------------------------------------------------------
# Storage and beds: frame 0, shelf / mattress / seat 1, handle / board / arm 2
# ---------------------------------------------------------------------------------------------------------
def _bookshelf(s: _Shapes) -> None:
    depth, width, height = s.u(0.12, 0.18), s.u(0.3, 0.5), s.u(0.8, 1.2)
    for sy in (-1, 1):
        s.add(0, _box, s.at(0, sy * width, height / 2), s.at(depth, 0.015, height / 2))
    s.add(0, _box, s.at(-depth, 0, height / 2), s.at(0.01, width, height / 2))  # back panel
    for level in (0.02, 0.35, 0.65, 0.98):
        s.add(1, _box, s.at(0, 0, level * height), s.at(depth, width, 0.012))
    s.add_optional(2, _box, s.at(0.3 * depth, 0.5 * width, 0.5 * height), s.at(0.6 * depth, 0.12, 0.1))  # books


def _cabinet(s: _Shapes) -> None:
    depth, width, height, leg = s.u(0.2, 0.3), s.u(0.3, 0.45), s.u(0.35, 0.5), s.u(0.05, 0.1)
    s.add(0, _box, s.at(0, 0, leg + height), s.at(depth, width, height))
    _legs(s, 0, depth - 0.03, width - 0.03, leg, np.full(s.n, 0.02))
    for sy in (-1, 1):
        s.add_optional(2, _box, s.at(depth + 0.02, sy * 0.1, leg + 1.2 * height), s.at(0.02, 0.015, 0.06))
    s.add(1, _box, s.at(depth + 0.005, 0, leg + 0.3 * height), s.at(0.005, 0.9 * width, 0.01))  # drawer line


def _bed(s: _Shapes) -> None:
    length, width, head = s.u(0.8, 1.0), s.u(0.4, 0.6), s.u(0.35, 0.5)
    s.add(1, _box, s.at(0, 0, 0.3), s.at(length, width, np.full(s.n, 0.1)))
    s.add(0, _box, s.at(-length - 0.02, 0, head / 2), s.at(0.02, width, head / 2))  # headboard
    s.add_optional(2, _box, s.at(length + 0.02, 0, 0.15), s.at(0.02, width, np.full(s.n, 0.15)))  # footboard
    _legs(s, 0, length - 0.05, width - 0.05, np.full(s.n, 0.2), np.full(s.n, 0.025))
    s.add(1, _box, s.at(-0.8 * length, 0.4 * width, 0.45), s.at(0.12, 0.3 * width, 0.05))  # pillow


def _sofa(s: _Shapes) -> None:
    depth, width, seat_z, back = s.u(0.3, 0.4), s.u(0.7, 0.9), s.u(0.2, 0.3), s.u(0.25, 0.4)
    s.add(1, _box, s.at(0, 0, seat_z), s.at(depth, width, np.full(s.n, 0.1)))
    s.add(0, _box, s.at(-depth + 0.06, 0, seat_z + 0.1 + back / 2), s.at(0.06, width, back / 2))
    for sy in (-1, 1):
        s.add_optional(2, _box, s.at(0, sy * (width + 0.05), seat_z + 0.12), s.at(depth, 0.05, np.full(s.n, 0.12)))
    _legs(s, 0, depth - 0.05, width - 0.05, seat_z - 0.1, np.full(s.n, 0.02))
    s.add(1, _box, s.at(0.1, 0.5 * width, seat_z + 0.15), s.at(0.12, 0.12, 0.05))  # a cushion


# ---------------------------------------------------------------------------------------------------------
# Tall things: body 0, fin / gallery / canopy 1, extra 2
# ---------------------------------------------------------------------------------------------------------
def _rocket(s: _Shapes) -> None:
    radius, height, nose, fin = s.u(0.1, 0.15), s.u(0.8, 1.2), s.u(0.2, 0.3), s.u(0.15, 0.25)
    s.add(0, _cylinder, s.at(0, 0, height / 2), radius, height / 2, caps=(True, False))
    s.add(0, _frustum, s.at(0, 0, height), radius, 0 * radius, nose)
    corners = [np.stack([radius, np.zeros(s.n)], 1), np.stack([radius + fin, np.zeros(s.n)], 1),
               np.stack([radius, 1.5 * fin], 1)]
    for angle in (0, 120, 240):
        s.add(1, _fin, s.at(0, 0, 0), corners, angle)
    s.add_optional(2, _box, s.at(radius + 0.02, 0, 0.6 * height), s.at(0.02, 0.03, 0.1))  # a pod on +x


def _fin(rng, k, center, corners, angle):
    return _mapped(rng, k, center, _about_z(angle), _triangle_xz, *corners, np.full(len(center), 0.008))


def _guitar(s: _Shapes) -> None:
    lower, upper, neck = s.u(0.28, 0.34), s.u(0.2, 0.25), s.u(0.5, 0.7)
    s.add(0, _cylinder, s.at(0, 0, 0), lower, np.full(s.n, 0.05))
    s.add(0, _cylinder, s.at(lower + 0.5 * upper, 0, 0), upper, np.full(s.n, 0.05))
    s.add(1, _box, s.at(lower + upper + neck / 2, 0, 0.03), s.at(neck / 2, 0.03, 0.015))
    s.add_optional(1, _box, s.at(lower + upper + neck + 0.08, 0, 0.03), s.at(0.08, 0.05, 0.012))  # head
    s.add(2, _box, s.at(0.3 * lower, 0.5 * lower, 0.055), s.at(0.1, 0.08, 0.005))  # pick guard on +y


def _lighthouse(s: _Shapes) -> None:
    bottom, top, height = s.u(0.2, 0.3), s.u(0.12, 0.18), s.u(0.9, 1.3)
    s.add(0, _frustum, s.at(0, 0, 0), bottom, top, height)
    s.add(1, _cylinder, s.at(0, 0, height), top + 0.06, np.full(s.n, 0.015))  # gallery
    s.add(1, _cylinder, s.at(0, 0, height + 0.1), 0.8 * top, np.full(s.n, 0.085), caps=(False, False))
    s.add(1, _dome, s.at(0, 0, height + 0.185), s.at(0.8 * top, 0.8 * top, 0.6 * top))
    s.add_optional(2, _box, s.at(bottom, 0, 0.1), s.at(0.02, 0.06, 0.1))  # door on +x


def _umbrella(s: _Shapes) -> None:
    height, canopy, rise = s.u(0.8, 1.1), s.u(0.45, 0.6), s.u(0.15, 0.25)
    s.add(0, _cylinder, s.at(0, 0, height / 2), np.full(s.n, 0.015), height / 2)
    s.add_optional(1, _frustum, s.at(0, 0, height - rise), canopy, np.full(s.n, 0.02), rise)
    hook = s.u(0.06, 0.1)
    s.add(2, _handle, s.at(0, 0, -hook), hook, np.full(s.n, 0.015))  # the hook curls to +x


# ---------------------------------------------------------------------------------------------------------
# The classes: family, local part names, builder. Class index = position in this table.
# ---------------------------------------------------------------------------------------------------------
_CLASSES: tuple[tuple[str, str, tuple[str, ...], Callable[[_Shapes], None]], ...] = (
    ("aircraft", "airliner", ("body", "wing", "tail", "engine"), _airliner),
    ("aircraft", "fighter", ("body", "wing", "tail", "engine"), _fighter),
    ("aircraft", "glider", ("body", "wing", "tail"), _glider),
    ("aircraft", "biplane", ("body", "wing", "tail", "propeller"), _biplane),
    ("seat", "chair", ("back", "seat", "leg"), _chair),
    ("seat", "armchair", ("back", "seat", "leg", "arm"), _armchair),
    ("seat", "stool", ("seat", "leg", "footrest"), _stool),
    ("seat", "bench", ("back", "seat", "leg"), _bench),
    ("table", "table", ("top", "leg", "drawer"), _table),
    ("table", "round_table", ("top", "leg", "drawer"), _round_table),
    ("table", "coffee_table", ("top", "leg", "shelf"), _coffee_table),
    ("table", "desk", ("top", "leg", "pedestal"), _desk),
    ("lamp", "desk_lamp", ("base", "pole", "shade"), _desk_lamp),
    ("lamp", "floor_lamp", ("base", "pole", "shade"), _floor_lamp),
    ("lamp", "table_lamp", ("base", "pole", "shade"), _table_lamp),
    ("lamp", "arc_lamp", ("base", "pole", "shade"), _arc_lamp),
    ("vessel", "mug", ("body", "handle"), _mug),
    ("vessel", "cup", ("body", "handle", "saucer"), _cup),
    ("vessel", "pitcher", ("body", "handle", "spout"), _pitcher),
    ("vessel", "bottle", ("body", "neck", "label"), _bottle),
    ("tool", "knife", ("blade", "handle", "bolster"), _knife),
    ("tool", "sword", ("blade", "handle", "guard"), _sword),
    ("tool", "axe", ("head", "handle", "spike"), _axe),
    ("tool", "hammer", ("head", "handle", "claw"), _hammer),
    ("headwear", "cap", ("crown", "visor", "button"), _cap),
    ("headwear", "hat", ("crown", "brim", "feather"), _hat),
    ("headwear", "helmet", ("shell", "guard", "strap"), _helmet),
    ("headwear", "bucket_hat", ("crown", "brim", "tag"), _bucket_hat),
    ("vehicle", "car", ("body", "wheel", "cabin"), _car),
    ("vehicle", "truck", ("cab", "wheel", "cargo"), _truck),
    ("vehicle", "bus", ("body", "wheel", "door"), _bus),
    ("vehicle", "motorbike", ("body", "wheel", "handlebar"), _motorbike),
    ("storage", "bookshelf", ("frame", "shelf", "books"), _bookshelf),
    ("storage", "cabinet", ("body", "drawer", "handle"), _cabinet),
    ("storage", "bed", ("frame", "mattress", "footboard"), _bed),
    ("storage", "sofa", ("frame", "seat", "arm"), _sofa),
    ("tall", "rocket", ("body", "fin", "pod"), _rocket),
    ("tall", "guitar", ("body", "neck", "guard"), _guitar),
    ("tall", "lighthouse", ("tower", "lantern", "door"), _lighthouse),
    ("tall", "umbrella", ("shaft", "canopy", "hook"), _umbrella),
)
SHAPES40_CLASSES: tuple[str, ...] = tuple(name for _, name, _, _ in _CLASSES)
SHAPES40_FAMILIES: tuple[str, ...] = tuple(family for family, _, _, _ in _CLASSES)
SHAPES40_PART_NAMES: dict[str, tuple[str, ...]] = {name: parts for _, name, parts, _ in _CLASSES}
_starts = np.cumsum([0] + [len(parts) for _, _, parts, _ in _CLASSES])
SHAPES40_CLASS_PARTS: tuple[tuple[int, ...], ...] = tuple(
    tuple(range(int(a), int(b))) for a, b in zip(_starts[:-1], _starts[1:], strict=True)
)
SHAPES40_NUM_PARTS = int(_starts[-1])


def generate_synthetic_shapes40(
    num_shapes: int,
    num_points: int = 1024,
    seed: int | np.random.Generator = 0,
    noise_std: float = 0.03,
    part_dropout: float = 0.3,
    sampling_bias: float = 3.0,
    categories: np.ndarray | None = None,
    scale_jitter: float = SCALE_JITTER,
) -> dict[str, np.ndarray]:
    """Generate ``num_shapes`` clouds of the 40 classes, balanced (they differ by at most one), in random order.

    Args:
        num_shapes: number of clouds.
        num_points: points per cloud.
        seed: seed or NumPy generator; the output depends only on it and the other arguments.
        noise_std: Gaussian noise added after scaling into the unit sphere.
        part_dropout: probability that an optional part is left out of a shape (per part and shape).
        sampling_bias: the largest density strength ``s`` (density ∝ exp(s · <x, d>), x in the unit sphere).
        categories: the class of each shape (``num_shapes`` indices into :data:`SHAPES40_CLASSES`) instead of
            balanced random classes.
        scale_jitter: each shape is scaled by a factor drawn from ``[1 - scale_jitter, 1 + scale_jitter]`` per axis.

    Returns:
        ``points`` (N, P, 3) float32 in canonical pose (z up, +x front, centred, inside the unit sphere up to
        noise), ``categories`` (N,) int64 (index into :data:`SHAPES40_CLASSES`), ``part_labels`` (N, P) int64
        (global part ids, :data:`SHAPES40_CLASS_PARTS`).
    """
    check_int("num_shapes", num_shapes, low=0)
    check_int("num_points", num_points, low=1)
    check_number("noise_std", noise_std, low=0)
    check_number("part_dropout", part_dropout, low=0, high=0.99)
    check_number("sampling_bias", sampling_bias, low=0)
    check_number("scale_jitter", scale_jitter, low=0, high=0.9)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if categories is None:
        categories = rng.permutation(np.arange(num_shapes) % len(_CLASSES)).astype(np.int64)
    else:
        categories = np.asarray(categories, dtype=np.int64)
        if categories.shape != (num_shapes,) or (num_shapes and not 0 <= categories.min() <= categories.max() < 40):
            raise ValueError(f"categories must be {num_shapes} class indices in 0..39; got shape {categories.shape}")
    points = np.zeros((num_shapes, num_points, 3))
    part_labels = np.zeros((num_shapes, num_points), dtype=np.int64)
    candidates = CANDIDATES_PER_POINT * num_points
    for c, (_, _, parts, build) in enumerate(_CLASSES):
        index = np.flatnonzero(categories == c)
        n = len(index)
        if n == 0:
            continue
        shapes = _Shapes(rng, n, part_dropout)
        build(shapes)
        cloud, local = _sample_surface(rng, shapes.prims, len(parts), candidates)
        cloud = cloud * rng.uniform(1 - scale_jitter, 1 + scale_jitter, (n, 1, 3))
        cloud -= cloud.mean(axis=1, keepdims=True)
        cloud /= np.linalg.norm(cloud, axis=-1).max(axis=1)[:, None, None].clip(min=1e-12)
        # Keep num_points of the candidates with weights exp(s <x, d>): Gumbel top-k draws without replacement.
        direction = rng.normal(size=(n, 3))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        strength = rng.uniform(0, sampling_bias, (n, 1))
        keys = strength * np.einsum("npi,ni->np", cloud, direction) - np.log(-np.log(rng.random((n, candidates))))
        chosen = np.argsort(-keys, axis=1)[:, :num_points]
        points[index] = np.take_along_axis(cloud, chosen[..., None], axis=1)
        part_labels[index] = np.asarray(SHAPES40_CLASS_PARTS[c])[np.take_along_axis(local, chosen, axis=1)]
    points -= points.mean(axis=1, keepdims=True)
    points /= np.linalg.norm(points, axis=-1).max(axis=1)[:, None, None].clip(min=1e-12)
    points += rng.normal(scale=noise_std, size=points.shape)
    return {"points": points.astype(np.float32), "categories": categories, "part_labels": part_labels}


class SyntheticShapes40DataModule(SyntheticShapesDataModule):
    """The 40-class generated shapes (see the module docstring) for classification; no files.

    Batches ``(points (B, P, 3) float32, label (B,) int64)``, as
    :class:`~canonical_network.data.modelnet.ModelNet40DataModule`'s. Each split is generated from its own
    stream of ``data_seed``; the ``z`` protocol rotates about the up axis z.

    Args:
        task: ``classification`` (the only one: part labels are not served).
        num_train, num_val, num_test: clouds per split.
        num_points: points per cloud.
        noise_std, part_dropout, sampling_bias, scale_jitter: the difficulty (:func:`generate_synthetic_shapes40`).
        rotation: train/test rotation protocol (``z/z``, ``z/so3``, ``so3/so3``, ...).
        data_seed: seed of the shapes and of the fixed evaluation rotations.
        batch_size, num_workers, pin_memory: DataLoader arguments.
    """

    # What reports, tables and config checks know of this data (read from the source by data/catalog.py)
    config_name = "synthetic_shapes40"  # configs/data/<config_name>.yaml
    display_name = "synthetic_shapes40 (40 classes, not the paper's data)"
    paper_data = False  # the paper's numbers were measured on (a subset of) this data
    tasks = ("PointCloudClassificationTask",)  # the task classes (model._target_) that read it

    NUM_CATEGORIES = len(SHAPES40_CLASSES)
    NUM_PARTS = SHAPES40_NUM_PARTS
    CATEGORY_PARTS = SHAPES40_CLASS_PARTS

    def __init__(
        self,
        task: str = "classification",
        num_train: int = 4000,
        num_val: int = 800,
        num_test: int = 800,
        num_points: int = 1024,
        noise_std: float = 0.03,
        part_dropout: float = 0.3,
        sampling_bias: float = 3.0,
        scale_jitter: float = SCALE_JITTER,
        rotation: str = "z/z",
        data_seed: int = 0,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        check_choice("data.task", task, ("classification",))
        super().__init__(task, num_train, num_val, num_test, num_points, noise_std, rotation, data_seed,
                         batch_size, num_workers, pin_memory)
        self.part_dropout = float(check_number("data.part_dropout", part_dropout, low=0, high=0.99))
        self.sampling_bias = float(check_number("data.sampling_bias", sampling_bias, low=0))
        self.scale_jitter = float(check_number("data.scale_jitter", scale_jitter, low=0, high=0.9))

    def generate(self, size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return generate_synthetic_shapes40(size, self.num_points, rng, self.noise_std, self.part_dropout,
                                           self.sampling_bias, scale_jitter=self.scale_jitter)
