"""k-nearest-neighbour graphs and DGCNN edge features in plain torch.

PyG's ``knn``/``knn_graph`` need the compiled extensions ``pyg-lib`` or ``torch-cluster``, which the package
does not depend on (they could not be installed where it was developed: ``docs/measurements.md``), so the
graph is built in torch, in one of two ways:

* dense: a batched ``torch.cdist`` and ``topk``, ``O(B N²)`` time and memory (feature-space graphs, such as
  DGCNN's, and small or float64 point sets);
* pruned (:func:`knn` with ``compute_mode=EXACT`` on float32 3-D coordinates of at least
  :data:`PRUNED_MIN_POINTS` points on the CPU; the canonicalizers' input graphs): the same neighbours without
  the ``N × N`` matrix. Points are split into k-d leaves; each leaf compares its points with the points of
  the :data:`LEAVES_SEARCHED` leaves nearest to it only, first through cheap squared distances from one
  matrix product, then with the exact distances of the dense search (the same float32 values; the tests
  check it), and every point whose result could differ from the dense one (a leaf not searched that comes
  closer than its k-th candidate, or a k-th and (k+1)-th candidate closer than the matrix product's
  rounding) is searched again, exactly, over its candidates or all points. Its result is the dense
  search's: same neighbours, nearest first, except that exactly equidistant points are ordered by index.
  What it saves: ``docs/measurements.md`` (point-cloud canonicalizers against PointNet at 1,024 points).

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
#: the pruned search: points per k-d leaf (at least), leaves searched per leaf (its own included), and the
#: smallest point set it is used for (below, the dense search is as fast)
LEAF_SIZE = 16
LEAVES_SEARCHED = 12
PRUNED_MIN_POINTS = 512
#: unit roundoff of float32
_ROUNDOFF = 2.0**-24


def _flatten_points(x: torch.Tensor) -> torch.Tensor:
    """``(B, C, N)`` or VN ``(B, C, 3, N)`` → ``(B, N, D)`` point-major features for distances/gathers."""
    if x.dim() == 4:
        if x.shape[2] != 3:
            raise ValueError(f"VN features must have shape (B, C, 3, N), got {tuple(x.shape)}")
        x = x.reshape(x.shape[0], -1, x.shape[-1])
    elif x.dim() != 3:
        raise ValueError(f"features must have shape (B, C, N) or (B, C, 3, N), got {tuple(x.shape)}")
    return x.transpose(1, 2)


def knn(x: torch.Tensor, k: int, *, include_self: bool = True, compute_mode: str = FAST,
        ordered: bool = True) -> torch.Tensor:
    """Indices of the ``k`` nearest neighbours of every point, nearest first (``ordered=False``: the same
    neighbour set in an unspecified order, for callers that only sum over it; cheaper).

    Args:
        x: ``(B, C, N)`` features (``C = 3`` for coordinates) or VN features ``(B, C, 3, N)``.
        k: number of neighbours, ``1 ≤ k ≤ N`` (``≤ N − 1`` without self).
        include_self: count each point as its own nearest neighbour (distance 0), as DGCNN does.
        compute_mode: :data:`FAST` or :data:`EXACT` (see above).
        ordered: sort each row nearest first (default). ``False`` skips that sort, and in the pruned search
            the exact distances computed only for it; each row holds the same set of indices.

    Returns:
        ``(B, N, k)`` int64. Permuting the points permutes rows and relabels entries accordingly (the
        neighbour *sets* are permutation-equivariant). Exactly equidistant candidates (duplicate points,
        symmetric shapes): the pruned search (module docstring) orders them by index, the dense one as
        ``topk`` leaves them; both are deterministic, and on inputs without such ties they agree.
    """
    points = _flatten_points(x)
    n = points.shape[1]
    max_k = n if include_self else n - 1
    if not 1 <= k <= max_k:
        raise ValueError(f"k must lie in [1, {max_k}] for {n} points (include_self={include_self}), got {k}")
    if compute_mode not in (FAST, EXACT):
        raise ValueError(f"compute_mode must be one of {[FAST, EXACT]}, got {compute_mode!r}")
    if compute_mode == EXACT and _pruned_applies(points, k):
        with torch.no_grad():
            return _knn_pruned(points, k, include_self, sort_rows=ordered)
    dist = torch.cdist(points, points, compute_mode=compute_mode)  # (B, N, N)
    if not include_self:
        dist = dist.masked_fill(torch.eye(n, dtype=torch.bool, device=dist.device), float("inf"))
    return dist.topk(k, dim=-1, largest=False, sorted=ordered).indices


def _leaf_levels(n: int, leaf_size: int) -> int:
    """How many times ``n`` points halve into equal k-d leaves of at least ``leaf_size`` points."""
    levels = 0
    while n % 2 ** (levels + 1) == 0 and n >> (levels + 1) >= leaf_size:
        levels += 1
    return levels


def _pruned_applies(points: torch.Tensor, k: int) -> bool:
    """Whether :func:`knn` takes the pruned search for point-major ``(B, N, D)`` features."""
    b, n, d = points.shape
    if points.dtype != torch.float32 or points.device.type != "cpu":
        return False
    if d != 3 or n < PRUNED_MIN_POINTS:
        return False
    levels = _leaf_levels(n, LEAF_SIZE)
    return 2**levels > LEAVES_SEARCHED and k + 1 <= LEAVES_SEARCHED * (n >> levels)


def _distance_keys(dist: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """int64 keys ordering by float32 distance ``dist`` (≥ 0: its bits order like its values), then by the
    point index: no two keys are equal, so ``topk``/``sort`` on them are deterministic."""
    return (dist.view(torch.int32).to(torch.int64) << 32) | index


def _exact_rows(
    points: torch.Tensor,
    batch: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    labels: torch.Tensor,
    k: int,
    include_self: bool,
) -> torch.Tensor:
    """The ``k`` nearest of the candidates ``cols`` ``(R, C)`` of the points ``rows`` ``(R,)`` of clouds
    ``batch`` ``(R,)``, by exact distance then label: ``(R, k)`` labels (``labels`` ``(R, C)``: the candidates'
    indices in the caller's numbering)."""
    centre = points[batch, rows].unsqueeze(1)
    dist = torch.linalg.vector_norm(centre - points[batch.unsqueeze(1), cols], dim=-1)  # (R, C)
    if not include_self:
        dist = dist.masked_fill(cols == rows.unsqueeze(1), float("inf"))
    keys = _distance_keys(dist, labels).topk(k, dim=-1, largest=False, sorted=True).values
    return keys & 0xFFFFFFFF


def _sort_keys(x: torch.Tensor) -> torch.Tensor:
    """int32 keys that order like the float32 values ``x`` (not NaN): the bit patterns of the non-negative
    values, those of the negative ones with all but the sign bit flipped. torch's CPU sort was cheaper
    on them where measured. (-0.0 comes just before +0.0.)"""
    bits = x.view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _kd_order(points: torch.Tensor, levels: int) -> torch.Tensor:
    """``(B, N)``: a permutation per cloud that makes ``2**levels`` k-d leaves contiguous (each split halves
    a part along its widest axis)."""
    b, n, d = points.shape
    perm = torch.arange(n, device=points.device).expand(b, n)
    # the coordinates in the current order, coordinate-major (B, D, N): each level permutes them along with
    # perm, and reads the widest axis of each part from contiguous planes
    current = points.transpose(1, 2).contiguous()
    for level in range(levels):
        parts, size = 2**level, n >> level
        part = current.view(b, d, parts, size)
        axis = (part.amax(3) - part.amin(3)).argmax(1)  # (B, parts)
        coordinate = torch.gather(part, 1, axis.view(b, 1, parts, 1).expand(b, 1, parts, size)).view(b, parts, size)
        order = _sort_keys(coordinate).argsort(dim=-1, stable=True)
        perm = torch.gather(perm.reshape(b, parts, size), 2, order).reshape(b, n)
        current = torch.gather(part, 3, order.unsqueeze(1).expand(b, d, parts, size)).view(b, d, n)
    return perm


def _knn_pruned(
    points: torch.Tensor,
    k: int,
    include_self: bool = True,
    leaf_size: int = LEAF_SIZE,
    leaves_searched: int = LEAVES_SEARCHED,
    sort_rows: bool = True,
) -> torch.Tensor:
    """The pruned exact search (module docstring) on float32 point-major ``(B, N, D)``: ``(B, N, k)``
    (``sort_rows=False``: the same sets, each row in an unspecified order).

    Why it is exact. ``approx`` (one matrix product, ``‖x‖² + ‖y‖² − 2⟨x, y⟩``) differs from the squared
    float32 distance of the dense search by at most ``delta`` = 16 (D + 3) u s² (u: float32 roundoff; s: the
    largest norm in the cloud; the product's error is ≤ (D + 2) u (‖x‖ + ‖y‖)² ≤ 4 (D + 2) u s², the squared
    rounded distance's ≤ 4 (D + 3) u s²). A point's result is taken from ``approx`` only when its k-th and
    (k+1)-th candidates are more than 4 ``delta`` apart (the k nearest candidates are then the same set under
    either distance) and every leaf not searched lies farther than the k-th candidate plus 4 ``delta`` (its
    box's distance bounds all its points'); the order within the set is then sorted by exact distance. Any
    other point is redone with exact distances: over its candidates when only the first test failed, over
    all points otherwise. The covering test first uses the distances between boxes (a leaf's box lies no
    farther from another box than any of its points does), and computes a point's own distances to the boxes
    only where that weaker bound does not already pass: the same test, at a fraction of the cost.
    """
    b, n, d = points.shape
    device = points.device
    levels = _leaf_levels(n, leaf_size)
    leaves, size = 2**levels, n >> levels
    searched = min(leaves_searched, leaves)
    width = searched * size  # candidates per point
    perm = _kd_order(points, levels)  # k-d position → index
    ordered = torch.gather(points, 1, perm.unsqueeze(-1).expand(b, n, d))
    boxes = ordered.view(b, leaves, size, d)
    low, high = boxes.amin(2), boxes.amax(2)  # (B, leaves, D)

    low_planes, high_planes = low.transpose(1, 2).unsqueeze(2), high.transpose(1, 2).unsqueeze(2)  # (B, D, 1, L)

    def to_boxes(x: torch.Tensor) -> torch.Tensor:
        """Squared distances of points ``(B, M, D)`` to every leaf's box: ``(B, M, leaves)``, one coordinate
        plane at a time (the same values as over a ``(B, M, leaves, D)`` tensor, in less than half the time:
        contiguous ``(B, M, leaves)`` planes)."""
        planes = x.transpose(1, 2).unsqueeze(-1)  # (B, D, M, 1)
        total = torch.zeros(x.shape[0], x.shape[1], leaves, dtype=x.dtype, device=x.device)
        for axis in range(d):
            below, above = low_planes[:, axis] - planes[:, axis], planes[:, axis] - high_planes[:, axis]
            total += torch.maximum(below, above).clamp_min_(0).square_()
        return total

    # The leaves each leaf searches: its own first, then those nearest to its centroid.
    own = torch.eye(leaves, dtype=torch.bool, device=device)
    nearest = to_boxes(boxes.mean(2)).masked_fill_(own, -1.0)
    searched_leaves = nearest.topk(searched, dim=-1, largest=False, sorted=True).indices  # (B, leaves, S)
    is_searched = torch.zeros(b, leaves, leaves, dtype=torch.bool, device=device)
    is_searched.scatter_(2, searched_leaves, True)

    squares = ordered.square().sum(-1)  # (B, N)
    delta = 16 * (d + 3) * _ROUNDOFF * squares.amax(1, keepdim=True)  # (B, 1)
    ones = torch.ones_like(squares)
    left = torch.cat([ordered, squares.unsqueeze(-1), ones.unsqueeze(-1)], -1)
    left = left.view(b * leaves, size, d + 2)
    right = torch.cat([-2 * ordered, ones.unsqueeze(-1), squares.unsqueeze(-1)], -1).view(b, leaves, size, d + 2)
    # right[b, a] = the points of the leaves that leaf a searches, in that order: one gather of whole leaves
    # (b, leaves, searched, size, d + 2), read transposed by bmm
    right = right[torch.arange(b, device=device).view(b, 1, 1), searched_leaves].view(b * leaves, width, d + 2)
    approx = torch.bmm(left, right.transpose(1, 2)).view(b, n, width)
    if not include_self:  # a point is its own leaf's (the first searched) point at its own place
        diagonal = torch.arange(size, device=device)
        approx.view(b, leaves, size, width)[:, :, diagonal, diagonal] = float("inf")
    # the k + 1 nearest candidates, unsorted (sorting them costs more than the two largest): the (k+1)-th is
    # the largest of them, the k-th the second largest, and the k nearest are the rest. Selected on the
    # int32 bit patterns of the clamped values: those of floats >= +0 order as the floats do, and torch's CPU
    # topk was cheaper on int32 than on float32 where measured (docs/measurements.md). Clamping
    # at 0 moves no value farther from its squared distance (>= 0), so the bound ``delta`` holds; +0.0 added
    # turns -0.0 (bits 0x80000000, the smallest int32) into +0.0.
    keys = approx.clamp_min_(0.0).add_(0.0).view(torch.int32)
    values, slots = keys.topk(k + 1, dim=-1, largest=False, sorted=False)
    values = values.view(torch.float32)
    # the two largest of them by two max reductions (cheaper than topk(2) on these short rows)
    farthest, last = values.max(dim=-1, keepdim=True)  # the (k+1)-th and its place
    kth = values.scatter(-1, last, float("-inf")).amax(-1)
    bound = kth + 4 * delta  # (B, N): no point of a leaf not searched may come closer than this
    separated = farthest.squeeze(-1) - kth > 4 * delta
    # drop the (k+1)-th: the last slot takes its place (a no-op when it is the last)
    slots = slots.scatter(-1, last, slots[..., k:])[..., :k]

    # squared distance of each leaf's box to the nearest box its leaf does not search: a lower bound on
    # each of its points' distances to those boxes (B, leaves), then the points' own where it does not pass
    gaps = torch.zeros(b, leaves, leaves, dtype=points.dtype, device=device)
    for axis in range(d):
        low_a, high_a = low[:, :, axis], high[:, :, axis]
        gaps += torch.maximum(low_a.unsqueeze(1) - high_a.unsqueeze(2),
                              low_a.unsqueeze(2) - high_a.unsqueeze(1)).clamp_min_(0).square_()
    box_bound = gaps.masked_fill_(is_searched, float("inf")).amin(-1)  # (B, leaves)
    covered = box_bound.repeat_interleave(size, dim=1) > bound  # (B, N)
    unsure = (~covered).nonzero()
    if unsure.numel():
        ub, ui = unsure.unbind(1)
        planes = ordered[ub, ui]  # (U, D)
        to_box = torch.zeros(ub.shape[0], leaves, dtype=points.dtype, device=device)
        for axis in range(d):
            coordinate = planes[:, axis].unsqueeze(1)
            to_box += torch.maximum(low[ub, :, axis] - coordinate, coordinate - high[ub, :, axis]).clamp_min_(0).square_()
        to_box.masked_fill_(is_searched[ub, ui // size], float("inf"))
        covered[ub, ui] = to_box.amin(-1) > bound[ub, ui]

    # the chosen candidates' k-d positions: candidate slot s of a point of leaf a is point s % size of the
    # (s // size)-th leaf that a searches, read from one (B, leaves, width) table (a gather per leaf)
    positions = (searched_leaves.unsqueeze(-1) * size + torch.arange(size, device=device)).view(b, leaves, width)
    chosen = positions.gather(2, slots.reshape(b, leaves, size * k)).view(b, n, k)
    labels = perm.gather(1, chosen.view(b, n * k)).view(b, n, k)  # the chosen points' indices
    row_leaves = searched_leaves.repeat_interleave(size, dim=1)  # (B, N, S)
    if sort_rows:
        batch = torch.arange(b, device=device).view(b, 1, 1)
        dist = torch.linalg.vector_norm(ordered.unsqueeze(2) - ordered[batch, chosen], dim=-1)
        result = _distance_keys(dist, labels).sort(dim=-1).values & 0xFFFFFFFF
    else:
        result = labels

    redo = (covered & ~separated).nonzero()
    if redo.numel():
        rb, ri = redo.unbind(1)
        cols = row_leaves[rb, ri].unsqueeze(-1) * size + torch.arange(size, device=device)
        cols = cols.view(-1, width)
        result[rb, ri] = _exact_rows(ordered, rb, ri, cols, perm[rb.unsqueeze(1), cols], k, include_self)
    redo = (~covered).nonzero()
    if redo.numel():
        rb, ri = redo.unbind(1)
        cols = torch.arange(n, device=device).expand(rb.shape[0], n)
        result[rb, ri] = _exact_rows(ordered, rb, ri, cols, perm[rb.unsqueeze(1), cols], k, include_self)
    # back from k-d order to the input's order
    return torch.empty_like(result).scatter_(1, perm.unsqueeze(-1).expand(b, n, k), result)


def gather_neighbours(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Features of the neighbours ``idx`` ``(B, M, k)`` (indices into the ``N`` points of ``x``).

    ``(B, C, N)`` → ``(B, C, M, k)``; VN ``(B, C, 3, N)`` → ``(B, C, 3, M, k)``. One gather along the points of
    the channel-first features (contiguous output; cheaper than gathering point-major rows and permuting).
    """
    _flatten_points(x)  # checks the layout
    idx = idx.expand(x.shape[0], *idx.shape[1:])  # one graph for the whole batch broadcasts, as indexing did
    b, rows, k = idx.shape
    flat = x.reshape(b, -1, x.shape[-1])  # (B, D, N)
    index = idx.reshape(b, 1, rows * k).expand(b, flat.shape[1], rows * k)
    return flat.gather(2, index).view(*x.shape[:-1], rows, k)


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


__all__ = ["EXACT", "FAST", "LEAF_SIZE", "LEAVES_SEARCHED", "PRUNED_MIN_POINTS", "gather_neighbours",
           "graph_feature", "knn"]
