"""Records are counted once and read in their own folder; a run writes only inside its folder; a data setting
away from its default is other data, in every family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from canonical_network.records import DUPLICATE, dataset_of, load_runs, record_from_results
from canonical_network.records import tested_checkpoint as checkpoint_of
from canonical_network.tables import make_tables

NBODY = "canonical_network.data.nbody.NBodyDataModule"
MNIST5K = "canonical_network.data.rotated_mnist.RotatedMNIST5kDataModule"


def _record(folder: Path, seed: int, error: float, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"_target_": MNIST5K, "train_per_class": 360, **config}
    (folder / "results.json").write_text(json.dumps({
        "experiment": "rotmnist/cn_p4", "status": "completed", "seed": seed, "overrides": ["experiment=rotmnist/cn_p4"],
        "metrics": {"test/error": error}, "config": {"data": data, "trainer": {"max_epochs": 100},
                                                      "paths": {"output_dir": str(folder)}}}))
    return folder


def _cell_values(runs) -> list[list[float]]:
    from canonical_network.tables import build_table, paper_tables

    rows = build_table(paper_tables()["rotmnist_table1"], runs)
    return [cell.values for name, cells in rows if name == "CN(p4)-CNN" for cell in cells]


def test_a_copied_run_folder_is_counted_once(tmp_path):
    """``cp -r seed0 seed5`` used to pool as a second seed (``± 0.00, n = 2``)."""
    _record(tmp_path / "cn_p4" / "seed0", 0, 2.5)
    _record(tmp_path / "cn_p4" / "seed1", 1, 3.5)
    shutil.copytree(tmp_path / "cn_p4" / "seed0", tmp_path / "cn_p4" / "seed5")
    runs = load_runs(tmp_path)
    by_folder = {Path(r["path"]).parent.name: r for r in runs}
    assert by_folder["seed5"]["status"] == DUPLICATE and by_folder["seed0"]["status"] == "completed"
    assert str(tmp_path / "cn_p4" / "seed0") in by_folder["seed5"]["error"]
    assert _cell_values(runs) == [[2.5, 3.5]]
    assert "| CN(p4)-CNN | 3.00 ± 0.71 (n=2) |" in make_tables(runs, only="rotmnist_table1")


def test_two_seeds_of_one_config_are_two_runs_and_where_they_ran_does_not_matter(tmp_path):
    _record(tmp_path / "a" / "seed0", 0, 2.5)
    _record(tmp_path / "b" / "seed0", 0, 2.7, num_workers=4)  # the same run again, loaded another way: once
    _record(tmp_path / "c" / "seed0", 0, 2.9, train_per_class=440)  # other data: another run
    statuses = sorted((Path(r["path"]).parent.parent.name, r["status"]) for r in load_runs(tmp_path))
    assert statuses == [("a", "completed"), ("b", DUPLICATE), ("c", "completed")]


def test_a_linked_record_or_run_folder_is_not_read(tmp_path, capsys):
    elsewhere = _record(tmp_path / "elsewhere" / "seed0", 0, 9.9)
    runs_dir = tmp_path / "runs"
    _record(runs_dir / "cn_p4" / "seed0", 0, 2.5)
    (runs_dir / "cn_p4" / "seed1").mkdir()
    (runs_dir / "cn_p4" / "seed1" / "results.json").symlink_to(elsewhere / "results.json")
    (runs_dir / "cn_p4" / "seed2").symlink_to(elsewhere, target_is_directory=True)
    runs = load_runs(runs_dir)
    assert [Path(r["path"]).parent.name for r in runs] == ["seed0"]
    warned = capsys.readouterr().err
    assert "seed1/results.json is a symbolic link" in warned


def test_a_record_whose_checkpoint_lies_outside_its_run_is_not_read(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "epoch_001.ckpt").write_bytes(b"")
    (tmp_path / "planted.ckpt").write_bytes(b"")
    assert checkpoint_of(run, {"status": "completed", "checkpoint": "checkpoints/epoch_001.ckpt"}) is not None
    assert checkpoint_of(run, {"status": "completed", "checkpoint": str(tmp_path / "planted.ckpt")}) is None
    (run / "checkpoints" / "link.ckpt").symlink_to(tmp_path / "planted.ckpt")
    assert checkpoint_of(run, {"status": "completed", "checkpoint": "checkpoints/link.ckpt"}) is None


@pytest.mark.parametrize(("key", "value", "named"), [
    ("num_train", 1000, "num_train 1,000"),
    ("max_train_samples", 500, "max_train_samples 500"),
    ("frame_out", 30, "frame_out 30"),
])
def test_an_nbody_data_setting_is_other_data(key, value, named):
    """N-body runs on different training-set sizes pooled into one cell: ``data.num_train`` is a neutral override
    and the data line did not name the size."""
    default = record_from_results({"experiment": "nbody/cn_gnn", "status": "completed", "seed": 0, "metrics": {},
                                   "overrides": ["experiment=nbody/cn_gnn"],
                                   "config": {"data": {"_target_": NBODY, "num_train": None,
                                                       "max_train_samples": 3000, "frame_out": 40}}})
    other = {**default, f"config.data.{key}": value, "overrides": ["experiment=nbody/cn_gnn", f"data.{key}={value}"]}
    assert dataset_of(default)[0] == "N-body charged particles"
    assert dataset_of(other)[0] == f"N-body charged particles, {named}"


def test_runs_on_other_nbody_training_sizes_get_tables_of_their_own(tmp_path):
    for seed, size in ((0, None), (1, None), (2, 1000), (3, 1000)):
        folder = tmp_path / f"{size}" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({
            "experiment": "nbody/cn_gnn", "status": "completed", "seed": seed, "metrics": {"test/mse": 0.01 + seed},
            "overrides": ["experiment=nbody/cn_gnn"] + ([f"data.num_train={size}"] if size else []),
            "config": {"data": {"_target_": NBODY, "num_train": size}, "trainer": {"max_epochs": 1000}}}))
    text = make_tables(load_runs(tmp_path), only="nbody_table")
    assert text.count("Data: N-body charged particles; budget") == 1
    assert text.count("Data: N-body charged particles, num_train 1,000; budget") == 1


def test_train_refuses_a_linked_checkpoints_folder_and_writes_nothing_through_it(tmp_path):
    from canonical_network.train import run
    from canonical_network.utils.checks import ConfigError
    from tests.helpers import compose_config, shrink

    outside = tmp_path / "outside"
    outside.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
    cfg = shrink(compose_config(["experiment=rotmnist/cnn"], run_dir))
    with pytest.raises(ConfigError, match="checkpoints is a symbolic link"):
        run(cfg)
    assert list(outside.iterdir()) == []
    assert not (run_dir / "results.json").exists()
