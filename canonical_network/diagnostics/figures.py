"""The figures of a diagnosis (PNG, matplotlib's Agg backend: no display needed).

* :func:`canonical_pairs` — one row per input, worst exact-equivariance error first, four panels: the input
  ``x``, its canonical version ``h(x)⁻¹·x``, ``g·x`` for the element ``g`` with that input's worst error, and
  ``h(g·x)⁻¹·g·x``. For an equivariant canonicalizer the second and fourth panels match. Images are drawn
  as they are; point clouds and particle systems as 2-D projections from one fixed view (elevation 20°,
  azimuth 30°, z up), points coloured by height, particles by charge with their velocities as arrows.
* :func:`pose_histogram` — the histogram of ``pose`` (chosen elements, or rotation angles).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from canonical_network.diagnostics.measures import Diagnosis
from canonical_network.diagnostics.symmetries import Inputs, Symmetry
from canonical_network.groups.image import element_angles_deg, planar_group

#: the fixed view of 3-D inputs (degrees)
VIEW_ELEVATION_DEG, VIEW_AZIMUTH_DEG = 20.0, 30.0


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def project(points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Screen coordinates ``(u, v)`` of points ``(P, 3)`` seen from the fixed view (z up)."""
    azimuth, elevation = math.radians(VIEW_AZIMUTH_DEG), math.radians(VIEW_ELEVATION_DEG)
    x, y, z = points.double().unbind(-1)
    u = math.cos(azimuth) * x - math.sin(azimuth) * y
    depth = math.sin(azimuth) * x + math.cos(azimuth) * y
    v = math.cos(elevation) * z - math.sin(elevation) * depth
    return u, v


def _draw(ax, family: str, sample: Inputs) -> None:
    """One input sample (the tensors of one batch index) in one panel."""
    first = sample[0].detach().cpu()
    if family == "images":
        ax.imshow(first.float().clamp(0, 1).permute(1, 2, 0).squeeze(-1), cmap="gray", vmin=0, vmax=1)
    elif family == "nbody":
        loc, vel, charges = (t.detach().cpu().double() for t in sample)
        u, v = project(loc)
        du, dv = project(vel)
        colours = ["tab:red" if q > 0 else "tab:blue" for q in charges.flatten().tolist()]
        ax.scatter(u, v, c=colours, s=30)
        ax.quiver(u, v, du, dv, color=colours, angles="xy", scale_units="xy", scale=1.0, width=0.006)
        # quiver does not enter the autoscaled limits: frame the particles and the arrow tips
        us, vs = torch.cat([u, u + du]), torch.cat([v, v + dv])
        half = 0.6 * max(float(us.max() - us.min()), float(vs.max() - vs.min()), 1e-9)
        centre_u, centre_v = float(us.max() + us.min()) / 2, float(vs.max() + vs.min()) / 2
        ax.set_xlim(centre_u - half, centre_u + half)
        ax.set_ylim(centre_v - half, centre_v + half)
        ax.set_aspect("equal")
    else:
        u, v = project(first)
        ax.scatter(u, v, c=first[:, 2].double(), cmap="viridis", s=3)
        ax.set_aspect("equal", adjustable="datalim")
    ax.set_xticks([])
    ax.set_yticks([])


def canonical_pairs(model, symmetry: Symmetry, diagnosis: Diagnosis, path: Path, num_examples: int = 8) -> Path:
    """Inputs beside their canonical versions, worst exact-equivariance examples first (module docstring)."""
    plt = _pyplot()
    errors = diagnosis.exact_errors
    count = min(num_examples, len(diagnosis.inputs[0]))
    if errors is None:
        order, worst = torch.arange(count), None
    else:
        per_input, worst = errors.max(dim=0)
        order = per_input.argsort(descending=True)[:count]
    rows = []
    for i in order.tolist():
        x = tuple(t[i] for t in diagnosis.inputs)
        canonical = tuple(t[i] for t in diagnosis.canonical)
        if worst is None:
            rows.append((x, canonical, None, None, ""))
            continue
        g, moved = diagnosis.exact[int(worst[i])]
        rows.append((x, canonical, tuple(t[i] for t in moved), None,
                     f"{g.label}: rel. error {float(errors[int(worst[i]), i]):.2e}"))
    if worst is not None:  # canonicalize the chosen g·x together (eval mode: batch-independent)
        batch = tuple(torch.stack([row[2][k] for row in rows]) for k in range(len(diagnosis.inputs)))
        with torch.no_grad():
            canonical_moved, _ = model.network.canonicalize(*batch)
        rows = [(x, c, m, tuple(t[j] for t in canonical_moved), note) for j, (x, c, m, _, note) in enumerate(rows)]
    columns = ["input x", "canonical h(x)⁻¹·x", "worst g·x", "canonical of g·x"]
    width = 2 if worst is None else 4
    size = 1.6 if symmetry.family == "images" else 2.4
    fig, axes = plt.subplots(len(rows), width, figsize=(size * width, size * len(rows) + 0.4), squeeze=False)
    for r, (x, canonical, moved, canonical_moved, note) in enumerate(rows):
        for c, sample in enumerate((x, canonical, moved, canonical_moved)[:width]):
            _draw(axes[r, c], symmetry.family, sample)
            if r == 0:
                axes[r, c].set_title(columns[c], fontsize=8)
        axes[r, 0].set_ylabel(note, fontsize=6)
    fig.suptitle(f"{symmetry.family}: inputs and canonical versions, worst equivariance first", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))  # room for the title
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pose_histogram(pose: dict, path: Path) -> Path:
    """A bar chart of ``pose["histogram"]``: per element index (finite groups) or per angle bin."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.8))
    counts = pose["histogram"]
    if pose["kind"] == "finite":
        ax.bar(range(len(counts)), counts, color="tab:blue")
        ax.set_xlabel(f"chosen element of {pose['group']} (index, escnn order)")
        finite = planar_group(pose["group"])
        if finite is not None and len(counts) <= 16:
            angles, reflect = element_angles_deg(*finite)
            labels = [("flip, " if r else "") + f"{a:g}°"
                      for a, r in zip(angles.tolist(), reflect.tolist(), strict=True)]
            ax.set_xticks(range(len(counts)), labels, fontsize=7)
        ambiguity = pose.get("ambiguity_rate")
        extra = "" if ambiguity is None else f", ambiguous {100 * ambiguity:.0f} % (margin {pose['margin']:g})"
    else:
        edges = pose["bin_edges_deg"]
        ax.bar(edges[:-1], counts, width=edges[1] - edges[0], align="edge", color="tab:blue")
        ax.set_xlabel(f"{pose['quantity']}")
        extra = f", reflections {100 * pose['reflection_rate']:.0f} %"
    ax.set_ylabel("inputs")
    ax.set_title(f"h(x) over the inputs: entropy {pose['entropy_bits']:.2f} of "
                 f"{pose['max_entropy_bits']:.2f} bits{extra}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
