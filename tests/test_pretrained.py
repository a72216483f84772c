"""CN(pretrained): the canonicalizer of a finished run, reloaded with its weights and frozen."""

from __future__ import annotations

import hydra
import pytest
import torch
from omegaconf import OmegaConf

from canonical_network.train import run
from tests.helpers import compose_config, shrink


def _finished_run(tmp_path, experiment):
    cfg = shrink(compose_config([f"experiment={experiment}"], tmp_path))
    (tmp_path / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, tmp_path / ".hydra" / "config.yaml")  # what Hydra leaves in every run folder
    run(cfg)
    return tmp_path / "checkpoints" / "last.ckpt"


def test_pretrained_canonicalizer_has_the_trained_weights_and_stays_frozen(tmp_path, rotated_digits):
    ckpt = _finished_run(tmp_path / "p4", "rotmnist/cn_p4")
    trained = {k[len("network.canonicalizer."):]: v
               for k, v in torch.load(ckpt, weights_only=True)["state_dict"].items()
               if k.startswith("network.canonicalizer.")}
    cfg = compose_config(["experiment=rotmnist/cn_pretrained", f"canonicalization.checkpoint={ckpt}"])
    model = hydra.utils.instantiate(cfg.model).train()
    canon = model.canonicalizer
    assert canon.freeze and not canon.training
    for key, value in canon.state_dict().items():
        assert torch.equal(value, trained[key]), key
    assert all(not p.requires_grad for p in canon.parameters())
    assert all(p.requires_grad for p in model.network.predictor.parameters())
    images, labels = rotated_digits
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    assert all(p.grad is None for p in canon.parameters())
    # the prior weight is this run's (the source run trained without one); it moves h once unfrozen
    tuned = hydra.utils.instantiate(compose_config(
        ["experiment=rotmnist/cn_pretrained", f"canonicalization.checkpoint={ckpt}", "canonicalization.freeze=false",
         "canonicalization.prior_weight=0.5"]).canonicalization)
    assert tuned.prior_weight == 0.5 and all(p.requires_grad for p in tuned.parameters())


def test_pretrained_errors_are_clear(tmp_path):
    with pytest.raises(Exception, match="canonicalization.checkpoint is required"):
        hydra.utils.instantiate(compose_config(["experiment=rotmnist/cn_pretrained"]).model)
    with pytest.raises(Exception, match="does not exist"):
        hydra.utils.instantiate(compose_config(["experiment=rotmnist/cn_pretrained",
                                                f"canonicalization.checkpoint={tmp_path}/nope.ckpt"]).model)
    ckpt = _finished_run(tmp_path / "cnn", "rotmnist/cnn")
    with pytest.raises(Exception, match="holds no canonicalizer weights"):
        hydra.utils.instantiate(compose_config(["experiment=rotmnist/cn_pretrained",
                                                f"canonicalization.checkpoint={ckpt}"]).model)
