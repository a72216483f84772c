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
    (source / ".hydra").mkdir(parents=True)
    (source / ".hydra" / "config.yaml").write_text(
        "data:\n  _target_: canonical_network.data.nbody.NBodyDataModule\n")
    (source / "checkpoints").mkdir()
    torch.save({"state_dict": {}}, source / "checkpoints" / "last.ckpt")
    cfg = compose_config(["experiment=rotmnist/cn_pretrained",
                          f"canonicalization.checkpoint={source / 'checkpoints' / 'last.ckpt'}"])
    with pytest.raises(ConfigError, match="comes from a run on NBodyDataModule, not on data like this run's"):
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
