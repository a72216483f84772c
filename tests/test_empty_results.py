"""A wrong result never looks like one: a run that trained on nothing, or tested nothing, is a failed run with
the reason, never a completed record without metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from canonical_network.train import EmptyResult, run
from canonical_network.utils.config import PROJECT_ROOT
from tests.helpers import compose_config, shrink


def test_an_empty_test_split_is_a_failed_record_with_the_reason(tmp_path):
    result = subprocess.run([sys.executable, "-m", "canonical_network.train", "experiment=rotmnist/cnn",
                             "trainer.max_epochs=1", "+trainer.limit_train_batches=2", "+trainer.limit_val_batches=1",
                             "+trainer.limit_test_batches=0", "logger=csv", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "failed" and record["metrics"] == {}
    assert "the test produced no test/* metric (0 test batches ran" in record["error"]


@pytest.mark.parametrize(("limits", "reason"), [
    ({"limit_train_batches": 0, "limit_test_batches": 1}, "no training step ran"),
    ({"limit_train_batches": 2, "limit_test_batches": 0}, r"the test produced no test/\* metric"),
    ({"limit_train_batches": 2, "limit_test_batches": 1}, None),  # the control: a batch of each split completes
])
def test_a_run_that_measured_nothing_raises_before_its_record(tmp_path, limits, reason):
    cfg = shrink(compose_config(["experiment=rotmnist/cnn"], tmp_path))
    for key, value in limits.items():
        cfg.trainer[key] = value
    if reason is None:
        assert "test/error" in run(cfg)["metrics"]
        return
    with pytest.raises(EmptyResult, match=reason):
        run(cfg)
    assert not (tmp_path / "results.json").exists()
