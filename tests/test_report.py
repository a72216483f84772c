"""The reproduction report: statistics, verdicts, grouping by data and budget, ablations kept apart."""

from __future__ import annotations

import json
import math
import sys

import pytest

from canonical_network import report
from canonical_network.records import write_results

MNIST5K = "canonical_network.data.rotated_mnist.RotatedMNIST5kDataModule"
SHAPES = "canonical_network.data.synthetic_shapes.SyntheticShapesDataModule"


def write_run(root, name, experiment, seed, metrics, overrides=(), data=MNIST5K, max_epochs=100, epochs=49,
              curve=None, extra_config=None, best_val=None, environment=None):
    folder = root / name
    (folder / "csv").mkdir(parents=True)
    config = {"data": {"_target_": data}, "trainer": {"max_epochs": max_epochs}, **(extra_config or {})}
    record = {"experiment": experiment, "status": "completed", "seed": seed, "metrics": metrics,
              "overrides": [f"experiment={experiment}", f"seed={seed}", *overrides], "epochs": epochs,
              "wall_time_s": 60.0, "config": config,
              "environment": environment or {"machine": "Test CPU, 2 cores, CPU"}, "best_val": best_val or {}}
    write_results(folder, record)
    lines = ["epoch,step,val/error,val/acc"] + [f"{e},{10 * e},{v},{1 - v / 100}" for e, v in (curve or [])]
    (folder / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    return folder


def claim_row(text, claim):
    """The line of a claims table (scorecard, other claims) whose claim cell starts with ``claim``."""
    return next(line for line in text.splitlines()
                if line.startswith("| ") and line.split(" | ")[1].startswith(claim))


def verdict_of(text, claim):
    return claim_row(text, claim).rsplit("**", 2)[-2]


def test_mean_ci_is_the_student_t_interval():
    mean, half = report.mean_ci([1.0, 2.0, 3.0])
    # sd = 1, n = 3, t_{0.975, 2} = 4.3027
    # 4.302653 is t_{0.975, 2} to 7 significant digits: ±0.5e-6 absolute, the only error that matters here
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), rel=0.5e-6 / 4.302653)
    assert report.mean_ci([5.0]) == (5.0, None)


def test_welch_interval_matches_scipy():
    from scipy import stats

    a, b = [1.0, 1.2, 0.9, 1.1], [2.0, 2.5, 1.8]
    diff, half, p = report.welch_interval(a, b)
    expected = stats.ttest_ind(a, b, equal_var=False)
    # Two float64 evaluations of the t distribution (incomplete beta and its inverse, accurate to ~1e-13
    # relative) and diff ± half (cancellation ≤ ~10 here): ≤ ~1e-12; 2²² eps64 ≈ 9e-10 leaves room for
    # another scipy's special functions.
    rel = 2**22 * sys.float_info.epsilon
    assert p == pytest.approx(expected.pvalue, rel=rel)
    ci = expected.confidence_interval(0.95)
    assert diff - half == pytest.approx(ci.low, rel=rel) and diff + half == pytest.approx(ci.high, rel=rel)
    assert report.welch_interval([1.0], b)[1] is None


@pytest.mark.parametrize(
    "relation,diff,half,lower,expected",
    [
        ("better", -2.0, 1.0, True, "holds"),
        ("better", 2.0, 1.0, True, "does not hold"),
        ("better", -0.5, 1.0, True, "not resolved"),
        ("better", 2.0, 1.0, False, "holds"),
        ("better", -2.0, None, True, "not resolved (n < 2)"),
        ("equal", 0.1, 0.3, True, "holds"),
        ("equal", 3.0, 0.5, True, "does not hold"),
        ("equal", 0.8, 0.5, True, "not resolved"),
    ],
)
def test_verdicts(relation, diff, half, lower, expected):
    claim = report.Claim("x", "rotmnist_table1", ("a", 0), ("b", 0), relation=relation, tolerance=1.0)
    assert report.verdict(claim, diff, half, lower) == expected


