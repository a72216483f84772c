"""The entrypoint end to end: a real (tiny) run as a user starts it, and early failures on bad config."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import hydra
import pytest
from lightning import Trainer

from canonical_network.records import RESULTS_FILE, read_results, record_path
from canonical_network.train import run
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import PROJECT_ROOT
from tests.helpers import compose_config, shrink

CONTRACT_KEYS = {"experiment", "seed", "overrides", "metrics", "params", "wall_time_s"}


def test_cli_fast_run_writes_results_and_offline_wandb(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-m", "canonical_network.train", "experiment=rotmnist/cn_p4", "debug=fast", "seed=3",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(run_dir)
    assert CONTRACT_KEYS <= results.keys()
    assert results["experiment"] == "rotmnist/cn_p4" and results["seed"] == 3
    assert "seed=3" in results["overrides"]
    assert {"test/error", "test/acc", "test/loss"} <= results["metrics"].keys()
    assert 0.0 <= results["metrics"]["test/error"] <= 100.0
    assert results["params"]["canonicalizer"] > 0 and results["params"]["predictor"] > 0
    assert results["environment"]["device"] == "CPU" and "cores" in results["environment"]["machine"]
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "canonicalized" / "epoch_0000.png").is_file()
    assert (run_dir / "csv" / "metrics.csv").is_file()
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline_runs, "W&B should run offline by default"
    assert "wandb sync" in proc.stdout
    # the record's status goes to the W&B summary (tables read it: a diverged run also "finishes" to W&B); an
    # offline run keeps its summary updates in its .wandb log, as a key and its JSON value
    (log,) = offline_runs[0].glob("*.wandb")
    assert re.search(rb"status.{0,8}\"completed\"", log.read_bytes(), re.DOTALL)


def test_bad_num_rotations_fails_before_training(tmp_path):
    cfg = shrink(compose_config(["experiment=rotmnist/cn_p4", "canonicalization.num_rotations=0"], tmp_path))
    with pytest.raises(Exception, match="canonicalization.num_rotations must be an integer >= 1; got 0"):
        run(cfg)
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / RESULTS_FILE).exists()


def test_finished_run_is_final_and_continues_in_a_new_folder(tmp_path):
    from canonical_network.train import RunFolderFinished

    cfg = shrink(compose_config(["experiment=rotmnist/cnn"], tmp_path / "first"))
    first = run(cfg)
    assert first["epochs"] == 1 and first["resumed_from"] is None
    record = {p: p.read_bytes() for p in (tmp_path / "first").rglob("*") if p.is_file()}
    cfg.trainer.max_epochs = 2
    with pytest.raises(RunFolderFinished, match="holds a completed run"):
        run(cfg)  # the same folder: its record is final
    assert {p: p.read_bytes() for p in (tmp_path / "first").rglob("*") if p.is_file()} == record
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    more = shrink(compose_config(["experiment=rotmnist/cnn", f"ckpt_path={last}"], tmp_path / "more"))
    more.trainer.max_epochs = 2
    second = run(more)  # continues from the first run's last.ckpt, trains one more epoch only
    assert record_path(second, "resumed_from") == last and second["epochs"] == 2
    assert second["fit_time_s"] > first["fit_time_s"] > 0  # the resumed run adds to the first one's time
    assert (tmp_path / "more" / RESULTS_FILE).is_file()


def test_a_continuation_resumes_its_own_folder_when_run_again(tmp_path):
    """``hydra.run.dir=<new> ckpt_path=<old last.ckpt>`` run again after an interruption (or requeued) resumes the
    new folder's own progress, not the old checkpoint (which would overwrite its newer checkpoints and drop its
    metric rows); ``resume=false`` starts the folder over from ckpt_path, the previous files set aside."""
    import torch

    first = run(shrink(compose_config(["experiment=rotmnist/cnn"], tmp_path / "first")))
    assert first["status"] == "completed"
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    more_dir = tmp_path / "more"

    def more(epochs, *extra):
        cfg = shrink(compose_config(["experiment=rotmnist/cnn", f"ckpt_path={last}", *extra], more_dir))
        cfg.trainer.max_epochs = epochs
        return cfg

    run(more(2))
    (more_dir / RESULTS_FILE).unlink()  # stopped before its test: the same command is run again, for 3 epochs
    own = more_dir / "checkpoints" / "last.ckpt"
    assert torch.load(own, weights_only=True)["epoch"] == 1
    again = run(more(3))
    assert record_path(again, "resumed_from") == own and again["epochs"] == 3
    (more_dir / RESULTS_FILE).unlink()
    over = run(more(2, "resume=false"))  # start over from the first run's checkpoint
    assert record_path(over, "resumed_from") == last and over["epochs"] == 2
    (aside,) = (more_dir / "superseded").iterdir()
    assert torch.load(aside / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 2  # kept, not lost
    (more_dir / RESULTS_FILE).unlink()
    # resume=false from one of the folder's own checkpoints: those are what it sets aside, so it is refused
    before = {p: p.read_bytes() for p in more_dir.rglob("*") if p.is_file() and p.name != ".run.lock"}
    cfg = shrink(compose_config(["experiment=rotmnist/cnn", f"ckpt_path={own}", "resume=false"], more_dir))
    with pytest.raises(ConfigError, match="lies in the run folder"):
        run(cfg)
    assert {p: p.read_bytes() for p in more_dir.rglob("*") if p.is_file() and p.name != ".run.lock"} == before


def test_test_ckpt_chooses_best_or_final_weights(tmp_path):
    best = run(shrink(compose_config(["experiment=rotmnist/cnn"], tmp_path / "best")))
    assert best["checkpoint"].endswith(".ckpt") and best["checkpoint"].startswith("checkpoints/epoch_")
    assert record_path(best, "checkpoint").is_file()
    last = run(shrink(compose_config(["experiment=rotmnist/cnn", "test_ckpt=last"], tmp_path / "last")))
    assert last["checkpoint"] == "final weights" and "test/error" in last["metrics"]
    with pytest.raises(ValueError, match=r"test_ckpt must be one of \['best', 'last'\]; got 'final'"):
        run(shrink(compose_config(["experiment=rotmnist/cnn", "test_ckpt=final"], tmp_path / "bad")))


@pytest.mark.parametrize("metric", ["val/ac", "val/mse"])  # a typo; another task's metric (N-body)
def test_a_metric_the_task_never_logs_is_refused_before_training(tmp_path, metric):
    """Lightning lets a checkpoint callback or early stopping monitor a name nobody logs: the run used to
    complete, tested on its final weights with no best epoch (``best_val`` empty), recorded ``completed``."""
    run_dir = tmp_path / metric.replace("/", "-")
    cfg = shrink(compose_config(["experiment=rotmnist/cnn", f"optimized_metric={metric}"], run_dir))
    with pytest.raises(ConfigError, match=rf"monitors '{metric}'.*ImageClassificationTask never logs; valid "
                                          r"choices: \[.*'val/acc'"):
        run(cfg)
    assert not (run_dir / RESULTS_FILE).exists() and not (run_dir / "checkpoints").exists()


def test_every_name_a_task_logs_in_validation_is_monitorable(tmp_path):
    """What ``monitorable_metrics`` lists is what one validation epoch logs (part segmentation's figures
    included), so the check above refuses no metric that is really there."""
    from lightning.pytorch.callbacks import Callback

    class Seen(Callback):
        def on_validation_end(self, trainer, pl_module):
            self.names = set(trainer.callback_metrics)

    for experiment in ("shapenet/pointnet", "rotmnist/cnn"):
        cfg = shrink(compose_config([f"experiment={experiment}"], tmp_path / experiment.replace("/", "-")))
        model, datamodule = hydra.utils.instantiate(cfg.model), hydra.utils.instantiate(cfg.data)
        seen = Seen()
        trainer = Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=False,
                          enable_checkpointing=False, enable_progress_bar=False, callbacks=[seen],
                          default_root_dir=tmp_path)
        trainer.fit(model, datamodule=datamodule)
        logged = {name for name in seen.names if name.startswith(("train/", "val/"))}
        assert logged and logged <= model.monitorable_metrics(), logged - model.monitorable_metrics()
        assert {name for name in model.monitorable_metrics() if name.startswith("val/")} <= logged


@pytest.mark.parametrize(("override", "message"), [
    # a component's own check, raised inside Hydra's instantiate: its message, not Hydra's wrapper around it
    ("canonicalization.num_rotations=0", "canonicalization.num_rotations must be an integer >= 1; got 0"),
    ("seed=abc", "seed must be an integer; got 'abc'"),  # the config check before anything is built
])
def test_a_refused_single_run_says_why_on_one_line(tmp_path, override, message):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "canonical_network.train", "experiment=rotmnist/cn_p4", override,
           f"hydra.run.dir={run_dir}", "logger=none"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"canonical_network.train: error: {message}"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not run_dir.exists()


def test_building_errors_keep_the_components_message():
    """Hydra wraps a component's error in InstantiationException ("Error in call to target ...
    full_key: ..."): the message shown is the component's own; another error type keeps its name and the node."""
    from hydra.errors import InstantiationException

    from canonical_network.train import building_error

    def wrapped(inner: Exception) -> InstantiationException:
        try:
            try:
                raise inner
            except Exception as cause:
                raise InstantiationException(f"Error in call to target 'x.Y':\n{inner!r}\nfull_key: model.canonicalizer") from cause
        except InstantiationException as error:
            return error

    assert building_error(wrapped(ValueError("canonicalization.k must be >= 1; got 0"))) == \
        "canonicalization.k must be >= 1; got 0"
    assert building_error(wrapped(TypeError("unexpected keyword argument 'z'"))) == \
        "TypeError: unexpected keyword argument 'z' (building model.canonicalizer)"
    assert building_error(RuntimeError("plain")) == "plain"


