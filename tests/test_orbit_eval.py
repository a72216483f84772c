"""Group-orbit evaluation: test/error under every element of C_4, from the real Rotated MNIST configs.

Each model is first fitted to 32 upright digits (so that its predictions depend on the input and the
comparison below is not between constant outputs), then tested on those digits through a real Trainer.
An invariant model must score the same under all four quarter turns; the plain CNN must not.
"""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate
from lightning import Trainer
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import clear_argmax, compose_config, fit_image_model
from tests.test_image_invariance import IMAGE_FACTOR


def step(num_images: int) -> float:
    """Half the resolution of a test error in percent over ``num_images`` images: two errors that differ by
    one image differ by 100 / num_images, while the float32 averaging over a few batches rounds them by
    ≤ ~2⁴ eps32 · 100 ≈ 2e-4, so comparing with this tolerance tells equal counts from different ones on
    any machine."""
    return 50.0 / num_images


def _fit_and_test(experiment: str, digits, steps: int = 40, orbit_rotations: int = 4,
                  test_set: tuple[torch.Tensor, torch.Tensor] | None = None,
                  clear: bool = False) -> dict[str, float]:
    """Test metrics of the fitted model. ``clear``: first check that every prediction is a clear argmax
    (top-two logits further apart than their rounding, IMAGE_FACTOR eps32 of the logits' scale), so that the
    exact-count comparisons below cannot be decided by rounding on another machine."""
    model = fit_image_model([f"experiment={experiment}", f"model.orbit_rotations={orbit_rotations}"],
                            train_steps=steps, data=digits)
    images = (test_set or digits)[0]
    if clear:
        with torch.no_grad():
            for k in range(orbit_rotations):
                assert clear_argmax(model(torch.rot90(images, k, dims=(-2, -1))), IMAGE_FACTOR).all(), k
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                      enable_model_summary=False)
    loader = DataLoader(TensorDataset(*(test_set or digits)), batch_size=16)
    return trainer.test(model, dataloaders=loader, verbose=False)[0]


def _orbit_errors(metrics: dict[str, float], n: int) -> list[float]:
    return [metrics[f"test/orbit/error_g{k}"] for k in range(n)]


# the G-CNN row takes ~100 s on a busy 2-core machine: `make test-full` (the CN rows check the same path)
@pytest.mark.parametrize("experiment", [pytest.param("rotmnist/gcnn_p4", marks=pytest.mark.slow), "rotmnist/cn_p4",
                                        "rotmnist/cn_pca"])
def test_invariant_models_score_the_same_on_the_whole_orbit(experiment, digits):
    metrics = _fit_and_test(experiment, digits, clear=True)
    errors = _orbit_errors(metrics, 4)
    tol = step(len(digits[0]))
    # The fit worked (predictions vary with the input), so equal errors are not equal constants.
    assert metrics["test/error"] < 50.0, metrics
    # Element 0 is the identity: the orbit evaluation reproduces test/error.
    assert errors[0] == pytest.approx(metrics["test/error"], abs=tol)
    # Quarter turns are exact (rot90), so an invariant model classifies every digit the same way.
    assert max(errors) - min(errors) == pytest.approx(0.0, abs=tol), errors
    assert metrics["test/orbit/error_gap"] == pytest.approx(0.0, abs=tol)
    assert metrics["test/orbit/inconsistent"] == pytest.approx(0.0, abs=tol)
    assert metrics["test/orbit/error_worst"] == pytest.approx(metrics["test/error"], abs=tol)


def test_plain_cnn_fails_the_orbit_check(digits):
    metrics = _fit_and_test("rotmnist/cnn", digits)
    errors = _orbit_errors(metrics, 4)
    assert errors[0] < 50.0, errors  # fits the upright digits ...
    assert metrics["test/orbit/error_max"] > errors[0] + 20.0, errors  # ... but not their quarter turns
    tol = step(len(digits[0]))
    assert metrics["test/orbit/error_gap"] == pytest.approx(max(errors) - min(errors), abs=tol)
    # Per image: wrong under some turn at least as often as under the worst single turn; predictions move.
    assert metrics["test/orbit/error_worst"] >= metrics["test/orbit/error_max"] - tol
    assert metrics["test/orbit/inconsistent"] > 20.0


def test_orbit_closed_test_set_hides_a_cnn_from_per_element_errors_but_not_per_image(digits):
    """Four quarter turns of each digit in the test set: per-element errors agree, per-image ones do not."""
    images, labels = digits
    closed = (torch.cat([torch.rot90(images, k, dims=(-2, -1)) for k in range(4)]), labels.repeat(4))
    metrics = _fit_and_test("rotmnist/cnn", digits, test_set=closed)
    errors = _orbit_errors(metrics, 4)
    # Exact: each element sees the same multiset of images (rot90 is exact), only in another order.
    assert max(errors) - min(errors) == pytest.approx(0.0, abs=step(len(closed[0])))
    assert metrics["test/orbit/inconsistent"] > 20.0
    assert metrics["test/orbit/error_worst"] > metrics["test/error"] + 10.0


def test_orbit_with_reflections_and_off_switch(digits):
    metrics = _fit_and_test("rotmnist/cnn", digits, steps=1, orbit_rotations=0)
    assert not any(k.startswith("test/orbit/") for k in metrics)
    cfg = compose_config(["experiment=rotmnist/cnn", "model.orbit_rotations=2", "model.orbit_reflection=true"])
    model = instantiate(cfg.model)
    assert model.orbit == [(0.0, False), (180.0, False), (0.0, True), (180.0, True)]


def test_bad_orbit_size_names_the_key():
    from canonical_network.tasks.image_classification import ImageClassificationTask

    cfg = compose_config(["experiment=rotmnist/cnn"])
    parts = {"canonicalizer": instantiate(cfg.canonicalization), "predictor": instantiate(cfg.prediction)}
    with pytest.raises(ValueError, match="model.orbit_rotations"):
        ImageClassificationTask(**parts, optimizer=torch.optim.Adam, orbit_rotations=-1)
