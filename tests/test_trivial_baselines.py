"""canonical_network.trivial_baselines: the score a point-cloud row must clear to have learned anything."""

from __future__ import annotations

import json

import pytest
import torch

from canonical_network import trivial_baselines


@pytest.fixture(scope="module")
def script():
    return trivial_baselines


def test_majority_classification_predicts_the_most_frequent_training_label(script):
    train = torch.tensor([2, 2, 2, 0, 1])
    test = torch.tensor([2, 0, 0, 0, 1, 2])
    scores = script.majority_classification(train, test, num_classes=3)
    assert scores["majority_class"] == 2
    assert scores["acc"] == pytest.approx(2 / 6)
    assert scores["class_acc"] == pytest.approx(1 / 3)  # recall 1 for class 2, 0 for the others


def test_majority_segmentation_scores_the_category_majority_part_with_the_task_metric(script):
    # category 0 owns parts 0, 1; category 1 owns part 2, 3. Training: part 1 is category 0's majority, 3 is 1's
    category_parts = [[0, 1], [2, 3]]
    train_categories = torch.tensor([0, 1])
    train_parts = torch.tensor([[1, 1, 1, 0], [3, 3, 2, 3]])
    assert script.majority_parts(train_categories, train_parts, 2, 4).tolist() == [1, 3]
    # test shape of category 0: 3 of 4 points are part 1 -> IoU(part 1) = 3/4, IoU(part 0) = 0: mIoU 3/8;
    # test shape of category 1, all part 3 -> IoU(3) = 1, part 2 absent from prediction and truth: 1
    test_categories = torch.tensor([0, 1])
    test_parts = torch.tensor([[1, 1, 1, 0], [3, 3, 3, 3]])
    scores = script.majority_segmentation(train_categories, train_parts, test_categories, test_parts,
                                          category_parts, num_parts=4)
    assert scores["instance_miou"] == pytest.approx((3 / 8 + 1) / 2)
    assert scores["class_miou"] == pytest.approx((3 / 8 + 1) / 2)


def test_majority_segmentation_refuses_a_test_category_without_training_shapes(script):
    with pytest.raises(SystemExit, match="no training shape"):
        script.majority_segmentation(torch.tensor([0]), torch.tensor([[0, 1]]), torch.tensor([1]),
                                     torch.tensor([[2, 3]]), [[0, 1], [2, 3]], num_parts=4)


def test_main_on_the_embedded_shapes(script, capsys):
    """Balanced categories: the classification floor is one class in seven; segmentation sits far below 1."""
    small = ["data.num_points=32", "data.num_train=70", "data.num_val=7", "data.num_test=70"]
    assert script.main(["experiment=modelnet/pointnet", *small]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["task"] == "classification" and scores["num_test"] == 70
    assert scores["acc"] == pytest.approx(1 / 7) and scores["class_acc"] == pytest.approx(1 / 7)
    assert script.main(["experiment=shapenet/pointnet", *small]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["task"] == "segmentation"
    assert 0.05 < scores["class_miou"] < 0.6 and 0.05 < scores["instance_miou"] < 0.6
    # the report's floor, from the data keys a run records, is the same number
    record = {"task": "segmentation", "num_train": 70, "num_val": 7, "num_test": 70, "num_points": 32,
              "noise_std": 0.01, "data_seed": 0}
    assert script.synthetic_floor(record)["class_miou"] == scores["class_miou"]


def test_main_refuses_an_experiment_that_is_not_a_point_cloud_task(script):
    with pytest.raises(SystemExit, match="not a point-cloud experiment"):
        script.main(["experiment=rotmnist/cnn"])
