"""Loading a file never runs code from it (issue 32 §1).

Each route by which the package reads a file that may have come from someone else gets a payload that,
if it ran, would write a marker file: a pickle whose unpickling calls ``Path.write_text`` (what
``torch.load(weights_only=False)`` runs), or a run config whose ``_target_`` calls ``torch.load`` of such a
pickle (what ``hydra.utils.instantiate`` of an unchecked config runs). Every route must refuse, name the
refused thing, and leave no marker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from canonical_network.records import record_path
from canonical_network.train import run
from canonical_network.utils.checkpoints import RUN_CONFIG_KEY, load_checkpoint, model_from_checkpoint
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import PROJECT_ROOT
from canonical_network.utils.trust import check_buildable as check_targets
from canonical_network.utils.trust import known_targets
from tests.helpers import compose_config, shrink


class Payload:
    """Unpickling it writes ``marker``: the code a malicious checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code from a file ran"))


def pickle_payload(path: Path, marker: Path, **extra) -> Path:
    """A checkpoint-looking file (``state_dict`` and all) with the payload inside."""
    torch.save({"state_dict": {}, "payload": Payload(marker), **extra}, path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished one-epoch rotmnist/cnn run (its folder): a real checkpoint to tamper with."""
    out = tmp_path_factory.mktemp("trained")
    cfg = shrink(compose_config(["experiment=rotmnist/cn_p4", "canonicalization.num_rotations=4"], out))
    (out / ".hydra").mkdir()
    OmegaConf.save(cfg, out / ".hydra" / "config.yaml")
    run(cfg)
    return out


def test_the_payload_runs_when_loaded_unsafely(tmp_path):
    """The control: the payload is real (it writes its marker under weights_only=False)."""
    marker = tmp_path / "marker"
    path = pickle_payload(tmp_path / "evil.ckpt", marker)
    torch.load(path, weights_only=False)
    assert marker.read_text() == "code from a file ran"


def test_known_targets_are_the_package_components():
    targets = known_targets()
    assert "canonical_network.prediction.cnn.CNN" in targets and "torch.optim.Adam" in targets
    assert not {"torch.load", "os.system", "builtins.exec", "subprocess.run"} & targets


def test_checkpoint_loader_refuses_a_pickle(tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(ValueError, match="evil.ckpt"):
        load_checkpoint(pickle_payload(tmp_path / "evil.ckpt", marker))
    assert not marker.exists()


def edited_checkpoint(trained: Path, path: Path, marker: Path, edit) -> Path:
    """The trained checkpoint, saved to ``path`` with its stored run config changed by ``edit(config, evil)``,
    ``evil`` a pickle whose loading writes ``marker``. It still passes the weights-only check."""
    evil = pickle_payload(path.with_name("second.pkl"), marker)
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    edit(state[RUN_CONFIG_KEY]["config"], evil)
    torch.save(state, path)
    torch.load(path, weights_only=True)
    return path


def tampered_checkpoint(trained: Path, tmp_path: Path, marker: Path) -> Path:
    """A stored run config whose predictor calls torch.load on a pickle."""
    def edit(config, evil):
        config["model"]["predictor"] = {"_target_": "torch.load", "f": str(evil), "weights_only": False}
    return edited_checkpoint(trained, tmp_path / "tampered.ckpt", marker, edit)


def hidden_target_checkpoint(trained: Path, tmp_path: Path, marker: Path) -> Path:
    """A stored run config that hides the same ``_target_`` inside an interpolation, under a symmetrization key
    (which an evaluation may change): ``${oc.create:...}`` only becomes a node with a ``_target_`` once resolved,
    which ``hydra.utils.instantiate`` does."""
    def edit(config, evil):
        hidden = "${oc.create:{_target_: torch.load, f: '" + str(evil) + "', weights_only: false}}"
        config["canonicalization"]["frame_weights"] = hidden
        config["model"]["canonicalizer"]["frame_weights"] = hidden
    return edited_checkpoint(trained, tmp_path / "hidden.ckpt", marker, edit)


def evaluate_command(path: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -m canonical_network.evaluate ckpt_path=<path>`` into ``<tmp_path>/eval``."""
    return subprocess.run(
        [sys.executable, "-m", "canonical_network.evaluate", f"ckpt_path={path}", "logger=none",
         f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )


def test_stored_config_is_not_built_from_python(trained, tmp_path):
    marker = tmp_path / "marker"
    path = tampered_checkpoint(trained, tmp_path, marker)
    with pytest.raises(ConfigError, match=r"model\.predictor\._target_='torch\.load'"):
        model_from_checkpoint(path)
    assert not marker.exists()


def test_stored_config_is_not_built_by_the_evaluate_command(trained, tmp_path):
    marker = tmp_path / "marker"
    result = evaluate_command(tampered_checkpoint(trained, tmp_path, marker), tmp_path)
    assert result.returncode != 0
    assert "model.predictor._target_='torch.load'" in result.stderr and "trusted_targets" in result.stderr
    assert not marker.exists()
    assert not (tmp_path / "eval").exists()


def test_a_target_hidden_in_an_interpolation_is_refused(trained, tmp_path):
    marker = tmp_path / "marker"
    path = hidden_target_checkpoint(trained, tmp_path, marker)
    with pytest.raises(ValueError, match=r"refused canonicalization\.frame_weights=.*an interpolation"):
        model_from_checkpoint(path)
    assert not marker.exists()
    result = evaluate_command(path, tmp_path)
    assert result.returncode == 2 and "refused canonicalization.frame_weights=" in result.stderr
    assert not marker.exists() and not (tmp_path / "eval").exists()


def test_check_targets_resolves_a_plain_tree_before_checking():
    """The second line of defence: a plain dict (as read from a file) is checked as instantiate sees it."""
    config = {"canonicalization": {"frame_weights": "${oc.create:{_target_: os.system, _args_: [true]}}"}}
    with pytest.raises(ConfigError, match=r"frame_weights\._target_='os\.system'"):
        check_targets(config, "run.ckpt")


def test_trusted_targets_let_your_own_component_through():
    config = {"model": {"_target_": "canonical_network.tasks.image_classification.ImageClassificationTask",
                        "predictor": {"_target_": "my_package.MyResNet"}}}
    with pytest.raises(ConfigError, match="my_package.MyResNet"):
        check_targets(config, "run.ckpt")
    check_targets(config, "run.ckpt", trusted=["my_package.MyResNet"])


def test_pretrained_canonicalizer_refuses_a_pickle(tmp_path):
    from canonical_network.canonicalization.pretrained import from_checkpoint

    marker = tmp_path / "marker"
    with pytest.raises(ValueError, match="canonicalization.checkpoint"):
        from_checkpoint(str(pickle_payload(tmp_path / "evil.ckpt", marker)))
    assert not marker.exists()


def test_pretrained_canonicalizer_refuses_a_foreign_target(trained, tmp_path):
    from canonical_network.canonicalization.pretrained import from_checkpoint

    marker = tmp_path / "marker"
    evil = pickle_payload(tmp_path / "second.pkl", marker)
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    state[RUN_CONFIG_KEY]["config"]["canonicalization"] = {"_target_": "torch.load", "f": str(evil),
                                                          "weights_only": False}
    torch.save(state, tmp_path / "tampered.ckpt")
    with pytest.raises(ConfigError, match=r"tampered\.ckpt: refused canonicalization\._target_='torch\.load'"):
        from_checkpoint(str(tmp_path / "tampered.ckpt"))
    assert not marker.exists()


def test_diagnose_refuses_a_pickle_as_pretrained_checkpoint(tmp_path):
    marker = tmp_path / "marker"
    evil = pickle_payload(tmp_path / "evil.ckpt", marker)
    result = subprocess.run(
        [sys.executable, "-m", "canonical_network.diagnose", "experiment=rotmnist/cn_pretrained",
         f"canonicalization.checkpoint={evil}", "logger=none", f"hydra.run.dir={tmp_path / 'diag'}"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "evil.ckpt" in result.stderr
    assert not marker.exists()


def test_rerun_refuses_a_best_path_planted_outside_the_run(trained, tmp_path):
    """A best_model_path stored in last.ckpt that points outside the run folder is never unpickled."""
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    marker = tmp_path / "marker"
    evil = pickle_payload(tmp_path / "planted.ckpt", marker)
    last = run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(last, weights_only=True)
    (key,) = [k for k in state["callbacks"] if k.startswith("ModelCheckpoint")]
    state["callbacks"][key]["best_model_path"] = str(evil)
    torch.save(state, last)
    (run_dir / "results.json").unlink()  # not a finished record any more: the rerun may test
    cfg = shrink(compose_config(["experiment=rotmnist/cn_p4", "canonicalization.num_rotations=4"], run_dir))
    with pytest.raises(Exception, match="planted.ckpt"):
        run(cfg)
    assert not marker.exists()


def test_copied_run_folder_tests_its_own_checkpoint(trained, tmp_path):
    """A rerun of a copied folder re-roots the stored best path into the copy (not the original's file)."""
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    (run_dir / "results.json").unlink()
    cfg = shrink(compose_config(["experiment=rotmnist/cn_p4", "canonicalization.num_rotations=4"], run_dir))
    results = run(cfg)
    assert record_path(results, "checkpoint").parent == run_dir / "checkpoints"


def test_plot_script_refuses_a_pickled_checkpoint(trained, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    marker = tmp_path / "marker"
    for old in (run_dir / "checkpoints").glob("epoch_*.ckpt"):
        pickle_payload(old, marker)
    result = subprocess.run(
        [sys.executable, "scripts/plot_canonicalized.py", "--runs", f"p4={run_dir}", "--out",
         str(tmp_path / "fig.png")],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0 and "epoch_" in result.stderr
    assert not marker.exists()
