"""Per-class test error, identity rate and the most frequent confusions of image-classification checkpoints.

    python scripts/per_class_errors.py <ckpt> [<ckpt> ...] [--set data.test_rotation=none] [--json out.json]

Each checkpoint is rebuilt from the run config it carries (``model_from_checkpoint``); its test set is the run's
own, changed by ``--set`` overrides of ``data.*`` (e.g. ``data.test_rotation=none``: the upright test digits).
Where an invariant model loses to its backbone on upright digits, this says on which classes: a C_N-invariant
classifier cannot tell a 6 from a 9 that is a 6 turned by 180°, and a C_N-equivariant canonicalizer cannot map
both to the identity.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch


def per_class(ckpt: str, data_overrides: list[str]) -> dict:
    from omegaconf import OmegaConf

    from canonical_network.utils.checkpoints import load_checkpoint, model_from_checkpoint, require_run_config
    from canonical_network.utils.trust import build

    bad = [o for o in data_overrides if not o.startswith("data.")]
    if bad:
        raise SystemExit(f"--set takes data.<key>=<value> overrides only; got {', '.join(bad)}")
    model = model_from_checkpoint(ckpt)
    config = OmegaConf.create(require_run_config(load_checkpoint(ckpt), ckpt))
    config = OmegaConf.merge(config, OmegaConf.from_dotlist(data_overrides))
    datamodule = build(config.data)
    datamodule.setup("test")
    labels, predictions, identity = [], [], []
    with torch.no_grad():
        for images, target in datamodule.test_dataloader():
            output, element = model.network.forward_with_element(images)
            labels.append(target)
            predictions.append(output.argmax(dim=-1))
            identity.append(model.canonicalizer.is_identity(element, len(images)))
    labels, predictions, identity = torch.cat(labels), torch.cat(predictions), torch.cat(identity)
    classes = sorted(int(c) for c in labels.unique())
    wrong = predictions != labels
    confusions = Counter((int(t), int(p)) for t, p in zip(labels[wrong], predictions[wrong], strict=True))
    return {
        "checkpoint": ckpt,
        "experiment": config.get("experiment_name"),
        "data_overrides": data_overrides,
        "n": len(labels),
        "error": 100.0 * wrong.float().mean().item(),
        "identity_rate": 100.0 * identity.float().mean().item(),
        # where the errors are: on the images h left as they are, and on those it turned
        "error_if_identity": 100.0 * wrong[identity].float().mean().item() if identity.any() else None,
        "error_if_turned": 100.0 * wrong[~identity].float().mean().item() if (~identity).any() else None,
        "per_class": {c: {"n": int((labels == c).sum()), "error": 100.0 * wrong[labels == c].float().mean().item(),
                          "identity_rate": 100.0 * identity[labels == c].float().mean().item()} for c in classes},
        "confusions": [{"true": t, "predicted": p, "count": k} for (t, p), k in confusions.most_common(5)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--set", action="append", default=[], metavar="data.KEY=VALUE", dest="overrides")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    for ckpt in args.checkpoints:
        if not Path(ckpt).is_file():
            parser.error(f"{ckpt} is not a file")
    results = []
    for ckpt in args.checkpoints:
        r = per_class(ckpt, args.overrides)
        results.append(r)
        print(f"{r['experiment']} ({ckpt}): error {r['error']:.2f} %, identity rate {r['identity_rate']:.1f} % "
              f"on {r['n']} test images")
        if r["error_if_turned"] is not None:
            print(f"  error on the images h left as they are: {r['error_if_identity']:.2f} %; on those it turned: "
                  f"{r['error_if_turned']:.2f} %")
        print("  class:         " + " ".join(f"{c:>6}" for c in r["per_class"]))
        print("  error %:       " + " ".join(f"{v['error']:6.1f}" for v in r["per_class"].values()))
        print("  identity %:    " + " ".join(f"{v['identity_rate']:6.1f}" for v in r["per_class"].values()))
        print("  top confusions (true -> predicted: count): "
              + ", ".join(f"{c['true']}->{c['predicted']}: {c['count']}" for c in r["confusions"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
