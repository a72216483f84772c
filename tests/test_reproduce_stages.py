"""scripts/reproduce.sh: the folders a stage's settings give its runs, and its errors. The script's Python is
replaced by a stand-in that prints each run_protocol.py call instead of training (others go to the real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from canonical_network.utils.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "reproduce.sh"


@pytest.fixture
def stand_in(tmp_path):
    path = tmp_path / "python"
    path.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == scripts/run_protocol.py || "$1" == "-m" ]]; then echo "CALL $*"; exit 0; fi
exec {sys.executable} "$@"
""")
    path.chmod(0o755)
    return path


def _stage(stand_in, tmp_path, *arguments, **settings):
    env = {**os.environ, "PY": str(stand_in), "OUT": str(tmp_path / "out"), "COMMITTED": "", "UNFINISHED": "",
           **settings}
    return subprocess.run(["bash", str(SCRIPT), *arguments], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _variants(stdout: str, experiment: str) -> list[str]:
    found = []
    for line in stdout.splitlines():
        words = line.split()
        if line.startswith("CALL scripts/run_protocol.py") and experiment in words:
            found.append(words[words.index("--variant") + 1] if "--variant" in words else "")
    return found


def test_a_budget_away_from_its_default_gets_folders_of_its_own(stand_in, tmp_path):
    """FA_EPOCHS=1000 used to run FA-GNN into the 200-epoch runs' folders, whose records then counted as done;
    PC_TRAIN and PC_EPOCHS likewise for the point-cloud budget's. The defaults keep their folders."""
    default = _stage(stand_in, tmp_path, "nbody")
    assert default.returncode == 0, default.stderr
    assert _variants(default.stdout, "nbody/fa_gnn") == [""]
    longer = _stage(stand_in, tmp_path, "nbody", FA_EPOCHS="1000")
    assert _variants(longer.stdout, "nbody/fa_gnn") == ["ep1000"]
    assert "trainer.max_epochs=1000" in next(line for line in longer.stdout.splitlines() if "nbody/fa_gnn" in line)

    pc = _stage(stand_in, tmp_path, "pointclouds-cpu")
    assert set(_variants(pc.stdout, "modelnet/pointnet")) == {"pts256_z_z", "pts256_z_so3", "pts256_so3_so3"}
    bigger = _stage(stand_in, tmp_path, "pointclouds-cpu", PC_TRAIN="4000", PC_EPOCHS="12")
    assert set(_variants(bigger.stdout, "modelnet/pointnet")) == {"pts256_n4000_z_z_ep12", "pts256_n4000_z_so3_ep12",
                                                                "pts256_n4000_so3_so3_ep12"}
    adapt = _stage(stand_in, tmp_path, "adapt-mnist", ADAPT_EPOCHS="30")
    assert set(_variants(adapt.stdout, "adapt_mnist/resnet18")) == {"ep30"}


def test_the_diagnose_stage_skips_rows_without_a_completed_run(stand_in, tmp_path):
    """It used to end at the first row without checkpoints, silently with exit 2 (``ls`` failing under
    ``set -o pipefail``), and to diagnose the best-so-far checkpoint of a run still training."""
    training = tmp_path / "out" / "rotmnist" / "cn_p64" / "seed1" / "checkpoints"
    training.mkdir(parents=True)
    (training / "epoch_003.ckpt").write_bytes(b"a run still training")
    proc = _stage(stand_in, tmp_path, "diagnose")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("skip ") == 6 and "CALL" not in proc.stdout, proc.stdout


@pytest.mark.parametrize(("arguments", "settings", "message"), [
    (["nbody-papr"], {}, "unknown stage 'nbody-papr'; the stages: rotmnist "),
    (["nbody", "--seeds=5"], {}, "one stage at a time; got 'nbody --seeds=5'"),
    (["nbody"], {"JOBS": "0"}, "JOBS must be a whole number >= 1, got '0'"),
    (["nbody"], {"THREADS": "one"}, "THREADS must be a whole number >= 1, got 'one'"),
])
def test_bad_stages_and_settings_get_one_clear_error(stand_in, tmp_path, arguments, settings, message):
    proc = _stage(stand_in, tmp_path, *arguments, **settings)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert "CALL" not in proc.stdout


def test_paper_slurm_submits_every_paper_table_and_cn_pretrained_from_table_1s_checkpoints(stand_in, tmp_path):
    """The full protocol on Slurm: every table's sweep (Table 6 was once left out), and Table 2's CN(pretrained)
    row, which no sweep can hold: after the Table 1 sweep, one job a seed from that seed's tested CN(p64)
    checkpoint. A seed whose CN(p64) run did not complete is named, not submitted, and fails the stage."""
    slurm_out = tmp_path / "slurm"
    for seed in (0, 1, 2, 4):
        job = slurm_out / "rotmnist_table1" / f"{seed + 3}_rotmnist-cn_p64_seed{seed}"
        (job / "checkpoints").mkdir(parents=True)
        (job / "checkpoints" / f"epoch_0{seed}7.ckpt").write_bytes(b"weights")
        (job / "results.json").write_text(json.dumps({
            "experiment": "rotmnist/cn_p64", "seed": seed, "status": "completed",
            "checkpoint": f"checkpoints/epoch_0{seed}7.ckpt"}))
    # a CN(p4) record of seed 3 is no CN(p64) checkpoint
    other = slurm_out / "rotmnist_table1" / "9_rotmnist-cn_p4_seed3"
    other.mkdir(parents=True)
    (other / "results.json").write_text(json.dumps({
        "experiment": "rotmnist/cn_p4", "seed": 3, "status": "completed", "checkpoint": "checkpoints/epoch_001.ckpt"}))
    proc = _stage(stand_in, tmp_path, "paper-slurm", SLURM_OUT=str(slurm_out))
    assert proc.returncode == 1, proc.stderr[-2000:]
    calls = [line.split() for line in proc.stdout.splitlines() if line.startswith("CALL -m canonical_network.train")]
    sweeps = [next(w for w in call if w.startswith("sweep=")) for call in calls]
    assert set(sweeps) == {f"sweep={name}" for name in ("rotmnist_table1", "rotmnist_table2", "rotmnist_table6",
                                                        "nbody_table", "modelnet_table", "shapenet_table")}
    pretrained = {next(w for w in call if w.startswith("seed=")): call for call in calls
                  if "experiment=rotmnist/cn_pretrained" in call}
    assert sorted(pretrained) == ["seed=0", "seed=1", "seed=2", "seed=4"]
    for seed in (0, 1, 2, 4):
        call = pretrained[f"seed={seed}"]
        checkpoint = slurm_out / "rotmnist_table1" / f"{seed + 3}_rotmnist-cn_p64_seed{seed}" / "checkpoints" / \
            f"epoch_0{seed}7.ckpt"
        assert f"canonicalization.checkpoint='{checkpoint}'" in call
        assert "sweep=rotmnist_table2" in call
        assert f"hydra.sweep.dir={slurm_out}/rotmnist_table2/pretrained/seed{seed}" in call  # inside Table 2's
    assert "no completed rotmnist/cn_p64 seed 3" in proc.stderr


def test_paper_slurm_names_a_seed_whose_cn_p64_record_has_no_checkpoint_file(stand_in, tmp_path):
    """A record that tested its final weights, or whose checkpoint file is gone, gives CN(pretrained) nothing to
    start from: that seed is named, not submitted with a path that does not exist."""
    slurm_out = tmp_path / "slurm"
    for seed, checkpoint in ((0, "final weights"), (1, "checkpoints/epoch_009.ckpt")):
        job = slurm_out / "rotmnist_table1" / f"{seed}_rotmnist-cn_p64_seed{seed}"
        job.mkdir(parents=True)
        (job / "results.json").write_text(json.dumps({
            "experiment": "rotmnist/cn_p64", "seed": seed, "status": "completed", "checkpoint": checkpoint}))
    proc = _stage(stand_in, tmp_path, "paper-slurm", SLURM_OUT=str(slurm_out))
    assert proc.returncode == 1
    assert "experiment=rotmnist/cn_pretrained" not in proc.stdout
    for seed in (0, 1):
        assert f"no completed rotmnist/cn_p64 seed {seed} with a checkpoint file" in proc.stderr


def test_the_shapes40_stage_names_a_difficulty_in_its_folders(stand_in, tmp_path):
    """S40_DATA sets the 40-class generator's difficulty: its runs get folders of their own (never the default
    data's finished runs), named by the settings sorted by key, and pass the settings on; anything else is refused
    naming the valid keys. The scale jitter is always named, today's default when S40_DATA leaves it out: its
    default moved, and the folders that do not name it hold the runs at the earlier default."""
    from canonical_network.records import shapes_difficulty_defaults

    jitter = shapes_difficulty_defaults("SyntheticShapes40DataModule")["scale_jitter"]
    default = _stage(stand_in, tmp_path, "shapes40", PC_POINTS="1024", PC_TRAIN="4000", PC_EPOCHS="10")
    assert default.returncode == 0, default.stderr
    assert set(_variants(default.stdout, "modelnet/dgcnn")) == {f"s40_pts1024_n4000_scale_jitter{jitter}_z_z_ep10"}
    call = next(line for line in default.stdout.splitlines() if "modelnet/dgcnn" in line)
    assert f"data.scale_jitter={jitter}" in call.split()
    one = _stage(stand_in, tmp_path, "shapes40", S40_DATA="data.part_dropout=0.45")
    assert set(_variants(one.stdout, "modelnet/dgcnn")) == {f"s40_pts256_part_dropout0.45_scale_jitter{jitter}_z_z"}
    harder = _stage(stand_in, tmp_path, "shapes40", PC_POINTS="1024", PC_TRAIN="4000", PC_EPOCHS="10",
                    S40_DATA="data.scale_jitter=0.5 data.part_dropout=0.45")
    assert harder.returncode == 0, harder.stderr
    assert set(_variants(harder.stdout, "modelnet/dgcnn")) == {"s40_pts1024_n4000_part_dropout0.45_scale_jitter0.5_z_z_ep10"}
    call = next(line for line in harder.stdout.splitlines() if "modelnet/dgcnn" in line)
    assert "data.scale_jitter=0.5" in call.split() and "data.part_dropout=0.45" in call.split()
    refused = _stage(stand_in, tmp_path, "shapes40", S40_DATA="data.num_points=64")
    assert refused.returncode == 2 and "got 'data.num_points=64'" in refused.stderr and "scale_jitter" in refused.stderr
    twice = _stage(stand_in, tmp_path, "shapes40", S40_DATA="data.part_dropout=0.4 data.part_dropout=0.5")
    assert twice.returncode == 2 and "sets data.part_dropout twice" in twice.stderr and "CALL" not in twice.stdout


def _jobs(stdout: str) -> dict[tuple[str, str, int], str]:
    """(experiment, variant, seed) -> the overrides after ``--``, of every run_protocol.py call a stage printed."""
    jobs = {}
    for line in stdout.splitlines():
        if not line.startswith("CALL scripts/run_protocol.py"):
            continue
        head, overrides = line.split(" -- ", 1)
        words = head.split()
        variant = words[words.index("--variant") + 1] if "--variant" in words else ""
        seeds = words[words.index("--seeds") + 1:]
        seeds = [int(s) for s in seeds[:next(i for i, s in enumerate(seeds) if s.startswith("--"))]]
        for experiment in words[words.index("--experiments") + 1:]:
            jobs.update({(experiment, variant, seed): overrides for seed in seeds})
    return jobs


@pytest.mark.parametrize("gpu", [False, True])
def test_the_seeds_stages_take_every_scorecard_row_to_five_seeds(stand_in, tmp_path, gpu):
    """rotmnist-seeds beside the stages that made seeds 0-2 gives every Table 1, 2 and 6 row (and the authors'-
    protocol rows beside them) seeds 0-4 at the same overrides; G-CNN (p64 & = params) only on a GPU. nbody-seeds
    does the same for the four rows of Table 3's open claims, at nbody-paper's 10,000-epoch overrides."""
    extra = {"EXTRA": "trainer=gpu"} if gpu else {}
    earlier = {}
    for stage in ("rotmnist", "rotmnist-gcnn", "rotmnist-table6", "rotmnist-ablations"):
        proc = _stage(stand_in, tmp_path, stage, **extra)
        assert proc.returncode == 0, proc.stderr
        earlier.update(_jobs(proc.stdout))
    ablations = {"h16", "h32", "free16", "canon_lr1e-2", "temp0.1", "train4400"}
    earlier = {job: overrides for job, overrides in earlier.items() if job[1] not in ablations}
    proc = _stage(stand_in, tmp_path, "rotmnist-seeds", **extra)
    assert proc.returncode == 0, proc.stderr
    new = _jobs(proc.stdout)
    cpu_only = set() if gpu else {("rotmnist/gcnn_p64_eqparams", "")}
    rows = {(e, v) for e, v, _ in earlier}
    assert {(e, v) for e, v, _ in new} == rows - cpu_only
    for row in rows - cpu_only:
        assert {s for e, v, s in (*earlier, *new) if (e, v) == row} == {0, 1, 2, 3, 4}, row
        overrides = {o for (e, v, _), o in (*earlier.items(), *new.items()) if (e, v) == row}
        assert len(overrides) == 1, (row, overrides)

    proc = _stage(stand_in, tmp_path, "nbody-seeds")
    assert proc.returncode == 0, proc.stderr
    new = _jobs(proc.stdout)
    rows = ("nbody/cn_gnn", "nbody/cn_gnn_o3", "nbody/cn_gnn_frozen", "nbody/gnn")
    assert set(new) == {(e, "ep10000", s) for s in (3, 4) for e in rows}
    paper = _jobs(_stage(stand_in, tmp_path, "nbody-paper").stdout)
    for (experiment, variant, _), overrides in new.items():
        assert {o for (e, v, _), o in paper.items() if (e, v) == (experiment, variant)} == {overrides}
