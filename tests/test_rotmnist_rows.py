"""Every Rotated MNIST row runs end to end through ``canonical_network.train.run`` (a tiny fast-dev run).

CN(pretrained) needs a finished run's checkpoint and is run in tests/test_pretrained.py.
"""

from __future__ import annotations

import pytest
from omegaconf import open_dict

from canonical_network.records import read_results
from canonical_network.train import run
from tests.helpers import EXPERIMENTS, compose_config, shrink

# gcnn_p64_eqparams: ~45 s here (its checkpoints carry ~500 MB of sampled bases); built and checked for
# invariance and parameter count in tests/test_gcnn_and_opt.py, run end to end under `make test-full`.
SLOW = {"rotmnist/gcnn_p64_eqparams"}
ROWS = [pytest.param(e, marks=pytest.mark.slow) if e in SLOW else e
        for e in EXPERIMENTS if e.startswith("rotmnist/") and e != "rotmnist/cn_pretrained"]


def test_every_table_row_has_an_experiment():
    expected = {"cnn", "cnn_aug", "gcnn_p4", "gcnn_p4_eqparams", "gcnn_p64_eqparams", "cn_pca", "cn_p4_frozen",
                "cn_opt", "cn_p4", "cn_p64", "cn_pretrained"}
    assert {f"rotmnist/{name}" for name in expected} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", ROWS)
def test_row_runs_end_to_end_with_orbit_metrics(experiment, tmp_path):
    cfg = shrink(compose_config([f"experiment={experiment}", "data.batch_size=16"], tmp_path))
    with open_dict(cfg):
        cfg.data.eval_rotations = 1
    run(cfg)
    written = read_results(tmp_path)
    assert written["experiment"] == experiment and written["status"] == "completed"
    metrics = written["metrics"]
    orbit = [metrics[f"test/orbit/error_g{k}"] for k in range(4)]
    # Percentages over the test batch: one image more or less moves them by ≥ 100 / 16 (one batch of 16,
    # limit_test_batches=1), float32 averaging by ≤ ~1e-5, so half a step separates equal from different.
    tol = 50.0 / 16
    assert orbit[0] == pytest.approx(metrics["test/error"], abs=tol)  # g0 is the identity
    assert metrics["test/orbit/error_max"] == pytest.approx(max(orbit), abs=tol)
    assert metrics["test/orbit/error_worst"] >= metrics["test/orbit/error_max"] - tol
    assert 0.0 <= metrics["test/orbit/inconsistent"] <= 100.0
    assert written["params"]["total"] > 0
