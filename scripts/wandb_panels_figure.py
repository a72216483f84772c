"""The picture of docs/wandb.md: what an offline W&B run of a canonicalized row holds, drawn from its own files.

    python -m canonical_network.train experiment=rotmnist/cn_p16 trainer.max_epochs=3 hydra.run.dir=outputs/runs/wandb_docs
    python scripts/wandb_panels_figure.py outputs/runs/wandb_docs/wandb/offline-run-* --out docs/figures/wandb_panels.png

Left, the run's last ``val/canonicalized`` image (its media file, as the dashboard shows it); right, its last
``val/pose`` histogram; above, the run's group, job type, name and tags, and the summary's best validation value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from canonical_network.utils.wandb_offline import read_offline_run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="an offline run folder (wandb/offline-run-*)")
    parser.add_argument("--out", type=Path, default=Path("outputs/figures/wandb_panels.png"))
    parser.add_argument("--best", default="val/acc", help="the summary key of the best validation value")
    args = parser.parse_args(argv)
    run = read_offline_run(args.run)
    images = run.media("val/canonicalized")
    pose = run.summary.get("val/pose")
    if not images or not pose:
        parser.error(f"{args.run} holds no val/canonicalized image or val/pose histogram")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.9, 1]})
    left.imshow(Image.open(images[-1]))
    left.set_title("val/canonicalized (the logged media file)", fontsize=9)
    left.axis("off")
    edges, values = pose["bins"], pose["values"]
    centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]
    right.bar(centres, values, width=(edges[1] - edges[0]) * 0.9, color="tab:blue")
    right.set_title("val/pose: chosen group element", fontsize=9)
    right.set_xlabel("element index")
    right.set_ylabel(f"validation inputs (of {sum(values)})")
    info = run.run
    best = run.summary.get(args.best)
    best = ", ".join(f"{k} {v:.3f}" for k, v in best.items()) if isinstance(best, dict) else best
    fig.suptitle(f"group {info.run_group} · job type {info.job_type} · run {info.display_name}\n"
                 f"tags {', '.join(info.tags)} · summary {args.best}: {best}", fontsize=9)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
