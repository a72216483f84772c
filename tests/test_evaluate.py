"""``evaluate``: a checkpoint carries its run config, and its test loop runs again from the file alone.

Tiny real runs (an image row and an N-body row) are trained once per module; their best checkpoints are
then evaluated in the same process and once through the command line. Same data and weights give the same
test metrics; evaluation options change what is reported; the network can never be overridden.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from canonical_network.canonicalization.pretrained import from_checkpoint
from canonical_network.data.nbody import NBodyDataModule
from canonical_network.evaluate import _command_line, compose_evaluation, evaluate
from canonical_network.records import (
    EVALUATED,
    RESULTS_FILE,
    load_runs,
    read_results,
    record_path,
    write_results,
)
from canonical_network.tables import build_table
from canonical_network.train import run
from canonical_network.utils.checkpoints import (
    RUN_CONFIG_KEY,
    CheckpointWithoutConfig,
    model_from_checkpoint,
    run_config_from_checkpoint,
)
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import PROJECT_ROOT
from tests.helpers import compose_config, shrink

pytestmark = pytest.mark.usefixtures("one_thread")

#: Agreement asked of an evaluation with its training run's test: the same float32 computation on the same
#: data and weights, in the same process or another on the same machine (observed: identical).
AGREEMENT = 1e-6
IMAGE_ROW = ["experiment=rotmnist/cnn", "data.batch_size=32"]
NBODY_TINY = {"num_train": 16, "num_valid": 8, "num_test": 16}


def _trained(tmp_path_factory, name: str, overrides: list[str]) -> tuple[dict, str]:
    run_dir = tmp_path_factory.mktemp(name)
    cfg = shrink(compose_config(overrides, run_dir))
    cfg.trainer.limit_test_batches = 2
    results = run(cfg)
    assert results["checkpoint"].endswith(".ckpt")
    return results, str(record_path(results, "checkpoint"))


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """``(results, best checkpoint)`` of a tiny rotmnist/cnn run (two test batches of 32 images)."""
    return _trained(tmp_path_factory, "image_run", IMAGE_ROW)


@pytest.fixture(scope="module")
def nbody_run(tmp_path_factory):
    """``(results, best checkpoint)`` of a tiny nbody/cn_gnn run (learned canonicalizer) on 16 simulations."""
    data_dir = tmp_path_factory.mktemp("nbody_data")
    NBodyDataModule(data_dir=str(data_dir), **NBODY_TINY).prepare_data()
    overrides = ["experiment=nbody/cn_gnn", f"data.data_dir={data_dir}", "data.batch_size=8",
                 "trainer.check_val_every_n_epoch=1", *(f"data.{k}={v}" for k, v in NBODY_TINY.items())]
    return _trained(tmp_path_factory, "nbody_run", overrides)


@pytest.fixture(scope="module")
def canonicalized_image_run(tmp_path_factory):
    """``(results, best checkpoint)`` of a tiny rotmnist/cn_p4 run (a learned C4 canonicalizer, trained
    canonically)."""
    return _trained(tmp_path_factory, "canonicalized_image_run", ["experiment=rotmnist/cn_p4", "data.batch_size=32"])


def assert_same_metrics(evaluated: dict, trained: dict) -> float:
    assert evaluated.keys() == trained.keys()
    worst = max(abs(evaluated[k] - trained[k]) for k in trained)
    assert worst <= AGREEMENT, {k: (evaluated[k], trained[k]) for k in trained}
    return worst


# ------------------------------------------------------------------------------------ the checkpoint

def test_checkpoint_carries_the_resolved_run_config(image_run):
    results, ckpt = image_run
    entry = torch.load(ckpt, map_location="cpu", weights_only=True)[RUN_CONFIG_KEY]
    assert entry == {"version": 1, "config": results["config"]}
    assert run_config_from_checkpoint(ckpt).model.orbit_rotations == 4
    model = model_from_checkpoint(ckpt)
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert not model.training
    assert all(torch.equal(value, trained[key]) for key, value in model.state_dict().items())
    assert len(model_from_checkpoint(ckpt, ["model.orbit_rotations=8"]).orbit) == 8


def test_pretrained_canonicalizer_reads_its_source_architecture_from_the_checkpoint(image_run):
    # no .hydra/ above this run's folder: the architecture can only come from the checkpoint itself, and the
    # rotmnist/cnn source is then refused for what it is, a run without canonicalizer weights
    _, ckpt = image_run
    assert not any((parent / ".hydra").exists() for parent in Path(ckpt).resolve().parents)
    with pytest.raises(ValueError, match="holds no canonicalizer weights .*identity.IdentityCanonicalizer"):
        from_checkpoint(ckpt)


def test_checkpoint_without_run_config_gets_one_clear_error(image_run, tmp_path):
    _, ckpt = image_run
    old = torch.load(ckpt, map_location="cpu", weights_only=True)
    del old[RUN_CONFIG_KEY]
    torch.save(old, tmp_path / "old.ckpt")
    for rebuild in (run_config_from_checkpoint, model_from_checkpoint, compose_evaluation):
        with pytest.raises(CheckpointWithoutConfig, match=r"predates .* ckpt_path=.* or train the row again"):
            rebuild(tmp_path / "old.ckpt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        compose_evaluation(tmp_path / "missing.ckpt")


# ------------------------------------------------------------------------------------ evaluating

def test_evaluation_reproduces_the_training_runs_test_metrics(image_run, tmp_path):
    trained, ckpt = image_run
    results = evaluate(compose_evaluation(ckpt, ["logger=csv"], tmp_path))
    assert_same_metrics(results["metrics"], trained["metrics"])
    assert read_results(tmp_path) == json.loads(json.dumps(results))
    assert results["status"] == EVALUATED and results["experiment"] == "rotmnist/cnn"
    assert results["checkpoint"] == str(Path(ckpt).resolve())
    assert results["params"] == trained["params"] and results["run_dir"] == str(tmp_path)
    assert (tmp_path / "csv" / "metrics.csv").is_file()


def test_nbody_evaluation_reproduces_the_training_runs_test_mse(nbody_run, tmp_path):
    trained, ckpt = nbody_run
    results = evaluate(compose_evaluation(ckpt, ["logger=none"], tmp_path))
    assert "test/mse" in results["metrics"]
    assert_same_metrics(results["metrics"], trained["metrics"])
    # a data option, not the network: two test batches of 4 are the first 8 of the 16 systems, another MSE
    half = evaluate(compose_evaluation(ckpt, ["logger=none", "data.batch_size=4"], tmp_path / "half"))
    assert half["metrics"]["test/mse"] != results["metrics"]["test/mse"]
    assert half["config"]["data"]["batch_size"] == 4 and half["params"] == trained["params"]


def test_evaluation_options_change_what_is_reported(image_run, tmp_path):
    trained, ckpt = image_run
    results = evaluate(compose_evaluation(ckpt, ["logger=none", "model.orbit_rotations=8"], tmp_path))
    new = results["metrics"].keys() - trained["metrics"].keys()
    assert new == {f"test/orbit/error_g{k}" for k in range(4, 8)}
    assert abs(results["metrics"]["test/loss"] - trained["metrics"]["test/loss"]) <= AGREEMENT  # same network
    assert results["config"]["model"]["orbit_rotations"] == 8


@pytest.mark.parametrize("override, key", [
    ("canonicalization.num_rotations=8", "canonicalization.num_rotations"),
    ("canonicalization.prior_weight=1.0", "canonicalization.prior_weight"),
    ("+canonicalization.frame_extra=1", "canonicalization.frame_extra"),
    ("model.canonicalizer.symmetrization=full", "model.canonicalizer.symmetrization"),
    ("canonicalization=gcnn", "canonicalization"),
    ("prediction.width=2.0", "prediction.width"),
    ("model.num_classes=5", "model.num_classes"),
    ("model.optimizer.lr=0.1", "model.optimizer.lr"),
    ("+model.predictor.extra=1", "model.predictor.extra"),
    ("data_info.num_classes=5", "data_info.num_classes"),
    ("experiment=rotmnist/cn_p4", "experiment"),
])
def test_architecture_overrides_are_refused_naming_the_key(image_run, tmp_path, override, key):
    _, ckpt = image_run
    expected = rf"^{key} cannot be overridden when evaluating a checkpoint.*What may be overridden: data .*" \
               r"model\.orbit_rotations, model\.orbit_reflection"
    with pytest.raises(ConfigError, match=expected):
        compose_evaluation(ckpt, [override], tmp_path / "eval")
    assert not (tmp_path / "eval").exists()
    with pytest.raises(ConfigError, match=rf"^{key} cannot be overridden"):
        model_from_checkpoint(ckpt, [override])


@pytest.mark.parametrize("override, key, value, spec", [
    ("canonicalization.symmetrization=sampled", "symmetrization", "sampled", "mode"),
    ("canonicalization.frame_size=3", "frame_size", 3, "size"),
    ("canonicalization.frame_temperature=0.5", "frame_temperature", 0.5, "temperature"),
    ("canonicalization.frame_weights=softmax_gap", "frame_weights", "softmax_gap", "weights"),
])
def test_the_symmetrization_keys_may_be_overridden_and_reach_the_canonicalizer(canonicalized_image_run, override,
                                                                               key, value, spec):
    _, ckpt = canonicalized_image_run
    assert compose_evaluation(ckpt, [override]).canonicalization[key] == value
    model = model_from_checkpoint(ckpt, [override])  # the same weights, strictly loaded
    assert getattr(model.canonicalizer.frame_spec, spec) == value
    assert model.run_config["model"]["canonicalizer"][key] == value
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())


def test_a_checkpoint_trained_canonically_is_evaluated_with_a_weighted_frame(canonicalized_image_run, tmp_path):
    trained, ckpt = canonicalized_image_run
    assert trained["config"]["canonicalization"]["symmetrization"] == "canonical"
    overrides = ["logger=none", "canonicalization.symmetrization=weighted_frame", "canonicalization.frame_size=2"]
    results = evaluate(compose_evaluation(ckpt, overrides, tmp_path))
    assert results["status"] == EVALUATED and results["params"] == trained["params"]  # no weights added
    for node in (results["config"]["canonicalization"], results["config"]["model"]["canonicalizer"]):
        assert node["symmetrization"] == "weighted_frame" and node["frame_size"] == 2
    assert read_results(tmp_path)["config"]["canonicalization"]["symmetrization"] == "weighted_frame"
    assert results["metrics"].keys() == trained["metrics"].keys()
    # two predictor passes per input: the frame holds the two best of the four rotations
    model = model_from_checkpoint(ckpt, overrides[1:])
    images = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs, frame = model.network.frame_outputs(images)
    assert outputs.shape[:2] == (2, 3) and frame.size == 2


def test_a_symmetrization_the_canonicalizer_cannot_build_fails_with_its_own_error(canonicalized_image_run,
                                                                                  tmp_path):
    _, ckpt = canonicalized_image_run
    cfg = compose_evaluation(ckpt, ["logger=none", "canonicalization.symmetrization=averaged"], tmp_path / "eval")
    expected = r"canonicalization\.symmetrization must be one of \['canonical', 'weighted_frame', 'sampled', " \
               r"'full'\]; got 'averaged'"
    with pytest.raises(ConfigError, match=expected):
        evaluate(cfg)
    assert not (tmp_path / "eval" / RESULTS_FILE).exists()
    with pytest.raises(Exception, match=expected):
        model_from_checkpoint(ckpt, ["canonicalization.symmetrization=averaged"])


def test_data_of_another_task_is_refused_before_anything_is_created(image_run, tmp_path):
    _, ckpt = image_run
    with pytest.raises(ConfigError, match="data=nbody .* does not fit the model's task ImageClassificationTask"):
        evaluate(compose_evaluation(ckpt, ["logger=none", "data=nbody"], tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_command_line_evaluates_into_its_own_folder_with_the_training_loggers(image_run, tmp_path):
    trained, ckpt = image_run
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "canonical_network.evaluate"]
    proc = subprocess.run([*command, f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'cli'}"], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(tmp_path / "cli")
    assert results["status"] == EVALUATED and f"ckpt_path={ckpt}" in results["overrides"]
    worst = assert_same_metrics(results["metrics"], trained["metrics"])
    print(f"largest |evaluated - trained| over {len(trained['metrics'])} test metrics: {worst:.3g}")
    assert (tmp_path / "cli" / "csv" / "metrics.csv").is_file() and (tmp_path / "cli" / "evaluate.log").is_file()
    assert list((tmp_path / "cli" / "wandb").glob("offline-run-*")), "W&B should run offline by default"
    assert "wandb sync" in proc.stdout

    # refused before Hydra creates anything
    refused = subprocess.run([*command, f"ckpt_path={ckpt}", "prediction.dropout=0.0",
                              f"hydra.run.dir={tmp_path / 'refused'}"], cwd=PROJECT_ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "prediction.dropout cannot be overridden" in refused.stderr
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_command_line_on_three_processes_reports_the_one_process_metrics(nbody_run, tmp_path):
    """The command docs/reproducing.md gives for DDP evaluation, ``evaluate ckpt_path=<file> trainer=ddp_cpu
    trainer.devices=3``, on a learned-canonicalizer checkpoint whose 16 test systems do not divide by 3: the
    metrics of one process. Tolerance: the processes' partial sums (MSE, losses) are added in another order,
    rel 2¹² eps32, as tests/test_ddp_evaluation.py; a sample counted twice or dropped moves the MSE by ~1/16."""
    _, ckpt = nbody_run
    single = evaluate(compose_evaluation(ckpt, ["logger=none", "trainer=cpu"], tmp_path / "one"))
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "canonical_network.evaluate", f"ckpt_path={ckpt}", "trainer=ddp_cpu",
                           "trainer.devices=3", "logger=none", f"hydra.run.dir={tmp_path / 'three'}"],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parallel = read_results(tmp_path / "three")
    assert parallel["config"]["trainer"]["devices"] == 3 and parallel["status"] == EVALUATED
    assert parallel["metrics"].keys() == single["metrics"].keys() and "test/mse" in single["metrics"]
    rtol = 2**12 * torch.finfo(torch.float32).eps
    for key, value in single["metrics"].items():
        assert parallel["metrics"][key] == pytest.approx(value, rel=rtol, abs=0), key


def test_command_line_needs_one_checkpoint():
    assert _command_line(["ckpt_path=a.ckpt", "seed=1"]) == ("a.ckpt", ["ckpt_path=a.ckpt", "seed=1"])
    with pytest.raises(ConfigError, match="ckpt_path is required"):
        _command_line(["model.orbit_rotations=8"])
    with pytest.raises(ConfigError, match="one checkpoint per command"):
        _command_line(["-m", "ckpt_path=a.ckpt,b.ckpt"])


def test_an_evaluation_never_writes_into_another_runs_folder(image_run, tmp_path):
    trained, ckpt = image_run
    run_dir = trained["run_dir"]
    with pytest.raises(ConfigError, match="already holds a results.json"):
        _command_line([f"ckpt_path={ckpt}", f"hydra.run.dir={run_dir}"])  # before Hydra writes .hydra/ there
    with pytest.raises(ConfigError, match="already holds a results.json"):
        evaluate(compose_evaluation(ckpt, ["logger=none"], run_dir))
    assert read_results(run_dir)["status"] == "completed"
    # an unfinished training run's folder (checkpoints, no record yet) is another run's folder too: its own
    # results.json, written when it finishes, would replace the evaluation's
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="training run's checkpoints/"):
        _command_line([f"ckpt_path={ckpt}", f"hydra.run.dir={unfinished}"])
    with pytest.raises(ConfigError, match="training run's checkpoints/"):
        evaluate(compose_evaluation(ckpt, ["logger=none"], unfinished))
    assert sorted(p.name for p in unfinished.iterdir()) == ["checkpoints"]


# ------------------------------------------------------------------------------------ readers

def test_tables_and_reports_do_not_count_an_evaluation_as_a_run(tmp_path):
    base = {"experiment": "rotmnist/cnn", "seed": 0, "overrides": [], "config": {}}
    write_results(_folder(tmp_path / "train"), {**base, "status": "completed", "metrics": {"test/error": 2.0}})
    write_results(_folder(tmp_path / "evaluate"), {**base, "status": EVALUATED, "metrics": {"test/error": 9.0},
                                                   "checkpoint": "train/checkpoints/last.ckpt"})
    runs = load_runs(tmp_path)
    assert [r["status"] for r in runs] == ["completed"]
    spec = {"metric": "test/error", "columns": [{"name": "error"}],
            "rows": [{"name": "CNN", "experiment": "rotmnist/cnn"}]}
    [(_, [cell])] = build_table(spec, runs)
    assert cell.values == [2.0] and cell.failures == []
    both = load_runs(tmp_path, include_evaluated=True)
    assert sorted(r["status"] for r in both) == ["completed", EVALUATED]
    assert all((tmp_path / d / RESULTS_FILE).is_file() for d in ("train", "evaluate"))


def _folder(path):
    path.mkdir(parents=True)
    return path


# ------------------------------------------------------------------------------------ another machine's checkpoint

def _with_stored_config(ckpt, path, edit):
    """A copy of ``ckpt`` whose stored run config ``edit`` changed in place (as another machine's run stored it)."""
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    edit(checkpoint[RUN_CONFIG_KEY]["config"])
    torch.save(checkpoint, path)
    return path


def test_data_paths_follow_this_machine_and_a_stored_download_is_not_inherited(image_run, tmp_path):
    _, ckpt = image_run
    elsewhere = "/home/otheruser/canonical_network/data"

    def trained_elsewhere(config):
        config["paths"]["data_dir"] = elsewhere
        config["data"] = {"_target_": "canonical_network.data.rotated_mnist.RotatedMNISTDataModule",
                          "data_dir": f"{elsewhere}/rotated_mnist", "num_train": 10000, "batch_size": 128,
                          "num_workers": 0, "augmentation": "none", "download": True}

    moved = _with_stored_config(ckpt, tmp_path / "moved.ckpt", trained_elsewhere)
    mine = tmp_path / "mydata"
    cfg = compose_evaluation(moved, [f"paths.data_dir={mine}"])
    assert cfg.data.data_dir == f"{mine}/rotated_mnist" and cfg.data.download is False
    assert compose_evaluation(moved).data.data_dir == str(PROJECT_ROOT / "data" / "rotated_mnist")
    # downloading stays possible, when this command line asks for it
    assert compose_evaluation(moved, [f"paths.data_dir={mine}", "data.download=true"]).data.download is True


def test_a_pretrained_backbone_is_rebuilt_without_its_weights_file(tmp_path):
    import torchvision
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from canonical_network.utils.checkpoints import load_weights, run_config_entry, without_pretrained_weights

    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    cfg = compose_config(["experiment=adapt_mnist/resnet18", f"prediction.weights={weights}", "data.batch_size=4"],
                         tmp_path / "run")
    model = instantiate(cfg.model).eval()
    assert model.network.predictor.normalize  # normalize=auto with weights: ImageNet's statistics
    ckpt = tmp_path / "adapt.ckpt"
    torch.save({"state_dict": model.state_dict(),
                RUN_CONFIG_KEY: run_config_entry(OmegaConf.to_container(cfg, resolve=True))}, ckpt)
    weights.unlink()  # another machine: the file the run started from is not there; the checkpoint holds every weight

    rebuilt = instantiate(without_pretrained_weights(compose_evaluation(ckpt).model))
    load_weights(rebuilt, torch.load(ckpt, map_location="cpu", weights_only=True), ckpt)
    rebuilt.eval()
    assert rebuilt.network.predictor.normalize  # auto resolved as the run resolved it
    images = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(rebuilt(images), model(images))
    overrides = ["logger=none", "trainer.accelerator=cpu", "trainer.limit_test_batches=1", "model.orbit_rotations=0"]
    results = evaluate(compose_evaluation(ckpt, overrides, tmp_path / "eval"))
    assert results["status"] == EVALUATED and "test/error" in results["metrics"]
    # the record states the run's network as it was trained: from those weights
    assert results["config"]["prediction"]["weights"] == str(weights)

    # the other two readers of a checkpoint rebuild it the same way: from Python, and the diagnose command
    from canonical_network.diagnose import run as diagnose
    from canonical_network.utils.checkpoints import model_from_checkpoint

    with torch.no_grad():
        assert torch.equal(model_from_checkpoint(ckpt)(images), model(images))
    from omegaconf import open_dict

    from canonical_network.utils.config import compose_experiment

    diagnosis = compose_experiment(["experiment=adapt_mnist/resnet18", f"prediction.weights={weights}",
                                    f"ckpt_path={ckpt}", "logger=none", "diagnose.num_samples=2",
                                    "diagnose.num_elements=2", "diagnose.figures=false"], config_name="diagnose")
    with open_dict(diagnosis):
        diagnosis.paths.output_dir = str(tmp_path / "diagnose")
    assert diagnose(diagnosis)["equivariance"]["exact"]["max_rel"] >= 0


def test_an_error_hydra_wrapped_is_shown_as_its_own_message():
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from canonical_network.utils.runs import building_error

    with pytest.raises(InstantiationException) as caught:
        instantiate({"_target_": "canonical_network.prediction.cnn.CNN", "width": -1.0})
    assert "Error in call to target" in str(caught.value)
    assert building_error(caught.value) == "prediction.width must be a number > 0; got -1.0"


def test_a_refused_evaluation_prints_one_line_and_exits_with_status_2(image_run, tmp_path):
    _, ckpt = image_run
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "canonical_network.evaluate"]
    # refused after composing (the data module's own check, inside Hydra's instantiate)
    proc = subprocess.run([*command, f"ckpt_path={ckpt}", "data.batch_size=0", "logger=none",
                           f"hydra.run.dir={tmp_path / 'refused'}"], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error in call to target" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("canonical_network.evaluate")]
    assert errors == ["canonical_network.evaluate: error: data.batch_size must be an integer >= 1; got 0"]
    assert not (tmp_path / "refused").exists()
    # refused before composing: the same line and status
    proc = subprocess.run([*command, "model.orbit_rotations=8"], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("canonical_network.evaluate: error: ckpt_path is required")
