"""k-nearest-neighbour graphs and DGCNN edge features in plain torch.

PyG's ``knn``/``knn_graph`` need the compiled extensions ``pyg-lib`` or ``torch-cluster``, which the package
does not depend on (they could not be installed where it was developed: ``docs/measurements.md``), so the
graph is built densely: a batched ``torch.cdist`` and ``topk``. That is ``O(B N²)`` memory, fine for the
point clouds of the paper (N ≤ 2048).

Layouts: ordinary features are channel-first ``(B, C, N)`` (DGCNN's layout); Vector Neuron features are
``(B, C, 3, N)``. Distances between VN features use all ``3C`` coordinates, which is O(3)-invariant, so the
graph built on rotated features is the same graph.
"""

from __future__ import annotations

import torch

#: ``torch.cdist`` modes. The matmul form (``‖a‖² + ‖b‖² − 2 a·b``) is fast but loses precision through
#: cancellation; the direct form is exact up to rounding, which matters where the graph must be the same
#: for a rotated input (canonicalizers). Default: let torch choose (matmul for large sets).
FAST = "use_mm_for_euclid_dist_if_necessary"
EXACT = "donot_use_mm_for_euclid_dist"


def _flatten_points(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, N)`` or VN ``(B, C, 3, N)`` → ``(B, N, D)`` point-major features for distances/gathers."""
    if x.dim() == 4:
        if x.shape[2] != 3:
            raise ValueError(f"VN features must have shape (B, C, 3, N), got {tuple(x.shape)}")
        x = x.reshape(x.shape[0], -1, x.shape[-1])
    elif x.dim() != 3:
        raise ValueError(f"features must have shape (B, C, N) or (B, C, 3, N), got {tuple(x.shape)}")
    return x.transpose(1, 2)


def knn(x: torch.Tensor, k: int, *, include_self: bool = True, compute_mode: str = FAST) -> torch.Tensor:
    """Indices of the ``k`` nearest neighbours of every point, nearest first.

    Args:
        x: ``(B, C, N)`` features (``C = 3`` for coordinates) or VN features ``(B, C, 3, N)``.
        k: number of neighbours, ``1 ≤ k ≤ N`` (``≤ N − 1`` without self).
        include_self: count each point as its own nearest neighbour (distance 0), as DGCNN does.
        compute_mode: :data:`FAST` or :data:`EXACT` (see above).

    Returns:
        ``(B, N, k)`` int64. Permuting the points permutes rows and relabels entries accordingly (the
        neighbour *sets* are permutation-equivariant); among exactly equidistant candidates at the k-th
        place (duplicate points, symmetric shapes) the choice is arbitrary.
    """
    points = _flatten_points(x)
    n = points.shape[1]
    max_k = n if include_self else n - 1
    if not 1 <= k <= max_k:
        raise ValueError(f"k must lie in [1, {max_k}] for {n} points (include_self={include_self}), got {k}")
    if compute_mode not in (FAST, EXACT):
        raise ValueError(f"compute_mode must be one of {[FAST, EXACT]}, got {compute_mode!r}")
    dist = torch.cdist(points, points, compute_mode=compute_mode)  # (B, N, N)
    if not include_self:
        dist = dist.masked_fill(torch.eye(n, dtype=torch.bool, device=dist.device), float("inf"))
    return dist.topk(k, dim=-1, largest=False, sorted=True).indices


def gather_neighbours(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Features of the neighbours ``idx`` ``(B, N, k)``.

    ``(B, C, N)`` → ``(B, C, N, k)``; VN ``(B, C, 3, N)`` → ``(B, C, 3, N, k)``.
    """
    points = _flatten_points(x)  # (B, N, D)
    batch = torch.arange(points.shape[0], device=points.device).view(-1, 1, 1)
    neighbours = points[batch, idx]  # (B, N, k, D)
    neighbours = neighbours.permute(0, 3, 1, 2)  # (B, D, N, k)
    if x.dim() == 4:
        neighbours = neighbours.reshape(x.shape[0], x.shape[1], 3, *idx.shape[1:])
    return neighbours


def graph_feature(
    x: torch.Tensor,
    k: int = 20,
    idx: torch.Tensor | None = None,
    *,
    cross: bool = False,
    include_self: bool = True,
    compute_mode: str = FAST,
) -> torch.Tensor:
    """DGCNN edge features ``[x_j − x_i, x_i]`` over the k nearest neighbours ``j`` of each point ``i``.

    Args:
        x: ``(B, C, N)`` or VN ``(B, C, 3, N)``.
        k: neighbours (DGCNN's default is 20, Wang et al. 2019); ignored when ``idx`` is given.
        idx: precomputed neighbours ``(B, N, k)`` (e.g. from input coordinates: a static graph).
        cross: VN only — append ``x_j × x_i`` per channel. It adds a direction that ``x_j − x_i`` and ``x_i``
            do not span (the paper's point-cloud canonicalizer uses it) but is a pseudo-vector: it flips sign
            under reflections, so features stay SO(3)-equivariant only.

    Returns:
        ``(B, 2C, N, k)`` for ordinary features; ``(B, 2C, 3, N, k)`` for VN features, ``(B, 3C, 3, N, k)``
        with ``cross``. Channel order: differences, centres, (cross products). Equivariance: translation
        acts on ``x_i`` only; O(3) for VN features (SO(3) with ``cross``); permutations of the points.
    """
    if cross and x.dim() != 4:
        raise ValueError("cross=True needs VN features of shape (B, C, 3, N)")
    if idx is None:
        idx = knn(x, k, include_self=include_self, compute_mode=compute_mode)
    neighbours = gather_neighbours(x, idx)  # (B, C, [3,] N, k)
    centres = x.unsqueeze(-1).expand_as(neighbours)
    parts = [neighbours - centres, centres]
    if cross:
        parts.append(torch.linalg.cross(neighbours, centres, dim=2))
    return torch.cat(parts, dim=1)


__all__ = ["EXACT", "FAST", "gather_neighbours", "graph_feature", "knn"]
