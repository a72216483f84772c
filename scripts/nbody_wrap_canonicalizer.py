"""A trained N-body predictor behind an untrained, exactly equivariant canonicalizer (issue 33).

    python scripts/nbody_wrap_canonicalizer.py \
        outputs/reproduction/nbody/gnn/aug_o3/seed0/checkpoints/epoch_*.ckpt \
        outputs/reproduction/nbody/gnn/seed0/checkpoints/epoch_*.ckpt

A predictor trained on randomly turned systems (``data.augmentation=o3``) has learned to be nearly
rotation-invariant, so any exactly equivariant frame in front of it makes an exactly equivariant model with
about its error: the frame only picks one of the orientations it was trained on. This measures that, per
checkpoint of a model without a learned canonicalizer (``nbody/gnn``, ``nbody/linear``, ...), on the N-body test
split: the test MSE of the predictor on the systems as they are, on the systems turned by one Haar-random element
of O(3) each (the turn undone on the output), and behind the canonicalizer of ``nbody/cn_gnn_frozen`` (the VN
Deep Sets network at its seeded initialisation, four-vector inputs, learned translation) with the canonicalizer's
float64 equivariance error of the whole model (``‖φ(Qx + s) − (Qφ(x) + s)‖ / ‖φ(x)‖``, median and largest over
systems: the largest is that of the worst-conditioned frame, whose vectors come closest to parallel).
Reads the checkpoints (weights only) and the data; writes nothing.
"""

from __future__ import annotations

import argparse

import torch

from canonical_network.canonicalization.base import CanonicalizedModel
from canonical_network.evaluate import compose_evaluation
from canonical_network.groups.euclidean import random_orthogonal
from canonical_network.utils.config import compose_experiment
from canonical_network.utils.trust import build


def mse(model, loc, vel, charges, target) -> float:
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(loc, vel, charges), target).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="checkpoints of N-body runs without a learned canonicalizer")
    parser.add_argument("--data-root", default="data", help="the folder holding nbody/ (paths.data_dir)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the canonicalizer's initialisation and of Q")
    args = parser.parse_args()
    torch.set_num_threads(1)

    frozen = compose_experiment(["experiment=nbody/cn_gnn_frozen", f"paths.data_dir={args.data_root}"])
    data = build(frozen.data)
    data.setup("test")
    loc, vel, charges, target = data.splits["test"].tensors
    generator = torch.Generator().manual_seed(args.seed)
    # Qᵀ, one per system, orthogonal to float64 rounding (a float32 Q cast up is orthogonal to 1e-7 only)
    q64 = random_orthogonal(len(loc), generator, dtype=torch.float64).transpose(1, 2)
    shift64 = torch.randn(len(loc), 1, 3, generator=generator, dtype=torch.float64)
    q = q64.float()

    print(f"N-body test split ({len(loc)} systems); canonicalizer: nbody/cn_gnn_frozen's at seed {args.seed}")
    print("| checkpoint | as they are | turned (O(3)) | behind the frozen canonicalizer | its equivariance error, median / largest (float64) |")
    print("|---|---|---|---|---|")
    for path in args.checkpoints:
        cfg = compose_evaluation(path, [f"paths.data_dir={args.data_root}"])
        task = build(cfg.model)
        task.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["state_dict"])
        predictor = task.network.predictor.eval()
        plain = task.network.eval()

        def turned(loc_, vel_, charges_, model=plain):
            return model(loc_ @ q, vel_ @ q, charges_) @ q.transpose(1, 2)

        torch.manual_seed(args.seed)
        canonicalizer = build(frozen.canonicalization)
        wrapped = CanonicalizedModel(canonicalizer, predictor).eval()
        wrapped64 = CanonicalizedModel(canonicalizer, predictor).double().eval()
        x64 = (loc.double(), vel.double(), charges.double())
        with torch.no_grad():
            out = wrapped64(*x64)
            moved = wrapped64(x64[0] @ q64 + shift64, x64[1] @ q64, x64[2])
        errors = ((moved - (out @ q64 + shift64)).flatten(1).norm(dim=-1)
                  / out.flatten(1).norm(dim=-1))
        wrapped.float()
        print(f"| {path} | {mse(plain, loc, vel, charges, target):.5f} | {mse(turned, loc, vel, charges, target):.5f} "
              f"| {mse(wrapped, loc, vel, charges, target):.5f} | {errors.median().item():.1e} / {errors.max().item():.1e} |")


if __name__ == "__main__":
    main()
