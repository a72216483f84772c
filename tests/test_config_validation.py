"""Bad values fail before anything is built, naming the full config key; a typo leaves no run folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from canonical_network.train import run
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import PROJECT_ROOT
from canonical_network.utils.run_config import validate_run_config
from tests.helpers import compose_config, shrink


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.optimizer.lr=abc"], "model.optimizer.lr must be a number > 0; got 'abc'"),
        (["model.optimizer.lr=0"], "model.optimizer.lr must be a number > 0; got 0"),
        (["model.optimizer.weight_decay=-1"], "model.optimizer.weight_decay must be a number >= 0; got -1"),
        (["seed=abc"], "seed must be an integer; got 'abc'"),
        (["trainer.max_epochs=-1"], "trainer.max_epochs must be an integer >= 1; got -1 .*allow_unbounded_epochs"),
        (["trainer.max_epochs=0"], "trainer.max_epochs must be an integer >= 1; got 0"),
        (["data=nbody"], r"data=nbody \(NBodyDataModule\) does not fit the model's task ImageClassificationTask "
                         r"\(experiment=rotmnist/cn_p4\); data options for it: rotated_mnist, rotated_mnist_5k"),
        (["model.canonicalizer_lr=-0.1"], "model.canonicalizer_lr must be null or a number > 0; got -0.1"),
        # a quoted false is a string, which Python reads as true: resume would continue the old run
        (["resume='false'"], "resume must be true or false; got 'false'"),
        (["resume_with_changes=1"], "resume_with_changes must be true or false; got 1"),
        (["skip_finished=yes"], "skip_finished must be true or false; got 'yes'"),
    ],
)
def test_bad_values_name_their_key(overrides, message):
    cfg = compose_config(["experiment=rotmnist/cn_p4", *overrides])
    with pytest.raises(ConfigError, match=message):
        validate_run_config(cfg)


def test_unbounded_epochs_only_when_asked():
    validate_run_config(compose_config(["experiment=rotmnist/cnn", "trainer.max_epochs=-1",
                                        "allow_unbounded_epochs=true"]))


def test_pretrained_canonicalizer_from_another_family_is_refused(tmp_path):
    source = tmp_path / "nbody_run"
    (source / "checkpoints").mkdir(parents=True)
    stored = {"data": {"_target_": "canonical_network.data.nbody.NBodyDataModule"}}
    torch.save({"state_dict": {}, "canonical_network": {"version": 1, "config": stored}},
               source / "checkpoints" / "last.ckpt")
    cfg = compose_config(["experiment=rotmnist/cn_pretrained",
                          f"canonicalization.checkpoint={source / 'checkpoints' / 'last.ckpt'}"])
    with pytest.raises(ConfigError, match="comes from a run on NBodyDataModule, not on data like this run's"):
        validate_run_config(cfg)
    torch.save({"state_dict": {}}, source / "checkpoints" / "last.ckpt")  # no run config: refused, not guessed
    with pytest.raises(ConfigError, match="carries no run config"):
        validate_run_config(cfg)


def test_component_errors_are_config_errors_and_nothing_is_written(tmp_path):
    cfg = shrink(compose_config(["experiment=rotmnist/cn_p4", "canonicalization.hidden_channels=0"], tmp_path))
    with pytest.raises(ConfigError, match="canonicalization.hidden_channels must be an integer >= 1; got 0"):
        run(cfg)
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results.json").exists()


def test_a_typo_leaves_no_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "canonical_network.train", "experiment=rotmnist/cnn", "model.optimizer.lr=abc",
           f"hydra.run.dir={run_dir}", "logger=none"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "model.optimizer.lr must be a number > 0; got 'abc'" in proc.stderr
    assert not run_dir.exists()


def test_single_sample_last_training_batch_is_dropped():
    """data.num_train=33 with batch 32 left a last batch of one cloud, which batch norm refuses."""
    cfg = compose_config(["experiment=modelnet/pointnet", "data.num_train=33"])
    from hydra.utils import instantiate

    datamodule = instantiate(cfg.data)
    datamodule.setup()
    sizes = [len(batch[0]) for batch in datamodule.train_dataloader()]
    assert sizes == [32] and len(datamodule.splits["train"]) == 33
    assert [len(b[0]) for b in datamodule.val_dataloader()][-1] >= 1  # evaluation keeps every sample


EXPERIMENTS = sorted(str(p.relative_to(PROJECT_ROOT / "configs" / "experiment").with_suffix(""))
                     for p in (PROJECT_ROOT / "configs" / "experiment").rglob("*.yaml"))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_passes_validation(experiment):
    validate_run_config(compose_config([f"experiment={experiment}"]))


# ----------------------------------------------------------------- the canonicalizer and predictor against the task

IMAGE_CANONICALIZATIONS = "gcnn, identity, opt, pca, pretrained, tta"
POINTCLOUD_CANONICALIZATIONS = "identity, permutation, pretrained, so3_permutation, vn_pointcloud"
NBODY_CANONICALIZATIONS = "e3_permutation, identity, permutation, pretrained, vn_deepsets"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["experiment=rotmnist/cn_p4", "canonicalization=vn_pointcloud"],
         r"canonicalization=vn_pointcloud \(VNPointCloudCanonicalizer, for PointCloudClassificationTask, "
         r"PartSegmentationTask\) does not fit the model's task ImageClassificationTask \(experiment=rotmnist/cn_p4\); "
         rf"canonicalization options for it: {IMAGE_CANONICALIZATIONS}$"),
        (["experiment=rotmnist/cn_p4", "prediction=pointnet"],
         r"prediction=pointnet \(PointNet, for PointCloudClassificationTask, PartSegmentationTask\) does not fit the "
         r"model's task ImageClassificationTask \(experiment=rotmnist/cn_p4\); prediction options for it: "
         r"cnn, gcnn, resnet18, resnet50, vit_b_16$"),
        # gcnn's ${data_info.image_size} does not exist for point clouds: named for what it is, not an
        # interpolation error
        (["experiment=modelnet/pointnet", "canonicalization=gcnn", "data=synthetic_shapes40"],
         r"canonicalization=gcnn \(GCNNCanonicalizer, for ImageClassificationTask\) does not fit the model's task "
         rf"PointCloudClassificationTask \(experiment=modelnet/pointnet\); canonicalization options for it: "
         rf"{POINTCLOUD_CANONICALIZATIONS}$"),
        (["experiment=nbody/gnn", "canonicalization=vn_pointcloud"],
         rf"canonicalization=vn_pointcloud .* task NBodyDynamicsTask .*options for it: {NBODY_CANONICALIZATIONS}$"),
        (["experiment=rotmnist/cnn", "canonicalization=permutation"],
         r"canonicalization=permutation \(PermutationCanonicalizer, for NBodyDynamicsTask, "
         r"PointCloudClassificationTask, PartSegmentationTask\) does not fit the model's task ImageClassificationTask"),
        # a product's factors are checked: the option is generic, its VN factor is not
        (["experiment=rotmnist/cnn", "canonicalization=so3_permutation"],
         r"^canonicalization\.first \(VNPointCloudCanonicalizer, .*\) does not fit the model's task "
         rf"ImageClassificationTask .*options for it: {IMAGE_CANONICALIZATIONS}$"),
        (["experiment=nbody/gnn", "prediction=cnn"],
         r"prediction=cnn \(CNN, for ImageClassificationTask\) does not fit the model's task NBodyDynamicsTask"),
        (["experiment=shapenet/pointnet", "prediction=point_transformer"],
         r"prediction=point_transformer \(PointTransformer, for PointCloudClassificationTask\) does not fit the "
         r"model's task PartSegmentationTask \(experiment=shapenet/pointnet\); prediction options for it: "
         r"dgcnn, pointnet, .*vn_dgcnn, vn_pointnet$"),
    ],
)
def test_a_component_of_another_task_is_refused_naming_the_valid_options(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_run_config(compose_config(overrides))


def test_a_component_of_another_task_leaves_nothing_behind(tmp_path):
    cfg = shrink(compose_config(["experiment=rotmnist/cnn", "prediction=pointnet"], tmp_path / "run"))
    with pytest.raises(ConfigError, match="prediction=pointnet .* does not fit the model's task"):
        run(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("overrides", "group", "option"), [
    # the training-free and generic canonicalizers stay allowed wherever they work (the identity: every
    # baseline row, test_every_experiment_passes_validation)
    (["experiment=rotmnist/cnn", "canonicalization=tta"], "canonicalization", "tta"),
    (["experiment=rotmnist/cnn", "canonicalization=pca"], "canonicalization", "pca"),
    (["experiment=modelnet/transformer", "canonicalization=so3_permutation"], "canonicalization", "so3_permutation"),
    (["experiment=modelnet/transformer", "canonicalization=permutation", "canonicalization.in_features=3"],
     "canonicalization", "permutation"),
    (["experiment=nbody/mlp", "canonicalization=e3_permutation"], "canonicalization", "e3_permutation"),
    (["experiment=shapenet/pointnet", "prediction=dgcnn"], "prediction", "dgcnn"),
    (["experiment=nbody/gnn", "prediction=fa_gnn"], "prediction", "fa_gnn"),
])
def test_components_that_serve_the_task_pass_and_are_listed_for_it(overrides, group, option):
    from canonical_network.utils.run_config import task_options

    cfg = compose_config(overrides)
    validate_run_config(cfg)
    assert option in task_options(group, cfg.model._target_)


def test_every_declared_task_is_a_task_and_every_task_has_its_options():
    from canonical_network.data.catalog import all_data_facts
    from canonical_network.utils.run_config import (
        TASK_GROUPS,
        _component_tasks,
        _option_targets,
        task_options,
    )

    tasks = {task for facts in all_data_facts() for task in facts.tasks}
    for group in TASK_GROUPS:
        for option, targets in _option_targets(group):
            assert targets, f"configs/{group}/{option}.yaml names no _target_"
            for target in targets:
                assert set(_component_tasks(target) or ()) <= tasks, (group, option, target)
    for task in tasks:
        assert "identity" in task_options("canonicalization", task)
        assert len(task_options("prediction", task)) >= 2, task


# ----------------------------------------------------------------- single values checked before admission

@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # Lightning's seed_everything takes 0 .. 2^32 - 1 (numpy's generator); it used to fail after admission
        (["seed=-1"], r"^seed must be an integer in \[0, 4294967295\]; got -1"),
        (["seed=4294967296"], r"^seed must be an integer in \[0, 4294967295\]; got 4294967296"),
        (["test_ckpt=first"], r"^test_ckpt must be one of \['best', 'last'\]; got 'first'$"),
        (["model.optimizer.lr=inf"], r"^model\.optimizer\.lr must be a finite number > 0; got inf$"),
        (["model.optimizer.weight_decay=inf"], r"^model\.optimizer\.weight_decay must be a finite number >= 0; got inf$"),
    ],
)
def test_single_values_are_checked_before_admission(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_run_config(compose_config(["experiment=rotmnist/cnn", *overrides]))


def test_infinite_momentum_is_refused():
    with pytest.raises(ConfigError, match=r"^model\.optimizer\.momentum must be a finite number >= 0; got inf$"):
        validate_run_config(compose_config(["experiment=modelnet/pointnet", "model.optimizer.momentum=inf"]))


# ----------------------------------------------------------------- unknown keys under data and model

@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # the row sets data.train_rotation for its own data (rotated_mnist_5k); data=rotated_mnist takes none
        (["experiment=adapt_mnist/resnet18", "data=rotated_mnist"],
         r"^data: RotatedMNISTDataModule takes no train_rotation, test_rotation \(a key mistyped, or set by "
         r"experiment=adapt_mnist/resnet18 .*Drop them with: ~data\.train_rotation ~data\.test_rotation ;"),
        (["experiment=rotmnist/cnn", "+data.bogus=1"], r"^data: RotatedMNIST5kDataModule takes no bogus .*~data\.bogus"),
        (["experiment=rotmnist/cnn", "+model.bogus=1"], r"^model: ImageClassificationTask takes no bogus .*~model\.bogus"),
        (["experiment=nbody/cn_gnn", "+model.label_smoothing=0.1"],
         r"^model: NBodyDynamicsTask takes no label_smoothing .*~model\.label_smoothing"),
    ],
)
def test_unknown_data_and_model_keys_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_run_config(compose_config(overrides))