def test_library_caches_go_to_the_runs_log_dir(tmp_path, monkeypatch):
    """paths.root_dir=<elsewhere> moves the runs and the W&B/matplotlib caches with them: nothing lands in the
    working directory's outputs/."""
    from canonical_network.utils.runs import set_local_dirs

    names = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "MPLCONFIGDIR")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    log_dir = tmp_path / "elsewhere" / "outputs"
    set_local_dirs(log_dir / "runs" / "one", log_dir)
    assert os.environ["WANDB_DIR"] == str(log_dir / "runs" / "one")
    assert all(os.environ[name].startswith(str(log_dir / ".cache")) for name in names[1:])


@pytest.mark.parametrize("config", ["hydra/default.yaml", "evaluate.yaml"])
def test_a_multirun_jobs_folder_stays_inside_its_sweep_whatever_the_seed(config):
    """The job folder's name is built from values given on the command line: a seed like '/../../elsewhere' (a
    multirun job fails on it only after Hydra made the folder) must not climb out of the sweep folder."""
    import yaml
    from omegaconf import OmegaConf

    import canonical_network.utils.config as config_module

    text = yaml.safe_load((config_module.CONFIG_DIR / config).read_text())
    sweep = text["sweep"] if "sweep" in text else text["hydra"]["sweep"]
    node = OmegaConf.create({"subdir": sweep["subdir"], "hydra": {"job": {"num": 0}},
                             "experiment_name": "rotmnist/cnn", "seed": "/../../elsewhere"})
    assert "/" not in node.subdir and node.subdir.endswith("seed..-..-elsewhere"), node.subdir
    node.seed = 3  # an integer seed names the folder as it always did: resumed sweeps find their jobs
    assert node.subdir.endswith("_seed3")
