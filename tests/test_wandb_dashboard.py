"""What reaches W&B: the logged images are the images, a sweep reads well on the dashboard, and offline runs hold
everything a later ``wandb sync`` uploads. Read back from the offline runs' own files (tests/wandb_offline.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from canonical_network.utils.config import PROJECT_ROOT
from canonical_network.utils.wandb_offline import problems, read_offline_run

TINY = ["trainer.max_epochs=2", "+trainer.limit_train_batches=2", "+trainer.limit_val_batches=2",
        "+trainer.limit_test_batches=1"]


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _train(*overrides: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "canonical_network.train", *overrides], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_the_logged_canonicalized_images_are_the_run_folders_pngs(tmp_path):
    """`make train`'s experiment: the W&B image of each epoch has the pixels of that epoch's PNG (it reached W&B
    all black, the same bytes every epoch), and a histogram of the chosen elements beside it."""
    result = _train("experiment=rotmnist/cn_p16", *TINY, f"hydra.run.dir={tmp_path / 'run'}",
                    env={"WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    run = read_offline_run(folder)
    logged = sorted((folder / "files" / "media" / "images" / "val").glob("canonicalized_*.png"),
                    key=lambda p: int(p.name.split("_")[1]))
    pngs = sorted((tmp_path / "run" / "canonicalized").glob("epoch_*.png"))
    assert len(logged) == len(pngs) == 2
    for media, png in zip(logged, pngs, strict=True):
        assert np.array_equal(_pixels(media), _pixels(png))
        assert _pixels(media).std() > 10  # not blank
    assert not np.array_equal(_pixels(logged[0]), _pixels(logged[1]))  # each epoch its own image
    assert run.media("val/canonicalized") == [logged[-1]] and problems(run) == []
    logged[-1].unlink()  # the completeness check is real: the summary's media file missing is named
    assert problems(read_offline_run(folder)) == [f"media file media/images/val/{logged[-1].name} is missing"]
    pose = run.summary["val/pose"]
    assert pose["_type"] == "histogram" and sum(pose["values"]) == 256 and len(pose["values"]) == 16  # C16
    assert "val/identity_rate" in run.history_keys
    # the printed upload command names this folder
    assert f"wandb sync {folder}" in result.stderr + result.stdout


@pytest.mark.slow  # four training jobs in one process: about a minute on two cores (make test-full)
def test_a_two_row_two_seed_multirun_gives_four_complete_runs_in_one_group(tmp_path):
    """Each job its own W&B run (an in-process multirun used to log every job into the first job's run), one group
    for the multirun, the row as job type, named by row and seed, the best validation value in the summary."""
    sweep = tmp_path / "sweep"
    result = _train("-m", "experiment=rotmnist/cnn,rotmnist/cn_p4", "seed=0,1", *TINY, f"hydra.sweep.dir={sweep}",
                    env={"WANDB_MODE": "offline"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [read_offline_run(folder) for folder in sorted(sweep.glob("*/wandb/offline-run-*"))]
    assert len(runs) == 4
    assert {run.run.run_group for run in runs} == {f"multirun/{sweep.name}"}
    assert sorted(run.run.job_type for run in runs) == ["rotmnist/cn_p4"] * 2 + ["rotmnist/cnn"] * 2
    assert sorted(run.run.display_name for run in runs) == ["rotmnist/cn_p4-seed0", "rotmnist/cn_p4-seed1",
                                                           "rotmnist/cnn-seed0", "rotmnist/cnn-seed1"]
    for run in runs:
        record = json.loads((run.folder.parents[1] / "results.json").read_text())
        # the summary holds the best validation value (as the record's best_val), and the tested metrics
        assert run.summary["val/acc"] == {"max": record["best_val"]["val/acc"]}
        assert abs(run.summary["test/error"] - record["metrics"]["test/error"]) < 1e-6
        assert {"family:rotmnist", "epochs:2"} <= set(run.run.tags)
        # readable, flat columns, and which code ran; no run-folder paths
        assert run.config["model.optimizer.lr"] == record["config"]["model"]["optimizer"]["lr"]
        assert run.config["code_version.commit"] == record["code_version"]["commit"]
        assert not any(key.startswith(("paths.", "logger.")) for key in run.config)
        # complete for a later `wandb sync`: the run, its config, summary and history, its end, and the media
        assert {"run", "config", "summary", "history", "exit"} <= set(run.kinds) and problems(run) == []
        media = run.media("val/canonicalized") if record["experiment"] == "rotmnist/cn_p4" else []
        assert all(path.is_file() for path in media)


def test_online_wandb_without_a_reachable_server_fails_in_one_line(tmp_path):
    with socket.socket() as probe:  # a port of this machine that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _train("experiment=rotmnist/cnn", *TINY, f"hydra.run.dir={tmp_path / 'run'}", timeout=300,
                    env={"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "WANDB_API_KEY": "x" * 40})
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("canonical_network.train: error: logger=wandb logs online") and f"127.0.0.1:{port}" in last
    assert not (tmp_path / "run" / "results.json").exists()


def test_diagnoses_figures_reach_wandb_with_their_pixels(tmp_path):
    result = subprocess.run([sys.executable, "-m", "canonical_network.diagnose", "experiment=rotmnist/cn_p4",
                             "diagnose.num_samples=8", "logger=wandb", f"hydra.run.dir={tmp_path / 'diag'}"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "diag" / "wandb").glob("offline-run-*")
    run = read_offline_run(folder)
    for name in ("canonical_pairs", "pose"):
        (media,) = run.media(f"diagnose/{name}")
        png = tmp_path / "diag" / "figures" / f"{name}.png"
        assert np.array_equal(_pixels(media), _pixels(png)) and _pixels(media).std() > 10