def test_report_tables_claims_variants_and_figures(tmp_path):
    runs = tmp_path / "runs"
    for seed, (cnn, p64) in enumerate([(6.0, 3.0), (6.4, 3.2), (6.2, 3.1)]):
        write_run(runs, f"cnn{seed}", "rotmnist/cnn", seed, {"test/error": cnn},
                  curve=[(0, 20.0), (1, 10.0), (2, cnn)])
        write_run(runs, f"p64_{seed}", "rotmnist/cn_p64", seed, {"test/error": p64},
                  curve=[(0, 15.0), (1, 8.0), (2, p64)])
    write_run(runs, "p4_0", "rotmnist/cn_p4", 0, {"test/error": 4.0})  # n = 1: its claims stay unresolved
    # An ablation of the same row must not enter the CN(p64) cell.
    write_run(runs, "p64_wide", "rotmnist/cn_p64", 0, {"test/error": 30.0},
              overrides=["canonicalization.hidden_channels=32"], best_val={"val/acc": 0.5})
    # A variant with n = 2 on both sides: its validation difference gets an interval.
    for seed, (p64, p4) in enumerate([(0.95, 0.90), (0.97, 0.94)]):
        write_run(runs, f"p64_t{seed}", "rotmnist/cn_p64", seed, {"test/error": 3.0},
                  overrides=["canonicalization.temperature=0.1"], best_val={"val/acc": p64}, max_epochs=50)
        write_run(runs, f"p64_50_{seed}", "rotmnist/cn_p64", seed, {"test/error": 3.0}, best_val={"val/acc": p4},
                  max_epochs=50)
    # A short smoke run is another budget: its own table, never pooled with the 100-epoch runs.
    write_run(runs, "cnn_smoke", "rotmnist/cnn", 0, {"test/error": 50.0}, max_epochs=1, epochs=0)
    out = tmp_path / "report"
    path = report.build_report([runs], out)
    text = path.read_text()

    row = next(line for line in text.splitlines() if line.startswith("| CN(p64)-CNN |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    mean, half = report.mean_ci([3.0, 3.2, 3.1])
    assert cells[1] == "≤ 100 epochs" and cells[2] == f"{mean:.2f} ± {half:.2f}" and cells[3] == "3"
    assert cells[4] == "49"
    # 5,000 digits are not the paper's MNIST-rot: its number stays visible, marked, and no Δ is printed
    assert cells[5] == "1.99 ± 0.10 †" and cells[6] == "–"
    assert "| CN(p64)-CNN | ≤ 1 epochs |" not in text  # the budget of a row without runs there is not listed
    assert "| CNN (base) | ≤ 1 epochs | 50.00 |" in text  # the smoke run: shown at its own budget
    assert "| CNN (base) | ≤ 100 epochs | 6.20 ± " in text  # not pooled with the smoke run's 50.0

    claim = claim_row(text, "CN(p64)-CNN beats the CNN")
    # scored at the largest budget with >= 2 seeds on both sides, each side as mean ± CI (n)
    assert "**holds**" in claim and f"{mean:.2f} ± {half:.2f} (n 3) vs 6.20 ± " in claim and "≤ 100 epochs" in claim
    claim = claim_row(text, "CN(p4)-CNN beats the CNN")
    assert "**not resolved (n < 2)**" in claim

    assert "## Ablations and variants" in text and "canonicalization.hidden_channels=32" in text
    variant = next(line for line in text.splitlines() if "canonicalization.hidden_channels=32` |" in line)
    # beside the row's own runs of the same data and budget, with the difference (n = 1: no interval)
    assert "| 30 (1) | 3.1 ± 0.25 (3) | +26.9 (n < 2) |" in variant
    # the validation metric a default is chosen on: the rows without best_val give no difference
    assert "| val/acc – |" in variant
    variant = next(line for line in text.splitlines() if "canonicalization.temperature=0.1` |" in line)
    diff, half, _ = report.welch_interval([0.95, 0.97], [0.90, 0.94])
    assert f"| val/acc {diff:+.3g} ± {half:.2g} |" in variant
    assert "Test CPU, 2 cores, CPU" in text
    assert "| `experiment=rotmnist/cn_p64 canonicalization.hidden_channels=32` | 0 | completed |" in text
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert any(name.endswith("_bars.png") for name in figures)
    assert any(name.endswith("_val_curves.png") for name in figures)

    # Rebuilding from the same runs gives the same file.
    assert report.build_report([runs], out).read_text() == text


def test_late_curves_are_noted_but_not_a_first_validation_after_several_epochs(tmp_path):
    runs = tmp_path / "runs"
    # validated every epoch but the CSV starts at epoch 15: earlier epochs lost to a resume
    write_run(runs, "cnn0", "rotmnist/cnn", 0, {"test/error": 6.0}, curve=[(e, 10.0 - e / 10) for e in range(15, 20)])
    # validated every 5th epoch: its first validation is after epoch index 4, so the curve is whole
    write_run(runs, "p64_0", "rotmnist/cn_p64", 0, {"test/error": 3.0},
              curve=[(e, 8.0 - e / 10) for e in range(4, 30, 5)],
              extra_config={"trainer": {"max_epochs": 100, "check_val_every_n_epoch": 5}})
    # validated every 5th epoch but starting at epoch 14: two validations lost
    write_run(runs, "p64_1", "rotmnist/cn_p64", 1, {"test/error": 3.2},
              curve=[(e, 8.0 - e / 10) for e in range(14, 30, 5)],
              extra_config={"trainer": {"max_epochs": 100, "check_val_every_n_epoch": 5}})
    text = report.build_report([runs], tmp_path / "report").read_text()
    note = next(line for line in text.splitlines() if line.startswith("Curves that start late"))
    assert "CNN (base) seed 0 (from epoch 15)" in note and "CN(p64)-CNN seed 1 (from epoch 14)" in note
    assert "CN(p64)-CNN seed 0" not in note


def test_no_paper_delta_on_other_data(tmp_path):
    runs = tmp_path / "runs"
    for seed in range(2):
        write_run(runs, f"pn{seed}", "modelnet/pointnet", seed, {"test/acc": 0.5 + 0.01 * seed}, data=SHAPES,
                  extra_config={"data": {"_target_": SHAPES, "rotation": "z/z"}})
    text = report.build_report([runs], tmp_path / "out").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| PointNet | z/z |"))
    # the paper's number stays visible (quoted from Vector Neurons), marked as another protocol: no Δ
    assert row.endswith("| 85.9 (quoted) † | – |")
    assert "synthetic_shapes (not the paper's data)" in text and "data: synthetic_shapes" in text


def test_cli_refuses_empty_and_missing_folders(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert "is not a folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no results.json"):
        report.main([str(tmp_path / "empty"), "--out", str(tmp_path / "o")])


def test_claims_are_also_checked_under_an_ablation_run_on_both_sides(tmp_path):
    runs = tmp_path / "runs"
    ablation = ["callbacks.early_stopping=null", "test_ckpt=last"]
    for seed, (p64, aug) in enumerate([(2.6, 3.2), (2.7, 3.3)]):
        for name, row, error in ((f"p64_{seed}", "rotmnist/cn_p64", p64), (f"aug_{seed}", "rotmnist/cnn_aug", aug)):
            write_run(runs, name, row, seed, {"test/error": error}, overrides=ablation,
                      extra_config={"callbacks": {"early_stopping": None}})
    text = report.build_report([runs], tmp_path / "out").read_text()
    assert "not resolved: no runs at the rows' own settings" in claim_row(text, "Canonicalization beats augmentation")
    claim = next(line for line in text.splitlines()
                 if line.startswith("  - The claim with `test_ckpt=last`") and "CN(p64)" not in line)
    # no early stopping is the budget (runs of another budget are never pooled); test_ckpt=last the ablation
    assert "no early stopping" in claim and "(n 2, 2)" in claim
    assert "-0.60 ± 0.30" in claim and "**holds**" in claim  # Welch: sd 0.071 each, 2 df, t = 4.30
    assert "| CN(p64)-CNN |" not in text.split("## Ablations")[0].split("## Tables")[1]  # no row table from them


def test_diagnostics_of_trained_models_are_tabled_when_present(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "p4_0", "rotmnist/cn_p4", 0, {"test/error": 4.0})
    out = tmp_path / "report"
    assert "## Diagnostics" not in report.build_report([runs], out).read_text()  # none written: no section
    folder = out / report.DIAGNOSTICS / "cn_p4"
    folder.mkdir(parents=True)
    # the keys diagnose writes (canonical_network/diagnostics), with values of a C4 canonicalizer
    (folder / "diagnostics.json").write_text(json.dumps({
        "experiment": "rotmnist/cn_p4",
        "equivariance": {"exact": {"max_rel": 6.2e-15}, "continuous": {"mean_rel": 0.26}},
        "canonicalizer": {"max_rel": 2.4e-16},
        "pose": {"entropy_bits": 1.99, "max_entropy_bits": 2.0, "ambiguity_rate": 0.008},
        "continuity": {"jump": 0.1, "jump_rate": 0.035, "element_change_rate": 0.031},
        "figures": ["figures/canonical_pairs.png"],
    }))
    text = report.build_report([runs], out).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| rotmnist/cn_p4 | 6.2e-15"))
    assert "| 1.99 of 2.00 | 0.8 % | 3.5 % (> 0.1) | 3.1 % |" in row
    assert "(diagnostics/cn_p4/canonical_pairs.png)" in row


@pytest.mark.parametrize(("key", "label"), [("train_rotation", "upright training"), ("test_rotation", "upright test")])
def test_upright_protocols_are_their_own_data_never_compared_with_the_paper(key, label):
    from canonical_network.records import dataset_of

    run = {"config.data._target_": "canonical_network.data.rotated_mnist.RotatedMNIST5kDataModule"}
    name, comparable = dataset_of(run)
    assert label not in name
    name, comparable = dataset_of({**run, f"config.data.{key}": "none"})
    assert name.endswith(label) and comparable is False


def test_upright_training_and_test_together_name_both():
    from canonical_network.records import dataset_of

    run = {"config.data._target_": MNIST5K, "config.data.train_rotation": "none", "config.data.test_rotation": "none"}
    assert dataset_of(run) == ("rotated_mnist_5k (5,000 MNIST digits, ours), upright training and test", False)


def test_synthetic_shapes_sizes_name_their_own_data_and_are_no_variant():
    from canonical_network.records import dataset_of, variant_of

    shapes = "canonical_network.data.synthetic_shapes.SyntheticShapesDataModule"
    small = {"config.data._target_": shapes, "config.data.num_points": 256, "config.data.num_train": 1000,
             "overrides": ["experiment=modelnet/pointnet", "data.num_points=256", "data.num_train=1000"]}
    full = {**small, "config.data.num_points": 1024, "config.data.num_train": 2000}
    assert dataset_of(small) == ("synthetic_shapes (not the paper's data), 256 points, 1,000 training clouds", False)
    assert dataset_of(full)[0] != dataset_of(small)[0]  # never pooled in one table
    assert variant_of(small) == ()  # a row of that table, not an ablation of the 1,024-point row
    # a difficulty other than today's defaults is other data too: named, never pooled with the defaults' runs, no
    # variant; read from the recorded config, so a run made at an earlier default keeps its difficulty's name
    from canonical_network.data import synthetic_shapes40 as s40

    shapes40 = "canonical_network.data.synthetic_shapes40.SyntheticShapes40DataModule"
    default40 = {"config.data._target_": shapes40, "config.data.num_points": 1024, "config.data.num_train": 4000,
                 "config.data.scale_jitter": s40.SCALE_JITTER, "config.data.part_dropout": 0.3,
                 "overrides": ["experiment=modelnet/dgcnn", "data=synthetic_shapes40"]}
    assert dataset_of(default40)[0] == "synthetic_shapes40 (40 classes, not the paper's data), 1,024 points, 4,000 training clouds"
    other = round(s40.SCALE_JITTER + 0.1, 2)
    harder = {**default40, "config.data.scale_jitter": other, "config.data.part_dropout": 0.45,
              "overrides": [*default40["overrides"], f"data.scale_jitter={other}", "data.part_dropout=0.45"]}
    assert dataset_of(harder)[0] == dataset_of(default40)[0] + f", part_dropout 0.45, scale_jitter {other:g}"
    earlier = {**default40, "config.data.scale_jitter": 0.2}  # no override: a run made at an earlier default
    assert dataset_of(earlier)[0] == dataset_of(default40)[0] + ", scale_jitter 0.2"
    assert dataset_of({**default40, "overrides": [*default40["overrides"], f"data.scale_jitter={s40.SCALE_JITTER}"]}
                      ) == dataset_of(default40)  # the default set on the command line is the same data
    assert variant_of(harder) == variant_of(earlier) == variant_of(default40) == ()
    # other data modules keep their names: their sizes are not settings of the data set
    assert dataset_of({"config.data._target_": MNIST5K, "config.data.num_train": 3}) == (
        "rotated_mnist_5k (5,000 MNIST digits, ours)", True)


def test_every_claim_names_cells_of_its_table():
    tables = report.paper_tables()
    for claim in report.CLAIMS:
        spec = tables[claim.table]
        rows = {row["name"] for row in spec["rows"]}
        for name, column in (claim.a, claim.b):
            assert name in rows and 0 <= column < len(spec["columns"]), (claim.text, name, column)
        assert claim.relation in report.RELATIONS
        assert claim.relation == "better" or claim.tolerance > 0, claim.text


ADAPT_MNIST = {"train_rotation": "none", "test_rotation": "none"}


def test_adapt_claims_read_each_metric_in_its_own_direction(tmp_path):
    """The embedded adapt table's claims: the identity rate is higher-is-better (scale 100), the errors lower."""
    runs = tmp_path / "runs"
    rows = {  # experiment: (upright error, C8-averaged error, worst case, identity rate) per seed
        "adapt_mnist/resnet18": [(2.0, 60.0, 98.0, 1.0), (2.2, 61.0, 97.0, 1.0), (1.9, 59.0, 98.5, 1.0)],
        "adapt_mnist/cn_c8_resnet18": [(3.0, 3.5, 5.0, 0.20), (3.4, 3.8, 5.5, 0.22), (3.2, 3.6, 5.2, 0.18)],
        "adapt_mnist/cn_c8_prior_resnet18": [(2.1, 2.5, 4.0, 0.93), (2.3, 2.6, 4.2, 0.95), (2.0, 2.4, 3.9, 0.94)],
    }
    # the CN rows' canonicalizer is the one Table 6 varies (3 layers, C8); only their backbone differs
    gcnn = {"_target_": "canonical_network.canonicalization.image.GCNNCanonicalizer", "num_layers": 3,
            "num_rotations": 8, "freeze": False}
    resnet = {"_target_": "canonical_network.prediction.torchvision_backbones.TorchvisionBackbone"}
    for experiment, seeds in rows.items():
        config = {"data": {"_target_": MNIST5K, **ADAPT_MNIST}, "prediction": resnet}
        if "cn_c8" in experiment:
            config["canonicalization"] = gcnn
        for seed, (err, mean, worst, identity) in enumerate(seeds):
            write_run(runs, f"{experiment.replace('/', '_')}_{seed}", experiment, seed,
                      {"test/error": err, "test/orbit/error_mean": mean, "test/orbit/error_worst": worst,
                       "test/identity_rate": identity}, max_epochs=15, epochs=15, extra_config=config)
    text = report.build_report([runs], tmp_path / "out").read_text()

    def verdict(start):
        return verdict_of(text, start)

    assert verdict("The prior raises the identity rate") == "holds"  # 94 % vs 20 %, higher is better
    assert verdict("The prior keeps upright accuracy") == "holds"  # +0.1 ± 0.4 within ±1
    assert verdict("The prior beats no prior on upright digits") == "holds"
    assert verdict("CN(C8)+prior beats the ResNet-18 in the worst case") == "holds"
    assert "| CN(C8)+prior-ResNet18 | ≤ 15 epochs | 94.00 ± " in text  # the identity rate table, in %
    assert "### Table 6" not in text  # the CN(C8)-ResNet18 rows (3 layers, C8) are not the CNN's Table 6 rows
    figures = {f.name for f in (tmp_path / "out" / "figures").iterdir()}
    assert figures and all(f"figures/{name}" in text for name in figures)
    # rebuilt, the figures of a table that has no runs any more go (the report's own names); other files stay
    (tmp_path / "out" / "figures" / "mine.png").write_bytes(b"")
    (tmp_path / "out" / "figures" / "rotmnist_table6_rotated_mnist_5k___5_epochs_bars.png").write_bytes(b"")
    text = report.build_report([runs], tmp_path / "out").read_text()
    assert {f.name for f in (tmp_path / "out" / "figures").iterdir()} == figures | {"mine.png"}
    assert (tmp_path / "out" / "figures" / "mine.png").exists()


def test_readme_headline_is_rewritten_from_the_report_and_nothing_else(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed, (cn, cnn) in enumerate([(2.0, 5.0), (2.2, 5.4), (1.9, 5.1)]):
        write_run(runs, f"cn_{seed}", "rotmnist/cn_p64", seed, {"test/error": cn})
        write_run(runs, f"cnn_{seed}", "rotmnist/cnn", seed, {"test/error": cnn})
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nintro\n\n<!-- headline:start old -->\nstale 9.99\n<!-- headline:end -->\n\ntail\n")
    assert report.main([str(runs), "--out", str(tmp_path / "out"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n<!-- headline:start") and text.endswith("<!-- headline:end -->\n\ntail\n")
    assert "stale 9.99" not in text and "(out/REPRODUCTION.md)" in text
    claim = claim_row(text, "CN(p64)-CNN beats the CNN")  # the scorecard, with the mean of the three seeds
    assert "| 2.03 ± " in claim and claim.endswith("**holds** |")
    assert "**Protocol**" in text and "| Table 1 | MNIST-rot" in text
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no headline block"):
        report.main([str(runs), "--out", str(tmp_path / "out"), "--readme", str(readme)])
    assert readme.read_text() == "no markers\n"
    with pytest.raises(SystemExit):
        report.main([str(runs), "--out", str(tmp_path / "out"), "--readme", str(tmp_path / "missing.md")])
    assert "is not a file" in capsys.readouterr().err


def test_paired_interval_matches_scipy_and_is_exact_for_identical_pairs():
    from scipy import stats

    a, b = [1.0, 1.3, 0.9, 1.2], [0.8, 1.0, 0.85, 0.9]
    diff, half, p = report.paired_interval(a, b)
    expected = stats.ttest_rel(a, b)
    rel = 2**22 * sys.float_info.epsilon  # as in test_welch_interval_matches_scipy
    ci = expected.confidence_interval(0.95)
    assert p == pytest.approx(expected.pvalue, rel=rel)
    assert diff - half == pytest.approx(ci.low, rel=rel) and diff + half == pytest.approx(ci.high, rel=rel)
    assert report.paired_interval([0.7, 0.9], [0.7, 0.9]) == (0.0, 0.0, 1.0)
    assert report.paired_interval([0.7], [0.6])[1] is None


def test_z_so3_equals_z_z_is_paired_by_seed(tmp_path):
    """Seed s of z/z and of z/SO(3) is one training run tested two ways: the per-seed differences decide."""
    runs = tmp_path / "runs"
    for seed, acc in enumerate([0.60, 0.90]):  # seeds far apart: Welch cannot resolve, the pairs can
        for rotation, shift in (("z/z", 0.0), ("z/so3", 0.001 * seed)):
            write_run(runs, f"cn{seed}_{rotation.replace('/', '_')}", "modelnet/cn_nl_pointnet", seed,
                      {"test/acc": acc + shift}, data=SHAPES,
                      extra_config={"data": {"_target_": SHAPES, "rotation": rotation}})
            # VN-PointNet is invariant by its layers: it gets the same claim
            write_run(runs, f"vn{seed}_{rotation.replace('/', '_')}", "modelnet/vn_pointnet", seed,
                      {"test/acc": acc + shift}, data=SHAPES,
                      extra_config={"data": {"_target_": SHAPES, "rotation": rotation}})
        # PointNet is not invariant: z/SO(3) far below z/z, but no claim pairs it
        write_run(runs, f"pn{seed}", "modelnet/pointnet", seed, {"test/acc": 0.3}, data=SHAPES,
                  extra_config={"data": {"_target_": SHAPES, "rotation": "z/so3"}})
    text = report.build_report([runs], tmp_path / "out").read_text()
    claim = claim_row(text, "CN(NL)-PointNet: z/SO(3) = z/z")
    assert "2 pairs" in claim and "(TOST, paired t)" in claim and "**holds**" in claim
    claim = claim_row(text, "VN-PointNet: z/SO(3) = z/z")
    assert "2 pairs" in claim and "**holds**" in claim
    assert "PointNet: z/SO(3)" not in [line.split(" | ")[1] for line in text.splitlines() if line.count(" | ") > 2]
    _, welch_half, _ = report.welch_interval([60.0, 90.1], [60.0, 90.0])
    assert welch_half > 1.0  # the unpaired test would have left it unresolved
    claim = claim_row(text, "CN(NL)-PointNet beats PointNet")
    assert "paired t" not in claim and "(n 2) vs " in claim and "pairs" not in claim


def test_a_seed_trained_in_two_environments_is_no_pair(tmp_path):
    """A seed trained on a GPU for z/z and on a CPU for z/SO(3) is two different models: no pair."""
    runs = tmp_path / "runs"
    cpu = {"machine": "Test CPU, 2 cores, CPU", "device": "CPU", "torch": "2.0"}
    gpu = {"machine": "Test host, 16 cores, Test GPU", "device": "Test GPU", "torch": "2.0"}
    for seed, acc, z_so3_shift, z_z_env in ((0, 0.60, 0.0, cpu), (1, 0.90, 0.0, cpu), (2, 0.70, -0.05, gpu)):
        for rotation, shift, env in (("z/z", 0.0, z_z_env), ("z/so3", z_so3_shift, cpu)):
            write_run(runs, f"cn{seed}_{rotation.replace('/', '_')}", "modelnet/cn_nl_pointnet", seed,
                      {"test/acc": acc + shift}, data=SHAPES, environment=env,
                      extra_config={"data": {"_target_": SHAPES, "rotation": rotation}})
    lines = report.build_report([runs], tmp_path / "out").read_text().splitlines()
    claim = claim_row("\n".join(lines), "CN(NL)-PointNet: z/SO(3) = z/z")
    assert "2 pairs" in claim and "+0.0 ± 0.0" in claim and "**holds**" in claim
    # beside the test, the values it used: the two pairs, and the seed left out said so
    assert "(n 2) vs " in claim and "(paired seeds; 2 runs without a partner trained in the same environment" in claim
    # the same three seeds, all on the CPU: seed 2's 5-point gap is a pair, and the check cannot hold
    write_run(runs, "cn2_z_z_cpu", "modelnet/cn_nl_pointnet", 2, {"test/acc": 0.70}, data=SHAPES,
              environment=cpu, extra_config={"data": {"_target_": SHAPES, "rotation": "z/z"}})
    (runs / "cn2_z_z" / "results.json").unlink()
    lines = report.build_report([runs], tmp_path / "out2").read_text().splitlines()
    claim = claim_row("\n".join(lines), "CN(NL)-PointNet: z/SO(3) = z/z")
    assert "3 pairs" in claim and "**holds**" not in claim


def test_a_variant_that_moves_digits_between_splits_is_not_compared_with_the_default(tmp_path):
    # 4,400 training digits leave 200 test digits: its test error is on other digits than the default's 1,000
    runs = tmp_path / "runs"
    for seed, (p64, aug, p64_440, aug_440) in enumerate([(3.0, 3.1, 1.0, 2.0), (3.4, 3.2, 1.1, 2.2)]):
        write_run(runs, f"p64_{seed}", "rotmnist/cn_p64", seed, {"test/error": p64})
        write_run(runs, f"aug_{seed}", "rotmnist/cnn_aug", seed, {"test/error": aug})
        write_run(runs, f"p64_440_{seed}", "rotmnist/cn_p64", seed, {"test/error": p64_440},
                  overrides=["data.train_per_class=440"])
        write_run(runs, f"aug_440_{seed}", "rotmnist/cnn_aug", seed, {"test/error": aug_440},
                  overrides=["data.train_per_class=440"])
    text = report.build_report([runs], tmp_path / "out").read_text()
    entry = text.split("Canonicalization beats augmentation: CN(p64) < CNN (rotation aug.)** (")[1].split("\n- **#")[0]
    diff, half, _ = report.welch_interval([1.0, 1.1], [2.0, 2.2])
    assert (f"  - The claim with `data.train_per_class=440` on both sides: **holds**, a − b = {diff:+.2f} ± "
            f"{half:.2f} (n 2, 2).") in entry
    # tested on other digits than the rows' defaults: listed, but never read as moving the claim
    assert "  - Ablations of its rows on this data and budget: A1–A2; none moves it" in entry
    assert "moving it" not in entry  # 1.05 vs 3.2 would "move" it, were the test digits the same
    variants = text.split("## Ablations and variants")[1]
    assert variants.count("– (another test split)") == 2 and report.changes_split(("data.val_per_class=20",))
    assert not report.changes_split(("canonicalization.temperature=0.1",))


def test_open_claims_say_whether_their_runs_hit_the_epoch_cap(tmp_path):
    # CN(p64): both seeds run to the 100-epoch cap, best validation error at epochs 97 and 99 (0-based 96, 98);
    # augmentation: stopped early after 40 and 60 epochs, best at 20 and 30. Not resolved, so it is listed.
    monitored = {"optimized_metric": "val/error", "optimized_mode": "min"}
    for seed, (p64, aug, best_p64, stop_aug) in enumerate([(3.0, 3.1, 96, 40), (3.4, 3.2, 98, 60)]):
        p64_curve = [(e, 5.0 - 0.01 * e) for e in range(best_p64 + 1)] + [(best_p64 + 1, 9.0)]
        write_run(tmp_path / "runs", f"p64_{seed}", "rotmnist/cn_p64", seed, {"test/error": p64}, epochs=100,
                  curve=p64_curve, extra_config=monitored)
        aug_curve = [(e, abs(e - stop_aug // 2) + 2.0) for e in range(stop_aug)]
        write_run(tmp_path / "runs", f"aug_{seed}", "rotmnist/cnn_aug", seed, {"test/error": aug}, epochs=stop_aug,
                  curve=aug_curve, extra_config=monitored)
    text = report.build_report([tmp_path / "runs"], tmp_path / "out").read_text()
    entry = text.split("Canonicalization beats augmentation: CN(p64) < CNN (rotation aug.)** (")[1].split("\n- **#")[0]
    assert ("  - How the runs ended: CN(p64)-CNN: 2 of 2 ran to the 100-epoch cap, best validation after 97–99 "
            "epochs; CNN (rotation aug.): 2 of 2 stopped early after 40–60 epochs, best validation after 21–31 "
            "epochs.") in entry
    # runs that do not record their monitored metric still say where they ended
    record = {"status": "completed", "epochs": 7, "config.trainer.max_epochs": 9,
              "path": str(tmp_path / "none" / "results.json")}
    assert report.stopping_text("x", [record]) == "x: 1 of 1 stopped early after 7 epochs"
    assert report.stopping_text("x", [{"status": "completed", "epochs": 7}]) is None


def test_claims_that_do_not_hold_list_what_the_ablations_of_their_rows_show(tmp_path):
    runs = tmp_path / "runs"
    # CN(p64) vs augmentation: not resolved at the defaults; CNN vs CN(p64): holds (so not listed).
    for seed, (cnn, p64, aug, free) in enumerate([(6.0, 3.0, 3.1, 2.0), (6.4, 3.4, 3.2, 2.1), (6.2, 3.2, 3.3, 2.2)]):
        write_run(runs, f"cnn{seed}", "rotmnist/cnn", seed, {"test/error": cnn})
        write_run(runs, f"p64_{seed}", "rotmnist/cn_p64", seed, {"test/error": p64})
        write_run(runs, f"aug_{seed}", "rotmnist/cnn_aug", seed, {"test/error": aug})
        write_run(runs, f"free_{seed}", "rotmnist/cn_p64", seed, {"test/error": free},
                  overrides=["canonicalization.filters=free"])
    # An ablation at another budget bears on no claim of the 100-epoch table; the rows at that budget are the
    # claim's budget ablation.
    write_run(runs, "short", "rotmnist/cn_p64", 0, {"test/error": 9.0}, overrides=["canonicalization.temperature=0.1"],
              max_epochs=10)
    for seed, (p64, aug) in enumerate([(4.0, 5.0), (4.1, 5.1)]):
        write_run(runs, f"p64_20_{seed}", "rotmnist/cn_p64", seed, {"test/error": p64}, max_epochs=20)
        write_run(runs, f"aug_20_{seed}", "rotmnist/cnn_aug", seed, {"test/error": aug}, max_epochs=20)
    text = report.build_report([runs], tmp_path / "out").read_text()
    section = text.split("## Each claim at its other budgets and under ablations")[1].split("## Tables")[0]
    assert "Canonicalization beats augmentation: CN(p64) < CNN (rotation aug.)** (" in section
    assert "CN(p64)-CNN beats the CNN" not in section  # it holds
    entry = section.split("Canonicalization beats augmentation: CN(p64) < CNN (rotation aug.)** (")[1].split("\n- **#")[0]
    diff, half, _ = report.welch_interval([2.0, 2.1, 2.2], [3.0, 3.4, 3.2])
    ablation = next(line for line in text.splitlines() if "| `canonicalization.filters=free` |" in line)
    ident = ablation.split(" | ")[0].removeprefix("| ")
    assert f"moving it (variant − row default, 95 % CI): {ident} {diff:+.3g} ± {half:.2g}." in entry
    assert "#" in ablation.split(" | ")[-1]  # the ablation names the claims whose rows it changes
    diff, half, _ = report.welch_interval([4.0, 4.1], [5.0, 5.1])
    assert f"  - The claim at ≤ 20 epochs: **holds**, a − b = {diff:+.2f} ± {half:.2f} (n 2, 2)." in entry
    assert "temperature" not in entry
    # A claim whose rows have no ablation says so.
    assert "Learned beats PCA" not in section  # no CN(PCA) run: the claim is not checked at all
    runs2 = tmp_path / "runs2"
    for seed in range(2):
        write_run(runs2, f"p64_{seed}", "rotmnist/cn_p64", seed, {"test/error": 3.0 + seed})
        write_run(runs2, f"pca_{seed}", "rotmnist/cn_pca", seed, {"test/error": 3.5 - seed})
    text = report.build_report([runs2], tmp_path / "out2").read_text()
    assert "No ablation of these rows has run on this data and budget yet." in text


def test_table6_sweep_runs_fill_table6_but_stay_variants_of_table1_rows(tmp_path):
    """The Table 6 sweep selects its cells by overriding ``rotmnist/cn_p4``: its cells, not a Table 1 row."""
    runs = tmp_path / "runs"

    def canonicalizer(rotations, layers=3):
        return {"canonicalization": {"_target_": "canonical_network.canonicalization.image.GCNNCanonicalizer",
                                     "num_layers": layers, "num_rotations": rotations, "freeze": False},
                "prediction": {"_target_": "canonical_network.prediction.cnn.CNN"}}

    for seed, (p4, p8, l1) in enumerate([(5.0, 4.0, 6.0), (5.2, 4.2, 6.4)]):
        write_run(runs, f"p4_{seed}", "rotmnist/cn_p4", seed, {"test/error": p4}, extra_config=canonicalizer(4))
        write_run(runs, f"p8_{seed}", "rotmnist/cn_p4", seed, {"test/error": p8}, extra_config=canonicalizer(8),
                  overrides=["canonicalization.num_rotations=8"])
        # a 1-layer cell overrides both keys the table matches on (reproduce.sh rotmnist-table6)
        write_run(runs, f"l1_{seed}", "rotmnist/cn_p4", seed, {"test/error": l1}, extra_config=canonicalizer(4, 1),
                  overrides=["canonicalization.num_layers=1", "canonicalization.num_rotations=4"])
    text = report.build_report([runs], tmp_path / "out").read_text()
    table6 = text[text.index("### Table 6"):]
    row = next(line for line in table6.splitlines() if line.startswith("| 3 layers | p8 |"))
    assert "| 4.10 ± " in row and "| 2 |" in row
    row = next(line for line in table6.splitlines() if line.startswith("| 1 layer | p4 |"))
    assert "| 6.20 ± " in row and "| 2 |" in row
    row = next(line for line in table6.splitlines() if line.startswith("| 3 layers | p4 |"))
    assert "| 5.10 ± " in row  # the 1-layer runs are not pooled into the 3-layer cell
    table1 = text[text.index("### Table 1"):text.index("### Table 6")]
    row = next(line for line in table1.splitlines() if line.startswith("| CN(p4)-CNN |"))
    assert "| 5.10 ± " in row  # the p8 runs are not pooled into CN(p4)
    assert "canonicalization.num_rotations=8" in text[text.index("## Ablations and variants"):]


def test_trend_interval_matches_scipy_linregress():
    from scipy import stats

    x = [2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0]
    y = [5.1, 5.5, 4.9, 4.2, 4.6, 3.1, 3.9]
    slope, half, p = report.trend_interval(x, y)
    expected = stats.linregress(x, y)
    rel = 2**22 * sys.float_info.epsilon  # as in test_welch_interval_matches_scipy
    assert slope == pytest.approx(expected.slope, rel=rel)
    assert half == pytest.approx(stats.t.ppf(0.975, len(x) - 2) * expected.stderr, rel=rel)
    assert p == pytest.approx(expected.pvalue, rel=rel)
    assert report.trend_interval([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])[1] is None  # one x: no slope
    assert report.trend_interval([2.0, 3.0], [1.0, 2.0])[1] is None  # two points: no interval


def test_group_order_trend_needs_three_orders_and_reads_the_slope(tmp_path):
    runs = tmp_path / "runs"

    def add(name, rotations, seed, error):
        overrides = [] if rotations == 4 else [f"canonicalization.num_rotations={rotations}"]
        write_run(runs, name, "rotmnist/cn_p4", seed, {"test/error": error}, overrides=overrides, extra_config={
            "canonicalization": {"_target_": "canonical_network.canonicalization.image.GCNNCanonicalizer",
                                 "num_layers": 3, "num_rotations": rotations, "freeze": False},
            "prediction": {"_target_": "canonical_network.prediction.cnn.CNN"}})

    for seed in range(2):
        add(f"p4_{seed}", 4, seed, 5.0 + 0.2 * seed)
        add(f"p64_{seed}", 64, seed, 3.0 + 0.2 * seed)
    text = report.build_report([runs], tmp_path / "two").read_text()
    # two orders: only the pairwise claim; the trend says why it has no check
    assert "fewer than 3 orders" in claim_row(text, "Error falls with the group order (3 layers")
    for seed in range(2):
        add(f"p16_{seed}", 16, seed, 4.0 + 0.2 * seed)
    text = report.build_report([runs], tmp_path / "three").read_text()
    claim = claim_row(text, "Error falls with the group order (3 layers")
    x = [2.0, 2.0, 6.0, 6.0, 4.0, 4.0]
    y = [5.0, 5.2, 3.0, 3.2, 4.0, 4.2]
    slope, half, _ = report.trend_interval(x, y)
    assert f"{slope:+.2f} ± {half:.2f} per doubling" in claim and "6 runs over 3 orders" in claim
    assert "**holds**" in claim and "(slope t)" in claim
    assert "fewer than 3 orders" in claim_row(text, "Error falls with the group order (1 layer")


def test_point_cloud_tables_on_the_embedded_shapes_show_the_floor_and_the_runs_at_it(tmp_path):
    """The floor is the trivial predictor's score on the runs' own clouds; a run at or below it is named."""
    from canonical_network.trivial_baselines import synthetic_floor

    shapes = {"task": "classification", "num_train": 70, "num_val": 7, "num_test": 70, "num_points": 32,
              "noise_std": 0.01, "data_seed": 0}
    floor = 100 * synthetic_floor(shapes)["acc"]
    runs = tmp_path / "runs"
    for seed, acc in enumerate([floor / 100 - 0.01, 0.9]):  # seed 0 a point below the floor: not learned
        write_run(runs, f"pn{seed}", "modelnet/pointnet", seed, {"test/acc": acc}, data=SHAPES,
                  extra_config={"data": {"_target_": SHAPES, "rotation": "z/z", **shapes}})
    text = report.build_report([runs], tmp_path / "out").read_text()
    note = next(line for line in text.splitlines() if line.startswith("Floor:"))
    assert f"scores **{floor:.1f}**" in note and "experiment=modelnet/pointnet data.num_train=70" in note
    assert f"Runs at or below it: PointNet (z/z) seed 0: {floor - 1:.1f}." in note  # seed 1 (90 %) is not
    # another data seed is other clouds (records.data_setting_changes): a table of its own, with its own floor
    write_run(runs, "pn_seed1", "modelnet/pointnet", 2, {"test/acc": 0.5}, data=SHAPES,
              extra_config={"data": {"_target_": SHAPES, "rotation": "z/z", **shapes, "data_seed": 1}})
    text = report.build_report([runs], tmp_path / "out2").read_text()
    assert [line.startswith("Floor:") for line in text.splitlines()].count(True) == 2 and "data_seed 1" in text
    # another noise level is another data set (records.dataset_of): a table of its own, with its own floor
    (runs / "pn_seed1").rename(tmp_path / "pn_seed1")
    write_run(runs, "pn_noisy", "modelnet/pointnet", 2, {"test/acc": 0.5}, data=SHAPES,
              extra_config={"data": {"_target_": SHAPES, "rotation": "z/z", **shapes, "noise_std": 0.05}})
    text = report.build_report([runs], tmp_path / "out3").read_text()
    assert [line.startswith("Floor:") for line in text.splitlines()].count(True) == 2 and "noise_std 0.05" in text


def test_two_data_sets_of_one_first_word_get_a_figure_each(tmp_path):
    """The 40-class shapes at two difficulties are two tables whose readable figure names are the same: each keeps
    its own chart, named with a digest of its own data set, so a data set's figure keeps its name whichever others
    have runs (with the name given to whichever came second, the default's chart took the other's name when the
    default moved)."""
    from canonical_network.data.synthetic_shapes40 import SCALE_JITTER

    shapes40 = "canonical_network.data.synthetic_shapes40.SyntheticShapes40DataModule"

    def figures(jitters: list[float], out: str) -> dict[str, str]:
        """Each data set's bar chart: {the data line's jitter, or 'default': the file's name}."""
        runs = tmp_path / out / "runs"
        for seed, jitter in enumerate(jitters):
            write_run(runs, f"dg{seed}", "modelnet/dgcnn", seed, {"test/acc": 0.8}, data=shapes40,
                      extra_config={"data": {"_target_": shapes40, "rotation": "z/z", "num_points": 256,
                                             "num_train": 100, "scale_jitter": jitter}})
        text = report.build_report([runs], tmp_path / out / "report").read_text()
        names = {}
        for section in (part for part in text.split("### ")[1:] if "_bars.png" in part):
            data = next(line for line in section.splitlines() if line.startswith("Data: ")).split(";")[0]
            bar = next(line for line in section.splitlines() if line.startswith("![") and "_bars.png" in line)
            key = data.split("scale_jitter ")[1] if "scale_jitter " in data else "default"
            names[key] = bar.split(f"{report.FIGURES}/")[1].rstrip(")")
            assert (tmp_path / out / "report" / report.FIGURES / names[key]).is_file()
        return names

    both = figures([SCALE_JITTER, 0.2], "both")
    assert set(both) == {"default", "0.2"} and both["default"] != both["0.2"]
    assert figures([SCALE_JITTER], "default") == {"default": both["default"]}
    assert figures([0.2], "other") == {"0.2": both["0.2"]}


def test_table5b_checks_that_the_canonicalized_pointnet_beats_pointnet_under_z_so3(tmp_path):
    runs = tmp_path / "runs"
    for seed, (cn, pn) in enumerate([(0.67, 0.34), (0.70, 0.36)]):
        for name, experiment, miou in (("cn", "shapenet/cn_nl_pointnet", cn), ("pn", "shapenet/pointnet", pn)):
            write_run(runs, f"{name}{seed}", experiment, seed, {"test/class_miou": miou}, data=SHAPES,
                      extra_config={"data": {"_target_": SHAPES, "rotation": "z/so3"}})
    text = report.build_report([runs], tmp_path / "out").read_text()
    claim = next(line for line in text.splitlines() if line.split(" | ")[1:3] == [
        "CN(NL)-PointNet beats PointNet under z/SO(3)", "Table 5b"])
    assert "+33.5 ± " in claim and "(n 2) vs " in claim and "**holds**" in claim
    # no DGCNN run: its claim has a row that says so
    claim = next(line for line in text.splitlines() if line.split(" | ")[1:3] == [
        "CN(NL)-DGCNN beats DGCNN under z/SO(3)", "Table 5b"])
    assert claim.endswith("| not resolved: no runs at the rows' own settings |")


def test_a_claim_against_a_scaled_side(tmp_path):
    """"More than 20 % better than the GNN" is CN-GNN (frozen) < 0.8 x GNN: the paper's 0.0085 against 0.0107 is
    not resolved at n = 3 with this spread (0.0085 - 0.8 x 0.0107 = -0.00006); 0.0080 holds."""
    runs = tmp_path / "runs"
    nbody = "canonical_network.data.nbody.NBodyDataModule"
    for seed, (frozen, gnn) in enumerate([(0.0080, 0.0107), (0.0079, 0.0108), (0.0081, 0.0106)]):
        write_run(runs, f"frozen{seed}", "nbody/cn_gnn_frozen", seed, {"test/mse": frozen}, data=nbody)
        write_run(runs, f"gnn{seed}", "nbody/gnn", seed, {"test/mse": gnn}, data=nbody)
    text = report.build_report([runs], tmp_path / "out").read_text()
    claim = claim_row(text, "Frozen canonicalization is > 20 %")
    # Welch on a and 0.8 b: -0.00056, sd 0.0001 and 0.00008, 4 df: half-width 0.0002
    assert "-0.0006 ± 0.0002 (a − 0.8 b)" in claim and "**holds**" in claim


def test_the_ablations_table_marks_variants_that_are_not_equivariant():
    effect = {"id": "A1", "experiment": "nbody/cn_gnn", "data": "N-body", "budget": "≤ 1000 epochs",
              "metric": "test/mse", "values": [0.005, 0.0051], "base": [0.007, 0.0072], "val": "–", "epochs": "1000"}
    rows = {}
    for name, variant in {"positions": ("canonicalization.features=p",),
                          "authors": ("canonicalization.authors_code=true", "canonicalization.features=p"),
                          "width": ("canonicalization.hidden_dim=16",)}.items():
        rows[name] = report.render_variants([{**effect, "variant": variant}])[-1]
    assert "**not equivariant**: positions alone" in rows["positions"]
    assert "biases" in rows["authors"] and "positions alone" in rows["authors"]  # both reasons
    assert "not equivariant" not in rows["width"]


def test_the_symmetrization_section_puts_metric_continuity_and_cost_side_by_side(tmp_path):
    from canonical_network.report_symmetrization import COST_FILE, render_symmetrization

    def run(mode: str, seed: int, mse: float, jumps: float | None) -> dict:
        metrics = {"test/mse": mse}
        if jumps is not None:
            metrics.update({"diagnose/jitter/jump_rate": jumps, "diagnose/jitter/mean_rel": jumps / 10})
        overrides = [f"canonicalization.symmetrization={mode}", "canonicalization.frame_size=2",
                     "trainer.max_epochs=200"]
        return {"experiment": "nbody/cn_gnn", "status": "completed", "seed": seed, "overrides": overrides,
                "metrics": metrics, "config.canonicalization.symmetrization": mode,
                "config.canonicalization.frame_size": 2, "config.trainer.max_epochs": 200}

    runs = [run("canonical", s, 0.0076 + 0.0001 * s, 0.10) for s in range(3)]
    runs += [run("weighted_frame", s, 0.0060 + 0.0001 * s, 0.01 if s else None) for s in range(3)]
    cost = {"machine": "test CPU", "date": "2026-11-29", "setups": {"nbody": {
        "experiment": "nbody/cn_gnn", "overrides": ["canonicalization.frame_size=2"],
        "modes": {"canonical": {"ratio": 1.0}, "weighted_frame": {"ratio": 2.39}}}}}
    (tmp_path / COST_FILE).write_text(json.dumps(cost))
    lines = render_symmetrization(runs, tmp_path)
    assert lines[0] == "## Symmetrization side by side" and lines[-1] == ""
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].startswith("| mode | test/mse (n) | vs canonical (Welch) | jumps, jitter (%) | output change, jitter")
    canonical, weighted = table[1].split(" | "), table[2].split(" | ")
    assert canonical[0] == "| canonical (one element)" and canonical[1].endswith("(3)") and canonical[2] == "–"
    assert canonical[3] == "10.0 ± 0 (3)" and canonical[-1] == "1.00× |"
    # 0.0061 − 0.0077 with the same spread on both sides: an interval clear of zero, lower MSE is better
    assert weighted[2].startswith("-0.00") and weighted[2].endswith("(better)")
    assert weighted[3] == "1.0 ± 0 (2)"  # the runs diagnosed, not all the runs
    assert weighted[-1] == "2.39× |"
    # no symmetrization runs: no section
    assert render_symmetrization([r for r in runs if r["config.canonicalization.symmetrization"] == "x"], tmp_path) == []


def test_the_symmetrization_section_splits_the_jumps_where_the_diagnoses_have_the_split():
    from canonical_network.report_symmetrization import render_symmetrization

    def run(mode: str, seed: int, split: bool) -> dict:
        metrics = {"test/error": 4.0 + seed, "diagnose/rotation/jump_rate": 0.05}
        if split:  # a format-2 diagnosis: of the 5 % that jump, 4 % under an unchanged element
            metrics["diagnose/rotation/jump_without_element_change_rate"] = 0.04
        return {"experiment": "rotmnist/cn_p16", "status": "completed", "seed": seed, "metrics": metrics,
                "overrides": [f"canonicalization.symmetrization={mode}", "canonicalization.frame_size=2",
                              "trainer.max_epochs=30"],
                "config.canonicalization.symmetrization": mode, "config.canonicalization.frame_size": 2,
                "config.trainer.max_epochs": 30}

    runs = [run("canonical", s, split=s > 0) for s in range(3)] + [run("weighted_frame", s, True) for s in range(2)]
    table = [line for line in render_symmetrization(runs, None) if line.startswith("| ")]
    header = table[0].split(" | ")
    assert header[3:5] == ["jumps, ±1° rotation (%)", "of which, same element (%)"]
    assert table[1].split(" | ")[3:5] == ["5.0 ± 0 (3)", "4.0 ± 0 (2)"]  # only the runs whose diagnosis splits
    without = [run("canonical", s, split=False) for s in range(2)]
    assert "of which" not in [line for line in render_symmetrization(without, None) if line.startswith("| ")][0]


def test_a_reduction_claim_where_the_reduced_side_is_always_zero_says_so(tmp_path):
    """"Weighted frames cut the jump rate >= 10x" on N-body, where canonical already has no jumps (0 in every
    run) and the weighted frame none either: 0 < 0.1 x 0 cannot hold, and there was nothing to cut. The verdict
    says that instead of an unresolved interval; one jump in the canonical runs makes it an ordinary check."""
    nbody = "canonical_network.data.nbody.NBodyDataModule"

    def runs_with(canonical_jumps: list[float], root):
        for mode, jumps in (("canonical", canonical_jumps), ("weighted_frame", [0.0, 0.0, 0.0])):
            for seed, rate in enumerate(jumps):
                write_run(root, f"{mode}{seed}", "nbody/cn_gnn", seed,
                          {"test/mse": 0.007, "diagnose/jitter/jump_rate": rate}, data=nbody, max_epochs=200,
                          overrides=[f"canonicalization.symmetrization={mode}", "canonicalization.frame_size=2",
                                     "trainer.max_epochs=200"],
                          extra_config={"canonicalization": {"symmetrization": mode, "frame_size": 2}})
        return report.build_report([root], root.parent / f"out_{root.name}").read_text()

    claim = "Weighted frames cut the jump rate >= 10x on N-body"
    text = runs_with([0.0, 0.0, 0.0], tmp_path / "zero")
    assert claim_row(text, claim).endswith(
        "| **not resolved: canonical (one element) is 0 in every run, nothing to cut** |")
    text = runs_with([0.02, 0.03, 0.025], tmp_path / "some")
    assert "nothing to cut" not in claim_row(text, claim) and verdict_of(text, claim) == "holds"


def test_the_best_epoch_comes_from_the_tested_checkpoint_or_a_whole_curve(tmp_path):
    """A resume can cut a run's early epochs from csv/metrics.csv: the best epoch is the tested checkpoint's, and a
    curve that does not start at the first validation is not read for it."""
    monitored = {"optimized_metric": "val/error", "optimized_mode": "min"}
    cut = write_run(tmp_path, "cut", "rotmnist/cnn", 0, {"test/error": 3.0}, epochs=60, max_epochs=100,
                    curve=[(e, 5.0 - 0.01 * e) for e in range(50, 60)], extra_config=monitored)
    record = {"status": "completed", "epochs": 60, "config.trainer.max_epochs": 100, "path": str(cut / "results.json"),
              **{f"config.{k}": v for k, v in monitored.items()}}
    assert report.stopping_text("x", [record]) == "x: 1 of 1 stopped early after 60 epochs"  # the cut curve: no best
    record["checkpoint"] = "checkpoints/epoch_049.ckpt"
    assert report.stopping_text("x", [record]) == ("x: 1 of 1 stopped early after 60 epochs, best validation after "
                                                   "50 epochs")


def test_early_stopping_removed_is_no_early_stopping_and_patience_is_said_in_epochs():
    from canonical_network.records import budget_of

    base = {"config.trainer.max_epochs": 100, "config.callbacks.last_checkpoint.filename": "last.ckpt"}
    patience = {**base, "config.callbacks.early_stopping.patience": 120, "config.trainer.check_val_every_n_epoch": 5}
    removed = dict(base)  # ~callbacks.early_stopping: the callbacks config has no such key
    nulled = {**base, "config.callbacks.early_stopping": None}
    assert budget_of(patience) == "≤ 100 epochs"
    assert budget_of(removed) == budget_of(nulled) == "≤ 100 epochs, no early stopping"
    assert budget_of({"config.trainer.max_epochs": 100}) == "≤ 100 epochs"  # no callbacks recorded: unknown
    assert report._patience(patience) == "patience 600 epochs (120 validations)"
    assert report._patience({**base, "config.callbacks.early_stopping.patience": 20}) == "patience 20 epochs"
    assert report._patience(removed) == "none"


def test_an_ablation_is_compared_with_its_rows_runs_of_the_same_rotation_column(tmp_path):
    """A point-cloud row has runs in several rotation columns; an ablation run under z/SO(3) is set against the
    row's z/SO(3) runs only (pooling the columns counted a z-trained model twice and mixed in SO(3) training)."""
    runs = tmp_path / "runs"
    for seed in range(3):
        for rotation, acc in (("z/z", 0.9), ("z/so3", 0.5), ("so3/so3", 0.8)):
            write_run(runs, f"row{seed}_{rotation.replace('/', '_')}", "modelnet/cn_nl_pointnet", seed,
                      {"test/acc": acc + 0.01 * seed}, data=SHAPES,
                      extra_config={"data": {"_target_": SHAPES, "rotation": rotation}})
        write_run(runs, f"abl{seed}", "modelnet/cn_nl_pointnet", seed, {"test/acc": 0.6 + 0.01 * seed},
                  overrides=["canonicalization.hidden_dim=16"], data=SHAPES,
                  extra_config={"data": {"_target_": SHAPES, "rotation": "z/so3"}})
    text = report.build_report([runs], tmp_path / "out").read_text()
    row = next(line for line in text.splitlines() if "`canonicalization.hidden_dim=16`" in line)
    assert "rotation z/so3" in row and "| 0.51 ± 0.025 (3) |" in row and "+0.1 ± 0" in row


def test_how_paper_slurm_submits_a_job_leaves_it_the_row_itself():
    """paper-slurm passes data.download=true and skip_finished=true to every job: neither changes what the row is,
    so its records fill the paper's rows instead of variant rows of their own."""
    from canonical_network.records import variant_of

    # as a record keeps them (Hydra's task overrides: hydra/launcher=slurm and hydra.sweep.dir are not among them)
    run = {"experiment": "rotmnist/cn_p64", "overrides": [
        "sweep=rotmnist_table1", "trainer=gpu", "skip_finished=true",
        "~callbacks.rich_progress_bar", "data=rotated_mnist", "data.download=true", "trainer.max_epochs=100",
        "experiment=rotmnist/cn_p64", "seed=3"]}
    assert variant_of(run) == ()
    assert variant_of({**run, "overrides": [*run["overrides"], "canonicalization.num_layers=1"]}) == (
        "canonicalization.num_layers=1",)
