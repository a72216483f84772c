"""The report's first screen and its accounting: scorecard and protocol, equivalence by TOST, claims as data
(a user's claims file), every record counted, code versions, and a rebuild that is the same bytes anywhere."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys

import pytest

from canonical_network import report
from canonical_network.records import write_results
from canonical_network.utils.config import PROJECT_ROOT
from tests.test_report import claim_row, verdict_of, write_run

NBODY = "canonical_network.data.nbody.NBodyDataModule"


def nbody_run(root, name, experiment, seed, mse, status="completed", **extra):
    folder = write_run(root, name, experiment, seed, {"test/mse": mse} if mse is not None else {}, data=NBODY,
                       max_epochs=1000, epochs=1000)
    if status != "completed" or extra:
        record = json.loads((folder / "results.json").read_text())
        record.update(status=status, **extra)
        write_results(folder, record)
    return folder


def test_tost_holds_where_a_difference_test_is_not_resolved():
    """Two cells 0.1 apart with sd 0.05 at n = 3: the difference test cannot say they differ (95 % interval
    contains 0), and cannot say they are equal; equivalence within ±0.5 is what TOST decides, and it holds."""
    a, b = [1.00, 1.05, 0.95], [1.10, 1.15, 1.05]
    diff, se, df = report.difference_stats(a, b)
    half = report.t_quantile(df) * se
    assert diff - half < 0 < diff + half  # the difference test: not resolved
    claim = report.Claim("x", "rotmnist_table1", ("a", 0), ("b", 0))
    assert report.verdict(claim, diff, half, True) == "not resolved"
    verdict, p = report.equivalence_verdict(diff, se, df, tolerance=0.5)
    assert verdict == "holds" and p < 0.05
    # TOST is the larger of the two one-sided p-values: against scipy's t distribution
    from scipy import stats

    expected = max(stats.t.sf((diff + 0.5) / se, df), stats.t.cdf((diff - 0.5) / se, df))
    assert p == pytest.approx(expected, rel=1e-12)
    # a tolerance the interval crosses: not resolved; one it lies wholly beyond: does not hold
    assert report.equivalence_verdict(diff, se, df, tolerance=0.12)[0] == "not resolved"
    assert report.equivalence_verdict(diff + 3.0, se, df, tolerance=0.5)[0] == "does not hold"
    assert report.equivalence_verdict(diff, None, None, tolerance=0.5)[0] == "not resolved (n < 2)"


def test_no_worse_holds_for_a_better_side_that_an_equality_test_rejects():
    """"At no loss of accuracy" is non-inferiority: a side clearly better than the other by more than the
    tolerance satisfies it, though TOST calls the two not equal; a side clearly worse by more does not."""
    a, b = [0.0060, 0.0058, 0.0062], [0.0079, 0.0081, 0.0077]  # lower is better: a better by 0.0019
    diff, se, df = report.difference_stats(a, b)
    assert report.equivalence_verdict(diff, se, df, tolerance=0.001)[0] == "does not hold"
    verdict, p = report.noninferiority_verdict(diff, se, df, 0.001, lower_is_better=True)
    assert verdict == "holds" and p < 0.05
    from scipy import stats

    # H0: a worse by the tolerance or more, i.e. diff >= +0.001; the p-value of its one-sided t test
    assert p == pytest.approx(stats.t.cdf((diff - 0.001) / se, df), rel=1e-12)
    # higher is better: the same numbers read as accuracies make a the worse side, by more than the tolerance
    assert report.noninferiority_verdict(diff, se, df, 0.001, lower_is_better=False)[0] == "does not hold"
    # a tolerance the interval's worse end crosses: not resolved; n < 2: not resolved either
    assert report.noninferiority_verdict(diff + 0.0028, se, df, 0.001, lower_is_better=True)[0] == "not resolved"
    assert report.noninferiority_verdict(diff, None, None, 0.001, lower_is_better=True)[0] == "not resolved (n < 2)"


def test_a_claims_file_relation_is_checked(tmp_path):
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims:\n  - {text: t, table: nbody_table, a: [GNN, 0], b: [EGNN, 0], relation: no_worse}\n")
    with pytest.raises(ValueError, match="relation=no_worse needs a tolerance > 0"):
        report.load_claims(claims)
    claims.write_text("claims:\n  - {text: t, table: nbody_table, a: [GNN, 0], b: [EGNN, 0], relation: worse}\n")
    with pytest.raises(ValueError, match="relation='worse'; valid relations: better, equal, no_worse"):
        report.load_claims(claims)


def test_a_diverged_run_is_counted_and_listed_never_pooled(tmp_path):
    runs = tmp_path / "runs"
    for seed, (cn, gnn) in enumerate([(0.0070, 0.0140), (0.0072, 0.0142), (0.0068, 0.0139)]):
        nbody_run(runs, f"cn{seed}", "nbody/cn_gnn", seed, cn)
        nbody_run(runs, f"gnn{seed}", "nbody/gnn", seed, gnn)
    nbody_run(runs, "cn_diverged", "nbody/cn_gnn", 3, 9.0, status="diverged",
              divergence="training loss nan at epoch 12")
    text = report.build_report([runs], tmp_path / "out").read_text()
    assert "7 run records: 6 completed, 1 diverged" in text
    listed = next(line for line in text.splitlines() if line.startswith("| `cn_diverged` |"))
    assert "| diverged | training loss nan at epoch 12 |" in listed
    row = next(line for line in text.splitlines() if line.startswith("| CN-GNN | ≤ 1000 epochs |"))
    assert "| 0.0070 ± " in row and "| 3 (+1 diverged) |" in row  # 9.0 is not in the mean, nor in n: said beside it


def test_a_cell_whose_seeds_ran_different_code_versions_is_flagged(tmp_path):
    runs = tmp_path / "runs"
    for seed, commit in enumerate(["a" * 40, "a" * 40, "b" * 40]):
        folder = nbody_run(runs, f"cn{seed}", "nbody/cn_gnn", seed, 0.007 + 0.0001 * seed)
        record = json.loads((folder / "results.json").read_text())
        record["code_version"] = {"commit": commit, "dirty": seed == 2, "package": "0.1.0"}
        write_results(folder, record)
        nbody_run(runs, f"gnn{seed}", "nbody/gnn", seed, 0.014)  # records without a version: never flagged
    text = report.build_report([runs], tmp_path / "out").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| CN-GNN | ≤ 1000 epochs |"))
    assert "| 3 ‡ |" in row
    gnn = next(line for line in text.splitlines() if line.startswith("| GNN | ≤ 1000 epochs |"))
    assert "‡" not in gnn
    assert f"Table 3 CN-GNN at ≤ 1000 epochs: {'a' * 12}, {'b' * 12}+dirty" in text
    assert "Code version recorded by 3 of 6 runs (2 distinct)" in text


def test_a_users_claims_file_adds_rows_over_their_own_tables(tmp_path):
    runs = tmp_path / "runs"
    for seed, (mine, gnn) in enumerate([(0.0050, 0.0140), (0.0052, 0.0141), (0.0049, 0.0139)]):
        nbody_run(runs, f"mine{seed}", "nbody/my_model", seed, mine)
        nbody_run(runs, f"gnn{seed}", "nbody/gnn", seed, gnn)
    claims = tmp_path / "my_claims.yaml"
    claims.write_text(
        "tables:\n"
        "  my_nbody:\n"
        "    title: 'My table: N-body test MSE'\n"
        "    metric: test/mse\n    digits: 4\n    lower_is_better: true\n"
        "    columns: [{name: MSE}]\n"
        "    rows:\n"
        "      - {name: Mine, experiment: nbody/my_model}\n"
        "      - {name: GNN, experiment: nbody/gnn}\n"
        "claims:\n"
        "  - {text: My model beats the GNN, source: my notes, table: my_nbody, a: [Mine, 0], b: [GNN, 0]}\n"
        "  - {text: Paper's GNN row, source: my notes, table: nbody_table, a: [GNN, 0], b: [CN-GNN, 0]}\n")
    text = report.build_report([runs], tmp_path / "out", claims_file=claims).read_text()
    assert verdict_of(text, "My model beats the GNN") == "holds"
    assert "your claims (**1 hold, 0 do not hold, 1 not resolved**" in text
    assert "### My table: N-body test MSE" in text
    # the paper's scorecard does not count them
    scorecard = text.split("## Scorecard")[1].split("### Protocol")[0]
    assert "My model beats the GNN" not in scorecard
    # a claim naming what is not there: one clear error with the valid choices, through the CLI too
    claims.write_text("claims:\n  - {text: t, table: nbody_table, a: [CN-GNNN, 0], b: [GNN, 0]}\n")
    with pytest.raises(ValueError, match=r"names row 'CN-GNNN', not a row of nbody_table; its rows: Linear"):
        report.build_report([runs], tmp_path / "out2", claims_file=claims)
    claims.write_text("claims:\n  - {text: t, table: nbody, a: [GNN, 0], b: [GNN, 0], relaton: equal}\n")
    with pytest.raises(ValueError, match="unknown key.*relaton.*valid keys: text, table"):
        report.load_claims(claims)
    claims.write_text("claims:\n  - {text: t, table: nbody, a: [GNN, 0], b: [GNN, 0]}\n")
    with pytest.raises(SystemExit):
        report.main([str(runs), "--out", str(tmp_path / "out3"), "--claims", str(claims)])


def test_the_paper_claims_file_is_data_that_names_cells_of_its_tables():
    claims, extra = report.load_claims()
    assert extra == {} and claims == report.CLAIMS
    texts = [(c.table, c.a, c.b, c.trend_x) for c in claims]
    assert len(texts) == len(set(texts)), "no claim repeats another's comparison"
    kinds = {c.kind for c in claims}
    assert kinds == {"paper", "construction", "other", "extension"}
    paper = [c for c in claims if c.kind == "paper"]
    # the claims the paper's text makes about Table 3, each a row
    table3 = {c.b[0] for c in paper if c.table == "nbody_table" and c.a[0] == "CN-GNN"}
    assert {"GNN", "EGNN", "FA-GNN", "Radial Field", "TFN", "SE(3)-Transformer", "CN-GNN (frozen)"} <= table3


def test_the_scorecard_says_why_a_claim_has_no_check(tmp_path):
    runs = tmp_path / "runs"
    for seed in range(2):
        nbody_run(runs, f"cn{seed}", "nbody/cn_gnn", seed, 0.007)
        folder = write_run(runs, f"fa{seed}", "nbody/fa_gnn", seed, {"test/mse": 0.008}, data=NBODY,
                           max_epochs=200, epochs=200)
        assert folder.is_dir()
    text = report.build_report([runs], tmp_path / "out").read_text()
    assert claim_row(text, "CN-GNN beats FA-GNN").endswith(
        "| not resolved: no runs at a common budget (CN-GNN: ≤ 1000 epochs; FA-GNN: ≤ 200 epochs) |")
    assert claim_row(text, "CN-GNN beats TFN").endswith("| not resolved: no runs of TFN |")
    protocol = next(line for line in text.splitlines() if line.startswith("| Table 3 |"))
    assert "epochs: 200, 1000 (paper: 10000)" in protocol


def test_a_rebuild_elsewhere_from_another_directory_is_the_same_bytes_with_its_diagnostics(tmp_path):
    runs = tmp_path / "reproduction" / "runs"
    for seed, (cn, cnn) in enumerate([(2.0, 5.0), (2.2, 5.4), (1.9, 5.1)]):
        write_run(runs, f"cn_{seed}", "rotmnist/cn_p64", seed, {"test/error": cn}, curve=[(0, 9.0), (1, cn)])
        write_run(runs, f"cnn_{seed}", "rotmnist/cnn", seed, {"test/error": cnn}, curve=[(0, 9.0), (1, cnn)])
    diagnostics = tmp_path / "reproduction" / "diagnostics" / "cn_p64"
    diagnostics.mkdir(parents=True)
    (diagnostics / "diagnostics.json").write_text(json.dumps({
        "experiment": "rotmnist/cn_p64", "equivariance": {"exact": {"max_rel": 1e-15}}, "figures": ["figures/pose.png"]}))
    (diagnostics / "pose.png").write_bytes(b"png")
    first = report.build_report([runs], tmp_path / "reproduction")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    subprocess.run([sys.executable, "-m", "canonical_network.report", str(runs), "--out", "copy"], cwd=elsewhere,
                   check=True, env=env, capture_output=True)
    copy = elsewhere / "copy"
    assert (copy / report.REPORT_FILE).read_bytes() == first.read_bytes()
    assert "## Diagnostics of the trained models" in first.read_text()
    assert (copy / "diagnostics" / "cn_p64" / "pose.png").read_bytes() == b"png"  # its links resolve there
    figures = sorted(p.name for p in (tmp_path / "reproduction" / "figures").iterdir())
    assert figures == sorted(p.name for p in (copy / "figures").iterdir()) and figures
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "reproduction" / "figures", copy / "figures", figures,
                                               shallow=False)
    assert not mismatch and not errors


def test_the_committed_report_and_readme_headline_are_what_the_generator_writes(tmp_path):
    """docs/reproduction/REPRODUCTION.md is generated: rebuilt from the committed runs it is the same text,
    its first 60 lines hold the scorecard and the protocol summary, and the README's headline is its scorecard."""
    committed = PROJECT_ROOT / "docs" / "reproduction" / report.REPORT_FILE
    rebuilt = report.build_report([PROJECT_ROOT / "docs" / "reproduction" / "runs"], tmp_path / "report")
    assert rebuilt.read_text() == committed.read_text(), (
        "docs/reproduction/REPRODUCTION.md is stale: python -m canonical_network.report docs/reproduction/runs "
        "--out docs/reproduction --readme README.md")
    lines = committed.read_text().splitlines()
    assert "## Scorecard" in lines[:10]
    protocol = lines.index("### Protocol")
    end = next(i for i in range(protocol + 3, len(lines)) if not lines[i].startswith("|"))
    assert end <= 60
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = readme[readme.index(report.HEADLINE_START):readme.index(report.HEADLINE_END)].splitlines()[1:]
    assert block == report.headline(committed.read_text(), "docs/reproduction/REPRODUCTION.md")


def test_the_claims_example_in_the_docs_loads(tmp_path):
    text = (PROJECT_ROOT / "docs" / "report.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my_claims.yaml"
    path.write_text(block)
    claims, tables = report.load_claims(path)
    assert [c.kind for c in claims] == ["user", "user"] and "my_nbody" in tables
    assert claims[1].relation == "equal" and claims[1].tolerance == 0.0005
