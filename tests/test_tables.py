"""The results → paper tables tool, on results.json files written the way train.py writes them."""

from __future__ import annotations

import itertools
import json

import pytest

from canonical_network import tables
from canonical_network.records import RESULTS_FILE, read_results, write_results

_SEEDS = itertools.count()


def write_result(folder, name, experiment, metrics, status="completed", config=None, error=None, seed=None):
    """A record; each of its own seed unless given (records of one seed and config are one run, counted once)."""
    folder = folder / name
    folder.mkdir(parents=True)
    seed = next(_SEEDS) if seed is None else seed
    record = {"experiment": experiment, "status": status, "seed": seed, "metrics": metrics, "config": config or {}}
    if error:
        record["error"] = error
    write_results(folder, record)


def test_records_are_written_atomically_and_read_back(tmp_path):
    record = {"experiment": "rotmnist/cnn", "status": "completed", "seed": 0, "overrides": [],
              "metrics": {"test/error": 2.5}, "config": {"seed": 0}}
    path = write_results(tmp_path, record)
    assert path == tmp_path / "results.json" == tmp_path / RESULTS_FILE  # the on-disk name is a contract
    assert path.read_text() == json.dumps(record, indent=2)  # the on-disk format of existing runs
    assert [p.name for p in tmp_path.iterdir()] == [RESULTS_FILE]  # no temporary file left behind
    assert read_results(path) == read_results(tmp_path) == record


