"""The report's "Test-time symmetrization of the adapt rows" section, from fabricated evaluation records."""

from __future__ import annotations

import json

import pytest

from canonical_network import report
from canonical_network.report_adapt_symmetrization import (
    difference_text,
    load_evaluations,
    predictor_passes,
    render_adapt_symmetrization,
)
from tests.test_report import write_run

ROW = "adapt_mnist/cn_c8_prior_resnet18"
#: per mode, per seed: (upright error, C8-averaged error, worst case over C8)
ERRORS = {
    "canonical": [(5.0, 5.2, 6.0), (4.0, 4.1, 5.0), (6.0, 6.1, 7.0)],
    # -0.5, -0.4, -0.6 upright: mean -0.5, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.25 -> resolved, lower
    "weighted_frame": [(4.5, 5.0, 6.5), (3.6, 4.0, 5.4), (5.4, 6.0, 7.6)],
    # +0.5, -1.0, +0.2 upright: mean -0.1, sd 0.79 -> half-width 1.96: not resolved
    "sampled": [(5.5, 5.2, 6.0), (3.0, 4.1, 5.0), (6.2, 6.1, 7.0)],
}


def write_evaluation(folder, mode, seed, errors, frame_size=2, max_epochs=15):
    upright, averaged, worst = errors
    record = {
        "experiment": ROW, "status": "evaluated", "seed": seed,
        "checkpoint": f"/runs/{ROW}/seed{seed}/checkpoints/epoch_012.ckpt",
        "metrics": {"test/error": upright, "test/orbit/error_mean": averaged, "test/orbit/error_worst": worst},
        "config": {"trainer": {"max_epochs": max_epochs},
                   "canonicalization": {"symmetrization": mode, "frame_size": frame_size, "num_rotations": 8,
                                        "reflection": False}},
    }
    path = folder / mode / f"seed{seed}" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))


@pytest.fixture
def evaluations(tmp_path):
    folder = tmp_path / "adapt_symmetrization"
    for mode, per_seed in ERRORS.items():
        for seed, errors in enumerate(per_seed):
            write_evaluation(folder, mode, seed, errors)
    return folder


def resnet_runs(errors=(3.0, 2.5, 3.5), max_epochs=15):
    return [{"experiment": "adapt_mnist/resnet18", "overrides": ["experiment=adapt_mnist/resnet18", f"seed={k}",
                                                                 f"trainer.max_epochs={max_epochs}"],
             "metrics": {"test/error": e}, "config.trainer.max_epochs": max_epochs} for k, e in enumerate(errors)]


def row_of(lines, mode):
    return next(line for line in lines if line.startswith(f"| `{mode}` |")).split(" | ")


def test_each_mode_is_one_row_with_paired_differences_to_canonical(evaluations):
    lines = render_adapt_symmetrization(evaluations, resnet_runs())
    assert lines[0] == "## Test-time symmetrization of the adapt rows" and lines[-1] == ""
    text = "\n".join(lines)
    assert "trained canonically" in text and "for 15 epochs" in text
    assert "scripts/reproduce.sh adapt-symmetrization" in text
    modes = [line.split(" | ")[0] for line in lines if line.startswith("| `")]
    assert modes == ["| `canonical`", "| `weighted_frame`", "| `sampled`"]

    canonical = row_of(lines, "canonical")
    assert canonical[1:3] == ["1", "3"]  # predictor passes, n
    assert canonical[3] == "5.00 ± 2.48"  # sd 1, t(2) = 4.303: 4.303 / sqrt(3)
    assert canonical[4] == "–"  # no difference to itself

    weighted = row_of(lines, "weighted_frame")
    assert weighted[1:3] == ["2", "3"]
    assert weighted[4] == "-0.50 ± 0.25 (lower)"
    # C8-averaged: -0.2, -0.1, -0.1 -> mean -0.13, sd 0.058, half 0.14: the interval holds zero
    assert weighted[6].endswith("(not resolved)") and weighted[6].startswith("-0.13 ± 0.14")
    # worst case: +0.5, +0.4, +0.6 -> higher
    assert weighted[8] == "+0.50 ± 0.25 (higher)"

    sampled = row_of(lines, "sampled")
    assert sampled[1] == "2" and sampled[4].startswith("-0.10 ± ") and sampled[4].endswith("(not resolved)")
    assert sampled[6] == "+0.00 ± 0.00 (not resolved)"  # the same C8-averaged errors as canonical


