"""The score of a predictor that never looks at the points: the floor a point-cloud row must clear to have learned.

    python -m canonical_network.trivial_baselines experiment=shapenet/pointnet data.num_points=256 data.num_train=1000
    python -m canonical_network.trivial_baselines experiment=modelnet/pointnet data.num_points=256 data.num_train=1000

Composes the training config of those overrides (the same data, sizes and seed as the run) and builds its data.
Classification: every test cloud gets the most frequent training category (test accuracy and class-mean
accuracy). Part segmentation: every point gets the most frequent training part of its shape's category (the
category is an input of the segmentation task), scored with the task's own mIoU metric. Neither depends on the
rotation protocol: the prediction ignores the coordinates. Prints one JSON object (scores in [0, 1]).
The report puts this floor under its point-cloud tables on the embedded shapes (:func:`synthetic_floor`).
"""

from __future__ import annotations

import json
import sys

import torch


def compose_data(overrides: list[str]):
    """The ``data`` and ``data_info`` of ``python -m canonical_network.train <overrides>``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from canonical_network.data.pointclouds import PointCloudDataModule
    from canonical_network.utils.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    from canonical_network.utils.trust import build, granted, targets_named_by

    with granted(targets_named_by(overrides)):  # the command line's own components
        data = build(cfg.data, "data")
    if not isinstance(data, PointCloudDataModule):
        raise SystemExit(f"not a point-cloud experiment (data: {type(data).__name__}); give "
                         "experiment=modelnet/<row> or experiment=shapenet/<row>")
    data.setup("fit")
    data.setup("test")
    return data, cfg.data_info


def columns(dataset) -> list[torch.Tensor]:
    """The fields of every item of a split, stacked: (points, label) or (points, category, part labels)."""
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=False))
    return [torch.cat(field) for field in zip(*batches, strict=True)]


def majority_classification(train_labels: torch.Tensor, test_labels: torch.Tensor, num_classes: int) -> dict:
    """Accuracy and class-mean accuracy of predicting the most frequent training label everywhere."""
    majority = int(torch.bincount(train_labels, minlength=num_classes).argmax())
    hit = (test_labels == majority).double()
    seen = torch.unique(test_labels)
    return {"majority_class": majority, "acc": float(hit.mean()),
            "class_acc": float(torch.stack([hit[test_labels == c].mean() for c in seen]).mean())}


def majority_parts(train_categories: torch.Tensor, train_parts: torch.Tensor, num_categories: int,
                   num_parts: int) -> torch.Tensor:
    """(num_categories,) the most frequent part id among the training points of each category (-1: unseen)."""
    counts = torch.zeros(num_categories, num_parts, dtype=torch.long)
    flat = train_categories[:, None].expand_as(train_parts) * num_parts + train_parts
    counts.view(-1).index_add_(0, flat.reshape(-1), torch.ones(flat.numel(), dtype=torch.long))
    return torch.where(counts.sum(1) > 0, counts.argmax(1), torch.full((num_categories,), -1))


def majority_segmentation(train_categories, train_parts, test_categories, test_parts, category_parts,
                          num_parts: int) -> dict:
    """Instance and class mIoU of labelling every point with its category's most frequent training part."""
    from canonical_network.tasks.metrics import PartSegmentationMIoU

    metric = PartSegmentationMIoU(category_parts, num_parts)
    best = majority_parts(train_categories, train_parts, metric.num_categories, num_parts)
    if (best[test_categories] < 0).any():
        raise SystemExit("a test category has no training shape: no majority part to predict")
    logits = torch.nn.functional.one_hot(best[test_categories], num_parts).float()
    logits = logits[:, None, :].expand(-1, test_parts.shape[1], -1)
    metric.update(logits, test_parts, test_categories)
    return {key: float(value) for key, value in metric.compute().items()}


def scores(data, task: str, num_classes: int, category_parts, num_parts: int) -> dict:
    """The floor of a set-up point-cloud data module: :func:`majority_classification` or
    :func:`majority_segmentation` of its train and test splits."""
    train, test = columns(data.splits["train"]), columns(data.splits["test"])
    if task == "classification":
        return majority_classification(train[1], test[1], num_classes)
    return majority_segmentation(train[1], train[2], test[1], test[2], category_parts, num_parts)


#: the record keys (``config.data.<key>``) that decide the embedded shapes' train and test clouds
SYNTHETIC_KEYS = ("task", "num_train", "num_val", "num_test", "num_points", "noise_std", "data_seed")


def synthetic_floor(data_config: dict) -> dict:
    """The floor of the embedded synthetic shapes built with ``data_config`` (the :data:`SYNTHETIC_KEYS` of
    a run's data config); the rotation protocol does not change it."""
    from canonical_network.data.synthetic_shapes import SyntheticShapesDataModule

    data = SyntheticShapesDataModule(**{key: data_config[key] for key in SYNTHETIC_KEYS if key in data_config})
    data.setup("fit")
    return scores(data, data.task, data.num_classes, data.category_parts, data.num_parts)


def main(argv: list[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    if not overrides or any(o in ("-h", "--help") for o in overrides):
        print(__doc__)
        return 0 if overrides else 2
    data, info = compose_data(overrides)
    floor = scores(data, info.task, int(info.num_classes), info.category_parts, int(info.num_parts))
    print(json.dumps({"overrides": overrides, "task": info.task, "num_train": len(data.splits["train"]),
                      "num_test": len(data.splits["test"]), **floor}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
