"""How large are the N-body canonicalizer's frame vectors, and is the model still equivariant? (issue 33)

    python scripts/nbody_frame_scale.py --untrained p pvq
    python scripts/nbody_frame_scale.py --checkpoint outputs/reproduction/nbody/cn_gnn/inputs_p/seed0/checkpoints/epoch_989.ckpt

An exactly O(3)-equivariant Vector Neuron Deep Sets network that reads only the centred positions
``x_i − x̄`` is degenerate: the mean over particles of the centred positions is zero, and a VN layer on one
channel per particle only rescales it (the VN-ReLU of a vector along its own direction keeps or zeroes it, the
same choice for every particle), so every hidden feature of particle ``i`` is ``c (x_i − x̄)`` with ``c`` the
same for all particles, and the pooled frame vectors are ``c Σ_i (x_i − x̄) / N = 0``. Only the ``VN_EPS``
guard of the VN-ReLU's projection (a factor ``ε / (‖k‖² + ε)`` that depends on ``‖x_i‖``) and rounding make
them non-zero; in training, vector dropout (a different mask per particle) breaks the symmetry and gives
frames built from random subsets of the particles.

For each model, in evaluation mode on the N-body test split (float64 unless ``--float32``), the table gives the
frame vectors' size relative to the input's (the largest of the three vector norms over the mean centred
particle norm: median and smallest over systems), the share of systems whose frame counts as zero for
:func:`~canonical_network.groups.euclidean.gram_schmidt` (largest norm ≤ its ``eps``, 1e-6: it falls back to
the identity, which is not equivariant), and, for checkpoints, the largest relative output error of the whole
model under one Haar-random element of O(3) per system (``‖φ(Qx) − Qφ(x)‖ / ‖φ(x)‖``). Reads nothing but the
given checkpoints (weights only) and the N-body data; writes nothing.
"""

from __future__ import annotations

import argparse

import torch

from canonical_network.canonicalization.nbody import FEATURES
from canonical_network.evaluate import compose_evaluation
from canonical_network.groups.euclidean import random_orthogonal
from canonical_network.utils.config import compose_experiment
from canonical_network.utils.trust import build

ZERO_FRAME = 1e-6  # gram_schmidt's default eps


def test_split(cfg) -> tuple[torch.Tensor, ...]:
    data = build(cfg.data)
    data.setup("test")
    return data.splits["test"].tensors


def frame_scale(canonicalizer, loc, vel, charges) -> dict[str, float]:
    with torch.no_grad():
        vectors, centroid = canonicalizer.frame_vectors(loc, vel, charges)
    largest = vectors[:, :3].norm(dim=-1).amax(dim=-1)
    scale = (loc - centroid.unsqueeze(1)).norm(dim=-1).mean(dim=-1)
    relative = largest / scale
    return {"median": relative.median().item(), "smallest": relative.min().item(),
            "zero_frames": (largest <= ZERO_FRAME).double().mean().item()}


def equivariance_error(network, loc, vel, charges, seed: int = 0) -> float:
    q = random_orthogonal(loc.shape[0], torch.Generator().manual_seed(seed), dtype=loc.dtype).transpose(1, 2)
    with torch.no_grad():
        out = network(loc, vel, charges)
        moved = network(loc @ q, vel @ q, charges)
    return ((moved - out @ q).flatten(1).norm(dim=-1) / out.flatten(1).norm(dim=-1)).max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", nargs="*", default=[], help="CN-GNN checkpoints (weights only)")
    parser.add_argument("--untrained", nargs="*", default=[], choices=sorted(FEATURES),
                        help="canonicalization.features of freshly initialised canonicalizers (seed 0)")
    parser.add_argument("--float32", action="store_true", help="measure in float32 (default float64)")
    parser.add_argument("--data-root", default="data", help="the folder holding nbody/ (paths.data_dir)")
    args = parser.parse_args()
    dtype = torch.float32 if args.float32 else torch.float64
    torch.set_num_threads(1)

    rows = []
    data = None
    for features in args.untrained:
        cfg = compose_experiment(["experiment=nbody/cn_gnn", f"canonicalization.features={features}",
                                  f"paths.data_dir={args.data_root}"])
        data = data or [t.to(dtype) for t in test_split(cfg)]
        torch.manual_seed(0)
        canonicalizer = build(cfg.canonicalization).to(dtype).eval()
        rows.append((f"untrained, features={features}", frame_scale(canonicalizer, *data[:3]), None))
    for path in args.checkpoint:
        cfg = compose_evaluation(path, [f"paths.data_dir={args.data_root}"])
        data = data or [t.to(dtype) for t in test_split(cfg)]
        model = build(cfg.model)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["state_dict"])
        model = model.to(dtype).eval()
        features = cfg.canonicalization.get("features", "pvq")
        rows.append((f"{path} (features={features})", frame_scale(model.network.canonicalizer, *data[:3]),
                     equivariance_error(model.network, *data[:3])))

    print(f"N-body test split ({len(data[0]) if data else 0} systems), {str(dtype).replace('torch.', '')}, eval mode")
    print("| model | frame / input, median | smallest | zero frames (identity fallback) | equivariance error |")
    print("|---|---|---|---|---|")
    for name, scale, error in rows:
        error_text = "–" if error is None else f"{error:.2e}"
        print(f"| {name} | {scale['median']:.2e} | {scale['smallest']:.2e} | {100 * scale['zero_frames']:.1f} % "
              f"| {error_text} |")


if __name__ == "__main__":
    main()
