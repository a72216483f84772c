"""Bad input is refused before the run is admitted, in one line (exit status 2) naming the value and the valid
choices: input sizes against the data's facts, unknown keys with the closest names, corrupt data files,
unwritable output folders, a claims file naming an experiment that does not exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import PROJECT_ROOT, check_output_writable, check_override_keys
from canonical_network.utils.run_config import validate_run_config
from tests.helpers import compose_config


def _refusal(capsys, call) -> str:
    """The one line a check printed before exiting with status 2."""
    with pytest.raises(SystemExit) as exited:
        call()
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


# --- input sizes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "message"), [
    ("canonicalization.image_size=32", "canonicalization.image_size=32 does not match the data: "
                                       "data=rotated_mnist_5k gives 28 (data_info.image_size)"),
    ("prediction.image_size=32", "prediction.image_size=32 does not match the data"),
    ("prediction.in_channels=3", "prediction.in_channels=3 does not match the data: data=rotated_mnist_5k gives 1"),
])
def test_a_component_built_for_other_inputs_than_the_data_gives_is_refused(override, message):
    with pytest.raises(ConfigError) as refused:
        validate_run_config(compose_config(["experiment=rotmnist/cn_p4", override]))
    assert message in str(refused.value)


def test_the_train_command_refuses_it_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "canonical_network.train", "experiment=rotmnist/cn_p4",
                             "canonicalization.image_size=32", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "canonical_network.train: error: canonicalization.image_size=32 does not match the data")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("shape", "advice"), [
    ((28, 28), "add batch and channel dimensions: images[None, None] -> (1, 1, 28, 28)"),
    ((1, 28, 28), "a single 1-channel image? add the batch dimension: images[None] -> (1, 1, 28, 28)"),
    ((8, 28, 28), "a batch of 8 images without their channel axis? add it: images[:, None] -> (8, 1, 28, 28)"),
    ((2, 1, 32, 32), "was built for 28×28 images (canonicalization.image_size=28); got 32×32"),
    ((2, 3, 28, 28), "was built for 1-channel images (in_channels=1); got 3 channels"),
    ((2, 4, 1, 28, 28), "more than one batch dimension? merge them: images.flatten(0, -4)"),
])
def test_the_canonicalizer_says_what_is_wrong_with_its_input_and_how_to_fix_it(shape, advice):
    import canonical_network as cn

    canonicalizer = cn.GCNNCanonicalizer(num_rotations=4, in_channels=1, image_size=28)
    with pytest.raises(ValueError) as refused:
        canonicalizer(torch.rand(*shape))
    assert advice in str(refused.value) and str(shape) in str(refused.value)


def test_a_fixed_size_backbone_names_the_size_it_was_built_for():
    from canonical_network.prediction.cnn import CNN

    with pytest.raises(ValueError, match=r"CNN was built for 28×28 images \(prediction.image_size=28\); got 32×32"):
        CNN()(torch.rand(2, 1, 32, 32))
    assert CNN()(torch.rand(2, 1, 28, 28)).shape == (2, 10)  # the control


# --- unknown keys --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "message"), [
    (["+seeds=3"], "seeds: no such top-level key; nothing would read it. Did you mean: seed"),
    (["+trainer.max_epoch=5"], "Trainer takes no max_epoch (a key mistyped"),
    (["+data.batchsize=8"], "Did you mean: data.batch_size?"),
    (["+callbacks.early_stopping.patiense=3"], "Did you mean: callbacks.early_stopping.patience?"),
])
def test_an_added_key_nothing_reads_is_refused_with_the_closest_names(overrides, message):
    with pytest.raises(ConfigError) as refused:
        validate_run_config(compose_config(["experiment=rotmnist/cn_p4", *overrides]))
    assert message in str(refused.value)


def test_keys_a_component_takes_may_be_added():
    validate_run_config(compose_config(["experiment=rotmnist/cn_p4", "+trainer.limit_train_batches=2",
                                        "+data.pin_memory=false"]))


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.max_epoch=5", "trainer.max_epoch is not a key of the composed config. Did you mean: trainer.max_epochs"),
    ("sed=5", "sed is not a key of the composed config. Did you mean: seed"),
    ("canonicalization.num_rotation=8", "Did you mean: canonicalization.num_rotations"),
    ("prediction=resnet19", "prediction=resnet19 does not exist (no prediction/resnet19.yaml). Did you mean: "
                            "prediction=resnet18"),
])
def test_a_mistyped_override_gets_the_closest_names_in_one_line(capsys, override, message):
    line = _refusal(capsys, lambda: check_override_keys(["experiment=rotmnist/cn_p4", override]))
    assert line.startswith("canonical_network.train: error: ") and message in line, line


def test_good_overrides_and_multiruns_pass_the_key_check(capsys):
    check_override_keys(["experiment=rotmnist/cn_p4", "trainer.max_epochs=2", "canonicalization.num_rotations=8"])
    check_override_keys(["-m", "experiment=rotmnist/cn_p4", "seed=0,1"])  # sweeps are Hydra's to expand
    assert capsys.readouterr().err == ""


# --- data files and output folders ---------------------------------------------------------------------------


def test_a_corrupt_data_file_is_one_line_and_a_failed_record(tmp_path):
    from canonical_network.data.nbody import NBodyDataModule

    data = tmp_path / "nbody"
    tiny = {"num_train": 8, "num_valid": 4, "num_test": 4}
    NBodyDataModule(data_dir=str(data), **tiny).prepare_data()
    victim = sorted(data.glob("loc_test_*.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:100])  # cut short
    result = subprocess.run([sys.executable, "-m", "canonical_network.train", "experiment=nbody/gnn",
                             f"data.data_dir={data}", *(f"data.{k}={v}" for k, v in tiny.items()), "logger=csv",
                             "trainer.max_epochs=1", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("canonical_network.train: error: N-body data") and victim.name in last
    assert "Traceback" not in result.stderr
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "failed" and victim.name in record["error"]


@pytest.mark.parametrize("where", ["under_a_file", "read_only"])
def test_an_unwritable_output_folder_is_refused_before_anything_runs(capsys, tmp_path, where):
    (tmp_path / "a_file").write_text("")
    folder = tmp_path / "a_file" / "run" if where == "under_a_file" else Path("/proc/1/cn_run")
    line = _refusal(capsys, lambda: check_output_writable([f"hydra.run.dir={folder}"], "canonical_network.evaluate"))
    assert line.startswith(f"canonical_network.evaluate: error: hydra.run.dir={folder}: cannot write there")
    check_output_writable([f"hydra.run.dir={tmp_path / 'new' / 'run'}"], "x")  # the control: a folder to create


# --- a claims file --------------------------------------------------------------------------------------------


def test_a_claims_file_naming_an_experiment_that_does_not_exist_is_refused(tmp_path):
    from canonical_network.report import load_claims

    table = {"title": "mine", "metric": "test/error", "columns": [{"name": "Error %"}],
             "rows": [{"name": "mine", "experiment": "rotmnist/cn_p5"}]}
    path = tmp_path / "claims.yaml"
    path.write_text(json.dumps({"tables": {"mine": table}, "claims": []}))
    with pytest.raises(ValueError, match=r"experiment='rotmnist/cn_p5' does not exist .* Did you mean: rotmnist/cn_p4"):
        load_claims(path, experiments={"nbody/mine"})
    assert load_claims(path, experiments={"rotmnist/cn_p5"})[1] == {"mine": table}  # a user's own, with runs
    table["rows"][0]["experiment"] = "rotmnist/cn_p4"
    path.write_text(json.dumps({"tables": {"mine": table}, "claims": []}))
    assert load_claims(path, experiments=set())[1] == {"mine": table}