def test_the_upright_gap_to_resnet18_uses_its_runs_at_the_same_budget(evaluations):
    runs = resnet_runs() + resnet_runs(errors=(1.0, 1.0), max_epochs=30)  # the 30-epoch runs are not the reference
    lines = render_adapt_symmetrization(evaluations, runs)
    text = "\n".join(lines)
    assert "upright gap to ResNet-18" in lines[next(i for i, x in enumerate(lines) if x.startswith("| mode |"))]
    assert "upright error 3.00 ± 1.24 % (n = 3)" in text
    # canonical 5, 4, 6 against 3, 2.5, 3.5: +2.00, Welch se sqrt(1/3 + 0.25/3) = 0.645 on 2.94 df: ± 2.08
    assert row_of(lines, "canonical")[-1] == "+2.00 ± 2.08 (not resolved) |"
    gap = row_of(render_adapt_symmetrization(evaluations, resnet_runs((0.5, 0.4, 0.6))), "canonical")[-1]
    assert gap.startswith("+4.50 ± 2.4") and gap.endswith("(higher) |")  # the interval excludes zero
    lines = render_adapt_symmetrization(evaluations, resnet_runs(max_epochs=30))
    assert "upright gap" not in lines[next(i for i, x in enumerate(lines) if x.startswith("| mode |"))]
    assert any("No adapt_mnist/resnet18 run of the report at 15 epochs" in line for line in lines)


def test_a_single_seed_is_never_resolved_and_unpaired_records_are_counted(tmp_path):
    folder = tmp_path / "adapt_symmetrization"
    write_evaluation(folder, "canonical", 0, (5.0, 5.0, 6.0))
    write_evaluation(folder, "weighted_frame", 0, (3.0, 3.0, 4.0))
    write_evaluation(folder, "weighted_frame", 1, (3.0, 3.0, 4.0))  # its canonical evaluation is missing
    weighted = row_of(render_adapt_symmetrization(folder, []), "weighted_frame")
    assert weighted[2] == "2" and weighted[4] == "-2.00 (n < 2: not resolved), 1 pairs"
    assert difference_text(0.3, 0.3) == "+0.30 ± 0.30 (not resolved)"


def test_predictor_passes_follow_the_mode():
    config = {"frame_size": 3, "num_rotations": 8, "reflection": True}
    passes = {mode: predictor_passes({"config": {"canonicalization": {**config, "symmetrization": mode}}})
              for mode in ("canonical", "weighted_frame", "sampled", "full")}
    assert passes == {"canonical": 1, "weighted_frame": 3, "sampled": 3, "full": 16}


def test_a_record_filed_under_another_mode_is_refused_naming_it(tmp_path):
    folder = tmp_path / "adapt_symmetrization"
    write_evaluation(folder, "sampled", 0, (5.0, 5.0, 6.0))
    (folder / "sampled").rename(folder / "weighted_frame")
    with pytest.raises(ValueError, match=r"weighted_frame/seed0/results.json: .*symmetrization='sampled' filed "
                                         r"under 'weighted_frame'"):
        load_evaluations(folder)
    assert render_adapt_symmetrization(tmp_path / "empty", []) == []


def test_the_report_has_the_section_only_when_the_folder_is_beside_the_runs(tmp_path):
    runs = tmp_path / "runs"
    for seed, error in enumerate((3.0, 2.5, 3.5)):
        write_run(runs, f"resnet_{seed}", "adapt_mnist/resnet18", seed, {"test/error": error}, max_epochs=15,
                  overrides=["trainer.max_epochs=15"])
    out = tmp_path / "report"
    assert "## Test-time symmetrization" not in report.build_report([runs], out).read_text()
    for mode, per_seed in ERRORS.items():
        for seed, errors in enumerate(per_seed):
            write_evaluation(tmp_path / "adapt_symmetrization", mode, seed, errors)
    text = report.build_report([runs], out).read_text()
    section = text.split("## Test-time symmetrization of the adapt rows")[1].split("\n## ")[0]
    assert "| `weighted_frame` | 2 | 3 | 4.50 ± " in section and "(n = 3)" in section
