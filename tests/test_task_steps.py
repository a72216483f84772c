"""The step skeleton every task shares (tasks/base.py): what each task logs per split, from one code path."""

from __future__ import annotations

import hydra
import pytest
import torch

from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.utils.config import compose_experiment

B = 4


def _images(gen):
    return torch.rand(B, 1, 28, 28, generator=gen), torch.randint(0, 10, (B,), generator=gen)


def _points(gen):
    return torch.randn(B, 64, 3, generator=gen), torch.randint(0, 7, (B,), generator=gen)


def _parts(task):
    def batch(gen):
        mask = task.metrics["val/miou"].part_mask  # (categories, parts): which parts each category has
        category = torch.randint(0, mask.shape[0], (B,), generator=gen)
        allowed = [mask[c].nonzero().flatten() for c in category]
        labels = torch.stack([a[torch.randint(0, len(a), (64,), generator=gen)] for a in allowed])
        return torch.randn(B, 64, 3, generator=gen), category, labels
    return batch


def _nbody(gen):
    loc, vel, target = (torch.randn(B, 5, 3, generator=gen) for _ in range(3))
    return loc, vel, torch.ones(B, 5, 1), target


# the image task's group-orbit figures (configs: model.orbit_rotations=4), on top of the shared step
ORBIT = {f"test/orbit/{k}" for k in ("error_g0", "error_g1", "error_g2", "error_g3", "error_max", "error_mean", "error_gap",
                                      "error_worst", "inconsistent")}

# what the step logs for every task and canonicalizer (the canonicalization prior and the identity rate)
SHARED = {"train": {"train/prior_loss"}, "val": {"val/identity_rate"}, "test": {"test/identity_rate"}}

# experiment, extra overrides, batch maker, what each split logs (step, then epoch end), besides SHARED
CASES = {
    "image": ("rotmnist/cnn", [], _images,
              {"train": {"train/loss", "train/acc"}, "val": {"val/loss", "val/acc", "val/error"},
               "test": {"test/loss", "test/acc", "test/error"} | ORBIT}),
    "pointcloud": ("modelnet/pointnet", ["data=synthetic_shapes"], _points,
                   {"train": {"train/loss", "train/acc"}, "val": {"val/loss", "val/acc", "val/class_acc"},
                    "test": {"test/loss", "test/acc", "test/class_acc"}}),
    "parts": ("shapenet/pointnet", ["data=synthetic_shapes"], None,
              {"train": {"train/loss"}, "val": {"val/loss", "val/acc", "val/instance_miou", "val/class_miou"},
               "test": {"test/loss", "test/acc", "test/instance_miou", "test/class_miou"}}),
    "nbody": ("nbody/gnn", [], _nbody,
              {"train": {"train/loss"}, "val": {"val/mse"}, "test": {"test/mse"}}),
}


def _task(experiment: str, overrides: list[str]) -> CanonicalizedTask:
    cfg = compose_experiment([f"experiment={experiment}", *overrides])
    torch.manual_seed(0)
    return hydra.utils.instantiate(cfg.model)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_task_logs_its_figures_through_the_one_step(name, monkeypatch):
    experiment, overrides, make_batch, expected = CASES[name]
    task = _task(experiment, overrides)
    make_batch = make_batch or _parts(task)
    # the steps are the base class's: a task gives its loss and metrics, not its own step layout
    for hook in ("training_step", "validation_step", "on_validation_epoch_end"):
        assert getattr(type(task), hook) is getattr(CanonicalizedTask, hook), hook
    logged: dict[str, object] = {}
    monkeypatch.setattr(task, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
    monkeypatch.setattr(task, "log_dict", lambda values, **kwargs: logged.update(values))
    gen = torch.Generator().manual_seed(1)
    for split, step, epoch_end in (("train", task.training_step, None),
                                   ("val", task.validation_step, task.on_validation_epoch_end),
                                   ("test", task.test_step, task.on_test_epoch_end)):
        logged.clear()
        task.train(split == "train")
        loss = step(make_batch(gen), 0)
        assert torch.isfinite(loss) and loss.ndim == 0
        if epoch_end is not None:
            epoch_end()
        assert set(logged) == expected[split] | SHARED[split], (split, sorted(logged))


def test_metrics_are_keyed_by_split_and_a_wrong_split_is_named():
    task = _task("rotmnist/cnn", [])
    assert set(task.split_metrics("val")) == {"acc", "error"} and set(task.split_metrics("train")) == {"acc"}
    with pytest.raises(ValueError, match=r"one of \['train', 'val', 'test'\]; got \['valid'\]"):
        CanonicalizedTask(task.network.canonicalizer, task.network.predictor, task.optimizer_factory,
                          metrics={"valid": {}})


def test_a_diverged_training_step_fails_with_what_to_do():
    """A non-finite loss ends the run (instead of training on NaN and reporting chance as a result)."""
    task = _task("modelnet/pointnet", ["data=synthetic_shapes"])
    task.train()
    points, labels = _points(torch.Generator().manual_seed(1))
    task.log = lambda *args, **kwargs: None
    assert torch.isfinite(task.training_step((points, labels), 0))
    points[0, 0, 0] = float("nan")  # what an overflow upstream leaves in the activations
    with pytest.raises(FloatingPointError, match=r"training loss is nan .*model\.optimizer\.lr.*gradient_clip_val"):
        task.training_step((points, labels), 0)
