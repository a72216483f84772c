"""Every experiment file composes and instantiates its data module, model and trainer; bad choices fail clearly."""

from __future__ import annotations

import hydra
import pytest
from hydra.errors import MissingConfigException
from lightning import LightningDataModule, LightningModule, Trainer

from canonical_network.canonicalization.base import CanonicalizedModel
from tests.helpers import EXPERIMENTS, compose_config, shrink

# Built (and counted) by tests/test_gcnn_and_opt.py already; its C64 bases take ~8 s and ~2.3 GB here.
HEAVY = {"rotmnist/gcnn_p64_eqparams"}
# Rows that need a user-provided input to instantiate; their own tests build them (tests/test_pretrained.py).
NEEDS_INPUT = {"rotmnist/cn_pretrained"}


def test_experiment_files_exist():
    expected = {"rotmnist/cnn", "rotmnist/cnn_aug", "rotmnist/cn_pca", "rotmnist/cn_p4_frozen", "rotmnist/cn_p4",
                "rotmnist/cn_p64"}
    assert expected <= set(EXPERIMENTS)


@pytest.mark.parametrize(
    "experiment",
    [pytest.param(e, marks=pytest.mark.slow) if e in HEAVY else e for e in EXPERIMENTS],
)
def test_experiment_composes_and_instantiates(experiment, tmp_path):
    cfg = shrink(compose_config([f"experiment={experiment}"], tmp_path))
    assert cfg.experiment_name == experiment
    if experiment in NEEDS_INPUT:
        return
    if cfg.prediction.get("weights") is not None:
        # ImageNet weights (adapt/*) are not in this machine's torch hub cache, and nothing is downloaded:
        # built from scratch here; loading is tested in tests/test_torchvision_backbones.py
        cfg.prediction.weights = None
    assert isinstance(hydra.utils.instantiate(cfg.data), LightningDataModule)
    model = hydra.utils.instantiate(cfg.model)
    assert isinstance(model, LightningModule) and isinstance(model.network, CanonicalizedModel)
    assert isinstance(hydra.utils.instantiate(cfg.trainer), Trainer)
    # the metric the row's checkpoint and early stopping follow is one the task logs in validation
    assert cfg.optimized_metric.startswith("val/") and cfg.optimized_metric in model.monitorable_metrics()


def test_experiment_files_hold_only_differences():
    # cn_p4_frozen differs from cn_p4 by freeze only: composition, not copies.
    p4 = compose_config(["experiment=rotmnist/cn_p4"])
    frozen = compose_config(["experiment=rotmnist/cn_p4_frozen"])
    assert frozen.canonicalization.freeze and not p4.canonicalization.freeze
    frozen.canonicalization.freeze = False
    frozen.experiment_name = p4.experiment_name
    frozen.tags = p4.tags
    assert frozen == p4


def test_command_line_overrides_beat_experiment_defaults():
    cfg = compose_config(["experiment=rotmnist/cn_p4", "data=rotated_mnist", "canonicalization.num_rotations=8"])
    assert cfg.data._target_.endswith("RotatedMNISTDataModule")
    assert cfg.canonicalization.num_rotations == 8


def test_unknown_canonicalization_lists_valid_choices():
    with pytest.raises(MissingConfigException) as err:
        compose_config(["canonicalization=does_not_exist"])
    message = str(err.value)
    assert "does_not_exist" in message
    for choice in ("gcnn", "identity", "pca"):
        assert choice in message


@pytest.mark.parametrize(("trainer", "gpus", "tasks"), [("cpu", None, 1), ("gpu", 1, 1), ("ddp", 2, 2)])
def test_slurm_launcher_sizes_jobs_from_the_trainer(trainer, gpus, tasks):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from canonical_network.utils.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["hydra/launcher=slurm", f"trainer={trainer}"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher.gpus_per_node == gpus
    assert cfg.hydra.launcher.tasks_per_node == tasks
    assert cfg.hydra.launcher.signal_delay_s + 30 < cfg.hydra.launcher.timeout_min * 60