def test_mean_std_paper_and_difference(tmp_path):
    for i, err in enumerate([2.0, 3.0, 4.0]):
        write_result(tmp_path, f"cnn{i}", "rotmnist/cnn", {"test/error": err})
    text = tables.make_tables(tables.load_runs(tmp_path), only="rotmnist_table1")
    row = next(line for line in text.splitlines() if line.startswith("| CNN (base)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["CNN (base)", "3.00 ± 1.00 (n=3)", "4.90 ± 0.20", "-1.90"]
    assert "| CN(p4)-CNN | missing |" in text


def test_failed_job_shows_its_reason(tmp_path):
    write_result(tmp_path, "ok", "rotmnist/cn_p4", {"test/error": 2.5})
    write_result(tmp_path, "bad", "rotmnist/cn_pca", {}, status="failed", error="RuntimeError: out of memory")
    text = tables.make_tables(tables.load_runs(tmp_path))
    assert "missing: RuntimeError: out of memory" in text
    assert "2.50 (n=1)" in text


def test_grid_and_column_matching_by_config(tmp_path):
    target = "canonical_network.canonicalization.image.GCNNCanonicalizer"
    cnn, resnet = "canonical_network.prediction.cnn.CNN", "canonical_network.prediction.torchvision_backbones.TorchvisionBackbone"
    # the last run has Table 6's canonicalizer in front of another backbone (adapt_mnist/cn_c8_resnet18): not a cell
    for layers, order, err, backbone in [(1, 4, 2.6, cnn), (3, 64, 1.9, cnn), (3, 64, 2.1, cnn), (3, 8, 7.0, resnet)]:
        config = {"canonicalization": {"_target_": target, "num_layers": layers, "num_rotations": order,
                                       "freeze": False}, "prediction": {"_target_": backbone}}
        write_result(tmp_path, f"{layers}_{order}_{err}", "rotmnist/ablation", {"test/error": err}, config=config)
    runs = tables.load_runs(tmp_path)
    rows = dict(tables.build_table(tables.paper_tables()["rotmnist_table6"], runs))
    assert rows["1 layer"][0].values == [2.6] and rows["1 layer"][0].paper == (2.52, 0.12)
    assert rows["3 layers"][4].values == [1.9, 2.1]
    assert rows["3 layers"][4].mean == pytest.approx(2.0)
    assert rows["2 layers"][1].values == [] and rows["3 layers"][1].values == []


def test_scaled_metrics_and_latex(tmp_path):
    write_result(tmp_path, "a", "modelnet/pointnet", {"test/acc": 0.80}, config={"data": {"rotation": "z/z"}})
    text = tables.make_tables(tables.load_runs(tmp_path), fmt="latex", only="modelnet_table")
    assert r"80.0 (n=1)" in text and r"$\pm$ 0.0 (n=1)" not in text and r"\begin{tabular}" in text


def test_cli_errors_and_output(tmp_path, capsys):
    write_result(tmp_path, "a", "rotmnist/cnn", {"test/error": 5.0})
    assert tables.main([str(tmp_path)]) == 0
    assert "Table 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tables.main([str(tmp_path), "--table", "no_such_table"])


def test_wandb_reader_builds_the_same_records():
    class FakeRun:
        def __init__(self, exp, err):
            self.config = {"experiment_name": exp, "seed": 1, "canonicalization": {"num_rotations": 4}}
            self.summary = {"test/error": err, "val/acc": 0.9}
            self.state = "finished"

    class FakeApi:
        def runs(self, project, filters=None):
            assert project == "me/canonical-network" and filters == {"group": "rotmnist_table1"}
            return [FakeRun("rotmnist/cn_p4", 2.0), FakeRun("rotmnist/cn_p4", 3.0)]

    runs = tables.load_wandb_runs("me/canonical-network", "rotmnist_table1", api=FakeApi())
    assert runs[0]["config.canonicalization.num_rotations"] == 4
    text = tables.make_tables(runs, only="rotmnist_table1")
    assert "2.50 ± 0.71 (n=2)" in text

    class DivergedRun(FakeRun):  # finished to W&B, diverged to its record (train writes the status to the summary)
        def __init__(self):
            super().__init__("rotmnist/cn_p4", 90.0)
            self.summary["status"] = "diverged"

    class WithDiverged(FakeApi):
        def runs(self, project, filters=None):
            return [*super().runs(project, filters), DivergedRun()]

    runs = tables.load_wandb_runs("me/canonical-network", "rotmnist_table1", api=WithDiverged())
    assert [r["status"] for r in runs] == ["completed", "completed", "diverged"]
    assert "2.50 ± 0.71 (n=2)" in tables.make_tables(runs, only="rotmnist_table1")  # 90.0 not pooled


def test_several_folders_and_another_metric(tmp_path, capsys):
    write_result(tmp_path / "sweep_a", "cnn", "rotmnist/cnn", {"test/error": 5.0, "test/orbit/error_worst": 9.0})
    write_result(tmp_path / "sweep_b", "cnn", "rotmnist/cnn", {"test/error": 7.0, "test/orbit/error_worst": 11.0})
    folders = [str(tmp_path / "sweep_a"), str(tmp_path / "sweep_b")]
    assert tables.main([*folders, "--table", "rotmnist_table1"]) == 0
    assert "| CNN (base) | 6.00 ± 1.41 (n=2) | 4.90 ± 0.20 | +1.10 |" in capsys.readouterr().out
    assert tables.main([*folders, "--table", "rotmnist_table1", "--metric", "test/orbit/error_worst"]) == 0
    out = capsys.readouterr().out
    assert "[ours: test/orbit/error_worst]" in out and "| CNN (base) | 10.00 ± 1.41 (n=2) |" in out
    with pytest.raises(SystemExit):
        tables.main([*folders, "--metric", "test/nonsense"])
    assert "test/orbit/error_worst" in capsys.readouterr().err  # the error lists what was logged


SHAPES = "canonical_network.data.synthetic_shapes.SyntheticShapesDataModule"
MNIST5K = "canonical_network.data.rotated_mnist.RotatedMNIST5kDataModule"


def test_other_data_is_labelled_and_never_compared_with_the_paper(tmp_path):
    config = {"data": {"_target_": SHAPES, "rotation": "z/z"}, "trainer": {"max_epochs": 10}}
    write_result(tmp_path, "a", "modelnet/pointnet", {"test/acc": 0.80}, config=config)
    text = tables.make_tables(tables.load_runs(tmp_path), only="modelnet_table")
    assert "Data: synthetic_shapes (not the paper's data); budget: ≤ 10 epochs." in text
    row = next(line for line in text.splitlines() if line.startswith("| PointNet |"))
    assert row.startswith("| PointNet | 80.0 (n=1) | (other data) | – |") and "85.9" not in row


def test_budgets_are_never_pooled(tmp_path):
    for name, epochs, err in (("long", 100, 5.0), ("smoke", 1, 60.0)):
        config = {"data": {"_target_": MNIST5K}, "trainer": {"max_epochs": epochs}}
        write_result(tmp_path, name, "rotmnist/cnn", {"test/error": err}, config=config)
    text = tables.make_tables(tables.load_runs(tmp_path), only="rotmnist_table1")
    assert text.index("budget: ≤ 100 epochs") < text.index("budget: ≤ 1 epochs")
    assert "| CNN (base) | 5.00 (n=1) | 4.90 ± 0.20 | +0.10 |" in text
    assert "| CNN (base) | 60.00 (n=1) |" in text


def test_another_metric_knows_its_unit_and_direction(tmp_path):
    write_result(tmp_path, "a", "rotmnist/cnn", {"test/error": 5.0, "test/acc": 0.95})
    text = tables.make_tables(tables.load_runs(tmp_path), only="rotmnist_table1", metric="test/acc")
    assert "(test/acc, higher is better)" in text
    # an accuracy in % beside the paper's error would be nonsense: shown in %, not compared
    assert "| CNN (base) | 95.00 (n=1) | (another metric) | – |" in text


def test_latex_escapes_special_characters(tmp_path):
    write_result(tmp_path, "a", "rotmnist/gcnn_p4_eqparams", {"test/error": 2.5})
    text = tables.make_tables(tables.load_runs(tmp_path), fmt="latex", only="rotmnist_table1")
    row = next(line for line in text.splitlines() if line.startswith("G-CNN (p4 \\& = params)"))
    assert row.count(" & ") == 3  # Method, ours, paper, Δ: the row name's "&" is escaped
    assert row.startswith("G-CNN (p4 \\& = params) & 2.50 (n=1) & 2.36 $\\pm$ 0.15 & +0.14")


def test_runs_pool_only_when_they_differ_by_the_seed(tmp_path):
    """A run with another learning rate, or one limited to a few batches an epoch, is not the paper's row:
    each set of overrides makes its own row, named after it, without the paper's number."""
    def result(name, error, overrides):
        folder = tmp_path / name
        folder.mkdir()
        seed = int(next((o.split("=")[1] for o in overrides if o.startswith("seed=")), 0))
        write_results(folder, {"experiment": "rotmnist/cnn", "status": "completed", "seed": seed, "metrics":
                               {"test/error": error}, "overrides": ["experiment=rotmnist/cnn", *overrides],
                               "config": {}})

    result("default0", 2.0, ["seed=0"])
    result("default1", 4.0, ["seed=1", "logger=csv"])
    result("lr", 50.0, ["model.optimizer.lr=0.05"])
    result("short", 80.0, ["trainer.limit_train_batches=2"])
    rows = dict(tables.build_table(tables.paper_tables()["rotmnist_table1"], tables.load_runs(tmp_path)))
    assert rows["CNN (base)"][0].values == [2.0, 4.0] and rows["CNN (base)"][0].paper is not None
    assert rows["CNN (base) [model.optimizer.lr=0.05]"][0].values == [50.0]
    assert rows["CNN (base) [model.optimizer.lr=0.05]"][0].paper is None
    assert rows["CNN (base) [trainer.limit_train_batches=2]"][0].values == [80.0]


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', '{"experiment": "rotmnist/cnn", "metrics": [1]}',
                                     '{"experiment": "rotmnist/cnn", "metrics": {"test/error": "low"}}'])
