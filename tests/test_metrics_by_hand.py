"""Metrics and the equivariance checker against values computed by hand.

Each test pins a number a change of convention would move while every other test still passes: the class mIoU
leaves out categories with no shapes (instead of counting them 0), the image error is the share of misclassified
images (not a class mean), "SE(3)" moves points by translations too, a product group rotates as well as permutes,
and the checker reports the largest entry's error (not a mean). Exact small cases: equality, or
``pytest.approx``'s default (1e-6 relative) on sums of a few float32 numbers.
"""

from __future__ import annotations

import pytest
import torch

import canonical_network as cn
from canonical_network.tasks.metrics import ErrorPercent, PartSegmentationMIoU

CATEGORY_PARTS = ((0, 1, 2), (3, 4))


def _logits_for(preds, num_parts=5):
    return torch.nn.functional.one_hot(torch.tensor(preds), num_parts).float()


def test_class_miou_leaves_out_categories_without_shapes():
    metric = PartSegmentationMIoU(CATEGORY_PARTS)
    target = torch.tensor([[0, 1, 2, 2]])
    metric.update(_logits_for(target.tolist()), target, torch.tensor([0]))
    assert metric.compute()["class_miou"] == pytest.approx(1.0)
    assert torch.isnan(metric.per_category()[1])


def test_error_percent_is_the_share_of_misclassified_images():
    m = ErrorPercent(3)
    labels, preds = torch.tensor([0, 0, 0, 1]), torch.tensor([0, 0, 1, 0])
    m.update(torch.nn.functional.one_hot(preds, 3).float(), labels)
    assert m.compute().item() == pytest.approx(50.0)


class _Norms(torch.nn.Module):
    def forward(self, x):
        return x.norm(dim=-1)


def test_se3_moves_the_points():
    points = torch.randn(3, 10, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert not cn.check_equivariance(_Norms(), points, "SE(3)").passed
    assert cn.check_equivariance(_Norms(), points, "SO(3)").passed


def test_product_group_rotates_as_well_as_permutes():
    pts = torch.randn(3, 6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    centred_norms = lambda x: (x - x.mean(1, keepdim=True)).norm(dim=-1)  # noqa: E731
    coord_sum = lambda x: x.sum(-1)  # noqa: E731
    assert cn.check_equivariance(centred_norms, pts, "E(3)×S_n", output_action="elements").passed
    assert not cn.check_equivariance(coord_sum, pts, "E(3)×S_n", output_action="elements").passed


def test_reported_error_is_the_max_over_entries():
    points = torch.randn(4, 50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def f(x):
        out = x.norm(dim=-1).clone()
        out[0, 0] = x[0, 0, 0]
        return out
    rot = cn.random_rotations(1, torch.Generator().manual_seed(1), dtype=torch.float64)[0]
    r = cn.check_equivariance(f, points, [rot])
    expected = (f(points @ rot.T) - f(points)).abs().max().item()
    assert r.elements[0].max_abs_error == pytest.approx(expected)


def test_part_accuracy_is_among_the_shapes_own_parts():
    """``{val,test}/acc`` of part segmentation predicts a point's part among its category's parts, as the mIoU
    does: logits whose overall argmax is another category's part still count as right."""
    from hydra.utils import instantiate

    from tests.helpers import compose_config

    task = instantiate(compose_config(["experiment=shapenet/pointnet"]).model)  # its default data's parts
    metrics = task.split_metrics("val")
    mask = metrics["miou"].part_mask
    own, other = int(mask[0].nonzero()[0, 0]), int(mask[1].nonzero()[0, 0])
    target = torch.full((1, 16), own)
    logits = torch.zeros(1, 16, mask.shape[1])
    logits[..., other], logits[..., own] = 9.0, 1.0  # the overall argmax: a part of category 1
    task.update_metrics(metrics, logits, target, (torch.zeros(1, 16, 3), torch.tensor([0])))
    assert metrics["acc"].compute() == 1.0 and metrics["miou"].compute()["instance_miou"] == 1.0


class _AlwaysZero(torch.nn.Module):
    """Invariant (it ignores the image) and wrong on every digit that is not a 0."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.zeros(len(images), dtype=torch.long), 10).float()


class _RotationSensitive(torch.nn.Module):
    """Class 0 when the bottom strip is the heaviest (upright), class 1 otherwise: it reads the rotation only."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        strips = [images[..., :4, :], images[..., :, :4], images[..., :, -4:]]  # top, left, right
        bottom = images[..., -4:, :].sum(dim=(1, 2, 3))
        upright = torch.stack([bottom > strip.sum(dim=(1, 2, 3)) for strip in strips]).all(dim=0)
        return torch.nn.functional.one_hot((~upright).long(), 10).float()


def test_orbit_figures_by_hand():
    """``test/orbit/*`` on 4 images under C4: an invariant but wrong model is wrong everywhere alike (never
    inconsistent, no gap); a model that reads the rotation has errors that differ by element, its gap is
    max − min and an image is inconsistent when some rotation changes its prediction."""
    from hydra.utils import instantiate
    from lightning import Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from tests.helpers import compose_config

    images = torch.zeros(4, 1, 28, 28)
    images[..., -4:, :] = 1.0  # bottom-heavy: "upright" for _RotationSensitive; its quarter turns are not
    labels = torch.tensor([1, 1, 1, 0])
    figures = {}
    for name, predictor in (("invariant", _AlwaysZero()), ("sensitive", _RotationSensitive())):
        model = instantiate(compose_config(["experiment=rotmnist/cnn", "model.orbit_rotations=4"]).model)
        model.network.predictor = predictor
        trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                          enable_model_summary=False)
        figures[name] = trainer.test(model, DataLoader(TensorDataset(images, labels), batch_size=2), verbose=False)[0]
    invariant, sensitive = figures["invariant"], figures["sensitive"]
    assert [invariant[f"test/orbit/error_g{k}"] for k in range(4)] == [75.0] * 4  # the three 1s are wrong
    assert invariant["test/orbit/error_gap"] == 0.0 and invariant["test/orbit/inconsistent"] == 0.0
    assert invariant["test/orbit/error_worst"] == 75.0
    # upright: predicts 0 (right for one image); turned: predicts 1 (right for three); the identity's error is
    # the largest, so the gap is not "max minus the identity's"
    errors = [sensitive[f"test/orbit/error_g{k}"] for k in range(4)]
    assert errors[0] == 75.0 and errors[1:] == [25.0] * 3
    assert sensitive["test/orbit/error_gap"] == 50.0 and sensitive["test/orbit/error_max"] == 75.0
    assert sensitive["test/orbit/inconsistent"] == 100.0  # every image's prediction changes under a turn
    assert sensitive["test/orbit/error_worst"] == 100.0  # each image is wrong under some element
