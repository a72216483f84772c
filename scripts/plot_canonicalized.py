"""The paper's "canonicalized images" figure (Appendix H): test digits of one class as each canonicalizer sees them.

    python scripts/plot_canonicalized.py --runs p4=outputs/runs/.../rotmnist-cn_p4 p64=... pca=... \
        [--digit 7] [--num-images 90] [--out outputs/figures/canonicalized_7.png] [--wandb]

Each ``--runs`` entry is ``label=<run folder>``: its best checkpoint (else ``last.ckpt``) rebuilds the model and
its test data from the run config it carries, through the trust boundary (``canonical_network/utils/trust.py``);
the folder's ``.hydra/`` files are a record for people and are never built from. The first panel shows the original (rotated) digits,
then one panel per run with the same digits mapped to their canonical pose. A good canonicalizer puts
similar-looking digits in one orientation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from canonical_network.evaluate import data_for_this_machine  # noqa: E402
from canonical_network.utils.checkpoints import model_from_checkpoint  # noqa: E402
from canonical_network.utils.config import PROJECT_ROOT  # noqa: E402  (registers the config resolvers)
from canonical_network.utils.trust import build, inside  # noqa: E402


def load_run(run_dir: Path):
    """(model in eval mode, its data config) of a finished run folder, from its checkpoint alone."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        raise SystemExit(f"plot_canonicalized.py: error: {run_dir} is not a run folder: it has no checkpoints/")
    checkpoints = sorted(folder.glob("epoch_*.ckpt")) or [folder / "last.ckpt"]
    if not checkpoints[-1].is_file():
        raise SystemExit(f"plot_canonicalized.py: error: {run_dir} has no checkpoint under checkpoints/")
    if not inside(checkpoints[-1], run_dir):  # a link that leaves the run: another file than the run's own
        raise SystemExit(f"plot_canonicalized.py: error: {checkpoints[-1]} resolves outside its run folder {run_dir} "
                         f"(to {checkpoints[-1].resolve()}): refused")
    try:  # weights only, and the config it carries through the trust boundary: nothing in the folder runs
        model = model_from_checkpoint(checkpoints[-1])
        stored = model.run_config
        data = data_for_this_machine(stored.get("data"), stored.get("paths"))
    except ValueError as error:
        raise SystemExit(f"plot_canonicalized.py: error: {error}") from None
    cfg = OmegaConf.create({"paths": {"data_dir": str(PROJECT_ROOT / "data")}, "data": data})
    return model, cfg


def test_digits(cfg, digit: int, num_images: int) -> torch.Tensor:
    """``num_images`` test images of class ``digit``, one view per digit, from the run's data config."""
    datamodule = build(cfg.data, "data")
    datamodule.setup("test")
    images, labels = datamodule.splits["test"].tensors
    views = int(cfg.data.get("eval_rotations", 1) or 1)
    images, labels = images[::views], labels[::views]  # the test split is digit-major: K views per digit
    chosen = images[labels == digit][:num_images]
    if len(chosen) == 0:
        raise SystemExit(f"no test image of class {digit}")
    return chosen


def grid(images: torch.Tensor, ncol: int = 10) -> torch.Tensor:
    import torchvision

    return torchvision.utils.make_grid(images.clamp(0, 1), nrow=ncol, padding=1, pad_value=1.0)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, metavar="LABEL=RUN_DIR")
    parser.add_argument("--digit", type=int, default=7)
    parser.add_argument("--num-images", type=int, default=90)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--wandb", action="store_true", help="also log the figure to W&B (offline unless WANDB_MODE=online)")
    args = parser.parse_args(argv)
    if not 0 <= args.digit <= 9:
        parser.error(f"--digit must be in 0..9; got {args.digit}")
    runs = []
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--runs entries are LABEL=RUN_DIR; got {item!r}")
        runs.append((label, Path(path)))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    originals = None
    for label, run_dir in runs:
        model, cfg = load_run(run_dir)
        if originals is None:
            originals = test_digits(cfg, args.digit, args.num_images)
            panels.append(("Original", grid(originals)))
        with torch.no_grad():
            canonical = model.network.canonicalize(originals)[0][0]
        panels.append((label, grid(canonical)))

    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 2.6))
    for ax, (label, image) in zip(axes if len(panels) > 1 else [axes], panels, strict=True):
        ax.imshow(image.numpy(), cmap="gray_r", vmin=0, vmax=1)
        ax.set_title(label)
        ax.axis("off")
    fig.tight_layout()
    out = args.out or PROJECT_ROOT / "outputs" / "figures" / f"canonicalized_{args.digit}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    print(f"wrote {out}")
    if args.wandb:
        import os

        import wandb

        os.environ.setdefault("WANDB_DIR", str(out.parent))
        mode = "online" if os.environ.get("WANDB_MODE", "offline") == "online" else "offline"
        with wandb.init(project="canonical-network", job_type="figure", mode=mode) as wb_run:
            wb_run.log({f"figures/canonicalized_{args.digit}": wandb.Image(str(out))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
