"""A wrong result never looks like one: a run that trained on nothing, or tested nothing, is a failed run with
the reason, never a completed record without metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from canonical_network.utils.config import PROJECT_ROOT

SMALL = ["experiment=rotmnist/cnn", "trainer.max_epochs=1", "+trainer.limit_val_batches=1", "logger=csv"]


def _train(tmp_path, *overrides: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run([sys.executable, "-m", "canonical_network.train", *SMALL, *overrides,
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=600)
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    return result, record


@pytest.mark.parametrize(("overrides", "reason"), [
    (["+trainer.limit_train_batches=2", "+trainer.limit_test_batches=0"], "the test produced no test/* metric"),
    (["+trainer.limit_train_batches=0", "+trainer.limit_test_batches=1"], "no training step ran"),
])
def test_a_run_that_measured_nothing_is_failed_with_the_reason(tmp_path, overrides, reason):
    result, record = _train(tmp_path, *overrides)
    assert result.returncode != 0
    assert record["status"] == "failed" and reason in record["error"] and record["metrics"] == {}


def test_the_same_run_with_its_splits_completes(tmp_path):
    """The control: the same command with a batch of each split is a completed run with its test metrics."""
    result, record = _train(tmp_path, "+trainer.limit_train_batches=2", "+trainer.limit_test_batches=1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert record["status"] == "completed" and "test/error" in record["metrics"]
