"""The paper's "canonicalized images" figure (Appendix H): test digits of one class as each canonicalizer sees them.

    python scripts/plot_canonicalized.py --runs p4=outputs/runs/.../rotmnist-cn_p4 p64=... pca=... \
        [--digit 7] [--num-images 90] [--out outputs/figures/canonicalized_7.png] [--wandb]

Each ``--runs`` entry is ``label=<run folder>``: the folder's ``.hydra/config.yaml`` rebuilds the model and its
best checkpoint (else ``last.ckpt``) gives the weights. The first panel shows the original (rotated) digits,
then one panel per run with the same digits mapped to their canonical pose. A good canonicalizer puts
similar-looking digits in one orientation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from canonical_network.utils.checkpoints import check_targets, load_checkpoint  # noqa: E402
from canonical_network.utils.config import PROJECT_ROOT  # noqa: E402  (registers the config resolvers)


def load_run(run_dir: Path):
    """(model in eval mode, composed config) of a finished run folder."""
    config_path = run_dir / ".hydra" / "config.yaml"
    if not config_path.is_file():
        raise SystemExit(f"{run_dir} is not a run folder: {config_path} is missing")
    cfg = OmegaConf.load(config_path)
    checkpoints = sorted((run_dir / "checkpoints").glob("epoch_*.ckpt")) or [run_dir / "checkpoints" / "last.ckpt"]
    if not checkpoints[-1].is_file():
        raise SystemExit(f"{run_dir} has no checkpoint under checkpoints/")
    try:  # the folder's files are data: its config may build only the package's components, its checkpoint
        # is read weights-only (neither runs code from the folder)
        check_targets(OmegaConf.to_container(cfg.model, resolve=True), config_path)
        state = load_checkpoint(checkpoints[-1])["state_dict"]
    except ValueError as error:
        raise SystemExit(f"plot_canonicalized.py: error: {error}") from None
    model = hydra.utils.instantiate(cfg.model)
    model.load_state_dict(state)
    return model.eval(), cfg


def test_digits(cfg, digit: int, num_images: int) -> torch.Tensor:
    """``num_images`` test images of class ``digit``, one view per digit, from the run's data config."""
    datamodule = hydra.utils.instantiate(cfg.data)
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