def test_a_malformed_record_is_named_and_skipped(tmp_path, capsys, content):
    write_result(tmp_path, "ok", "rotmnist/cnn", {"test/error": 2.5})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / RESULTS_FILE).write_text(content)
    assert tables.main([str(tmp_path), "--table", "rotmnist_table1"]) == 0
    out, err = capsys.readouterr()
    assert f"skipping unreadable {tmp_path / 'bad' / RESULTS_FILE}: not a run record" in err
    assert "2.50 (n=1)" in out


def test_a_row_leaves_the_runs_it_excludes_to_the_row_that_matches_them(tmp_path):
    # nbody_augmentation_table: the GNN row matches every GNN at 1,000 epochs, records from before
    # data.augmentation existed included; it excludes the augmented runs, which are the next row's
    def gnn(name, mse, augmentation=None):
        data = {"augmentation": augmentation} if augmentation else {}
        write_result(tmp_path, name, "nbody/gnn", {"test/mse": mse},
                     config={"trainer": {"max_epochs": 1000}, "data": data})

    gnn("old0", 0.014), gnn("old1", 0.015), gnn("none", 0.0145, "none"), gnn("aug0", 0.0047, "o3")
    spec = tables.paper_tables()["nbody_augmentation_table"]
    rows = dict(tables.build_table(spec, tables.load_runs(tmp_path), split_variants=False))
    assert sorted(rows["GNN"][0].values) == [0.014, 0.0145, 0.015]
    assert rows["GNN (O(3) augmentation)"][0].values == [0.0047]
