"""Every row of the adapt tables runs end to end under ``debug=fast`` through ``canonical_network.train.run``: the
embedded-digit rows on the real 5k data, the CIFAR-10 / STL-10 rows on tiny fake files in torchvision's format (from
scratch and at a 32-pixel input, the ViTs at a tiny size: no ImageNet weights here, and CPU time matters), and an
STL-10 run fills its table."""

from __future__ import annotations

import pytest

from canonical_network import tables
from canonical_network.records import load_runs, read_results
from canonical_network.train import run
from tests.fake_torchvision_data import accept_checksums, write_cifar10, write_stl10
from tests.helpers import EXPERIMENTS, compose_config, shrink

MNIST_ROWS = [e for e in EXPERIMENTS if e.startswith("adapt_mnist/")]
#: ViT-B/16's 86 M parameters take ~15 s per run here, most of it writing two 350 MB checkpoints: the ViT rows run
#: at a tiny size (the full size is built by tests/test_configs.py)
TINY_VIT = ["prediction.vit.num_layers=1", "prediction.vit.num_heads=2", "prediction.vit.hidden_dim=16",
            "prediction.vit.mlp_dim=32"]
ADAPT_ROWS = [e for e in EXPERIMENTS if e.startswith("adapt/")]


def test_every_row_of_both_tables_has_an_experiment():
    assert set(MNIST_ROWS) == {"adapt_mnist/resnet18", "adapt_mnist/resnet18_aug", "adapt_mnist/cn_c8_resnet18",
                               "adapt_mnist/cn_c8_prior_resnet18"}
    backbones = ("resnet50", "vit_b_16")
    assert set(ADAPT_ROWS) == {f"adapt/{r.format(b)}" for b in backbones
                               for r in ("{}", "{}_aug", "cn_c8_{}", "cn_c8_prior_{}")}
    for name in ("adapt_table", "adapt_table_c8", "adapt_mnist_table", "adapt_mnist_table_c8", "adapt_mnist_table_worst",
                 "adapt_mnist_identity"):
        assert {row["experiment"] for row in tables.paper_tables()[name]["rows"]} <= set(EXPERIMENTS)


def _check_record(tmp_path, experiment: str) -> dict:
    written = read_results(tmp_path)
    assert written["experiment"] == experiment and written["status"] == "completed", written.get("error")
    metrics = written["metrics"]
    orbit = [metrics[f"test/orbit/error_g{k}"] for k in range(8)]  # C8: model.orbit_rotations=8
    assert metrics["test/orbit/error_mean"] == pytest.approx(sum(orbit) / 8, abs=1e-3)
    return written


@pytest.mark.parametrize("experiment", MNIST_ROWS)
def test_adapt_mnist_row_runs_end_to_end(experiment, tmp_path, one_thread):
    cfg = shrink(compose_config([f"experiment={experiment}", "debug=fast", "data.batch_size=16"], tmp_path))
    # Mondal et al.'s protocol: upright training and test digits, the C8 orbit of the test digits as rotated test
    assert (cfg.data.train_rotation, cfg.data.test_rotation, cfg.model.orbit_rotations) == ("none", "none", 8)
    run(cfg)
    written = _check_record(tmp_path, experiment)
    assert written["config"]["data"]["train_rotation"] == "none"
    # the identity rate on upright digits is what the prior is for; the backbone alone always keeps them upright
    identity = written["metrics"]["test/identity_rate"]
    assert 0.0 <= identity <= 1.0 and (identity == 1.0 or "cn_c8" in experiment)
    for table in ("adapt_mnist_table", "adapt_mnist_table_c8", "adapt_mnist_table_worst", "adapt_mnist_identity"):
        text = tables.make_tables(load_runs(tmp_path), only=table)
        assert "upright training and test" in text  # its own data group: never pooled with the paper's protocol
        row = next(r for r in tables.paper_tables()[table]["rows"] if r["experiment"] == experiment)
        assert "(n=1)" in next(line for line in text.splitlines() if line.startswith(f"| {row['name']} |"))


def _fake_data_run(experiment: str, tmp_path, monkeypatch, data: str = "cifar10") -> dict:
    root = tmp_path / "data"
    (write_cifar10 if data == "cifar10" else write_stl10)(root)
    accept_checksums(monkeypatch, root)
    out = tmp_path / "run"
    cfg = shrink(compose_config([f"experiment={experiment}", "debug=fast", f"data={data}", f"data.root={root}",
                                 "data.batch_size=4", "data.num_workers=0", "prediction.weights=null",
                                 "prediction.input_size=32", *(TINY_VIT if "vit" in experiment else [])], out))
    run(cfg)
    return _check_record(out, experiment)


@pytest.mark.parametrize("experiment", ADAPT_ROWS)
def test_adapt_row_runs_end_to_end_on_fake_cifar10(experiment, tmp_path, monkeypatch, one_thread):
    written = _fake_data_run(experiment, tmp_path, monkeypatch)
    assert written["config"]["data"]["_target_"].endswith("CIFAR10DataModule")


def test_adapt_row_runs_on_fake_stl10_and_fills_its_table(tmp_path, monkeypatch, one_thread):
    written = _fake_data_run("adapt/cn_c8_prior_resnet50", tmp_path, monkeypatch, data="stl10")
    assert written["config"]["canonicalization"]["prior_weight"] == 100.0
    text = tables.make_tables(load_runs(tmp_path), only="adapt_table_c8")
    assert "Data: STL-10" in text
    row = next(line for line in text.splitlines() if line.startswith("| CN(C8)+prior-ResNet50"))
    assert "(n=1)" in row


def test_per_class_errors_split_a_checkpoints_errors_consistently(tmp_path, one_thread):
    """scripts/per_class_errors.py (the figures that say where an adapted model errs on upright digits)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "scripts" / "per_class_errors.py"
    spec = importlib.util.spec_from_file_location("per_class_errors", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cfg = shrink(compose_config(["experiment=adapt_mnist/cn_c8_prior_resnet18", "debug=fast", "data.batch_size=16"],
                                tmp_path))
    run(cfg)
    ckpt = str(next((tmp_path / "checkpoints").glob("epoch_*.ckpt")))
    r = script.per_class(ckpt, ["data.batch_size=250"])
    assert r["n"] == 1000 and sum(c["n"] for c in r["per_class"].values()) == 1000  # the 1,000 upright test digits
    # the overall figures are the per-class ones weighted by class size, and the identity split's
    assert r["error"] == pytest.approx(sum(c["n"] * c["error"] for c in r["per_class"].values()) / 1000, abs=1e-3)
    share = r["identity_rate"] / 100
    if r["error_if_identity"] is not None and r["error_if_turned"] is not None:
        mixed = share * r["error_if_identity"] + (1 - share) * r["error_if_turned"]
        assert r["error"] == pytest.approx(mixed, abs=1e-3)
    assert sum(c["count"] for c in r["confusions"]) <= round(r["error"] * 10)
    with pytest.raises(SystemExit, match="data.<key>=<value> overrides only"):
        script.per_class(ckpt, ["model.orbit_rotations=8"])
