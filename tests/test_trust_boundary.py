"""The trust boundary (``canonical_network/utils/trust.py``): nothing read from a file or a record runs code.

Each route by which a file or a record reaches Hydra or ``hydra.utils.instantiate`` gets a payload that would
create a marker file if it ran -- ``builtins.open(<marker>, "w")``, which hydra-core's own blocklist lets
through -- and a control showing the payload is real. Every route must refuse, name the file and the key, and
leave no marker. The first tests list every place in the package and its scripts that turns a name into code,
so that a new one that goes around the boundary fails here.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from canonical_network.utils.checkpoints import RUN_CONFIG_KEY
from canonical_network.utils.checks import ConfigError
from canonical_network.utils.config import PROJECT_ROOT
from canonical_network.utils.trust import (
    UntrustedConfig,
    build,
    check_buildable,
    granted,
    locate,
    plain_config,
    record_overrides,
)
from tests.helpers import compose_config, shrink

SOURCES = sorted([*PROJECT_ROOT.glob("canonical_network/**/*.py"), *PROJECT_ROOT.glob("scripts/*.py"),
                  *PROJECT_ROOT.glob("hydra_plugins/**/*.py")])

#: Names that turn a string into code: Hydra's builders and locators, importers, exec/eval, pickle.
CODE_NAMES = {"instantiate", "call", "get_class", "get_method", "get_object", "_locate"}
CODE_CALLS = {"importlib.import_module", "import_module", "__import__", "exec", "eval", "compile",
              "importlib.util.spec_from_file_location", "spec_from_file_location", "pickle.load", "pickle.loads",
              "runpy.run_path", "runpy.run_module"}
#: Every site allowed to do so, (file, function) -> why what it runs is never chosen by a file.
ALLOWED = {
    ("canonical_network/utils/trust.py", "build"): "the boundary: check_buildable first",
    ("canonical_network/utils/trust.py", "locate"): "the boundary: the target checked first",
    ("canonical_network/__init__.py", "__getattr__"): "imports a module of the constant _EXPORTS table",
    ("canonical_network/data/sources.py", "loader_class"): "imports the loader of the constant data catalogue",
    ("scripts/benchmark_nbody_generator.py", "_reference_loop"): "the EGNN reference the user names (--reference)",
    ("scripts/benchmark_symmetrization.py", "_pointcloud_benchmark"): "its sibling script, by a fixed path",
}


class _CodeSites(ast.NodeVisitor):
    """Collects, per outermost function of one file, each use of a name that turns a string into code."""

    def __init__(self, file: str, found: dict[tuple[str, str], list[str]]) -> None:
        self.file, self.found, self.stack = file, found, []

    def note(self, what: str) -> None:
        self.found.setdefault((self.file, self.stack[0] if self.stack else "<module>"), []).append(what)

    def visit_FunctionDef(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, node):
        if (node.module or "").startswith("hydra"):
            for alias in node.names:
                if alias.name in CODE_NAMES:
                    self.note(f"from {node.module} import {alias.name}")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        text = ast.unparse(node)
        if text.startswith("hydra.") and node.attr in CODE_NAMES:
            self.note(text)
        self.generic_visit(node)

    def visit_Call(self, node):
        text = ast.unparse(node.func)
        if text in CODE_CALLS or text.endswith(".exec_module"):
            self.note(text)
        self.generic_visit(node)


def _code_sites() -> dict[tuple[str, str], list[str]]:
    """(file, outermost function) -> what it uses, for every use of :data:`CODE_NAMES` from Hydra (imported or
    as ``hydra.utils.<name>``), every call of :data:`CODE_CALLS` and every ``.exec_module(...)``."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in SOURCES:
        _CodeSites(path.relative_to(PROJECT_ROOT).as_posix(), found).visit(ast.parse(path.read_text(), str(path)))
    return found


def test_every_site_that_turns_a_name_into_code_is_the_boundary_or_listed():
    sites = _code_sites()
    assert set(sites) == set(ALLOWED), (
        f"new: {sorted(set(sites) - set(ALLOWED))} ({[sites[k] for k in sorted(set(sites) - set(ALLOWED))]}); "
        f"gone: {sorted(set(ALLOWED) - set(sites))}. Build configs with canonical_network.utils.trust.build and "
        "import a configured name with trust.locate")
    assert sites[("canonical_network/utils/trust.py", "build")] == ["hydra.utils.instantiate"]


def test_the_site_list_finds_a_call_that_goes_around(tmp_path, monkeypatch):
    """The control: a module that instantiates directly is found."""
    bypass = PROJECT_ROOT / "scripts" / "_bypass_probe.py"
    monkeypatch.setattr(sys.modules[__name__], "SOURCES", [*SOURCES, bypass])
    bypass.write_text("import hydra\n\ndef load(cfg):\n    return hydra.utils.instantiate(cfg)\n")
    try:
        assert ("scripts/_bypass_probe.py", "load") in _code_sites()
    finally:
        bypass.unlink()


def test_the_fixed_imports_import_only_the_package():
    import canonical_network
    from canonical_network.data import sources

    assert all(m.startswith("canonical_network.") for m in canonical_network._EXPORTS.values())
    loaders = [v for v in vars(sources).values() if isinstance(v, sources.DatasetSource)]
    assert loaders and all(s.loader.startswith("canonical_network.") for s in loaders)


def test_every_torch_load_is_weights_only_and_no_numpy_load_unpickles():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            text = ast.unparse(node.func)
            keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if text == "torch.load":
                assert keywords.get("weights_only") == "True", f"{path}:{node.lineno}"
            if text in ("np.load", "numpy.load"):
                assert keywords.get("allow_pickle", "False") == "False", f"{path}:{node.lineno}"


# --- the payload -------------------------------------------------------------------------------------------


def opener(marker: Path) -> dict:
    """A config node whose building creates ``marker`` (hydra-core 1.3's blocklist lets ``builtins.open`` by)."""
    return {"_target_": "builtins.open", "file": str(marker), "mode": "w"}


def test_the_payload_runs_when_built_without_the_boundary(tmp_path):
    import hydra

    marker = tmp_path / "marker"
    hydra.utils.instantiate(opener(marker)).close()
    assert marker.exists()


def test_build_refuses_the_payload_anywhere_in_the_node(tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(UntrustedConfig, match=r"refused _target_='builtins\.open'"):
        build(opener(marker), "probe")
    with pytest.raises(UntrustedConfig, match=r"refused callbacks\[1\]\.x\._target_='builtins\.open'"):
        check_buildable({"callbacks": [{}, {"x": opener(marker)}]}, "probe")
    hidden = {"a": "${oc.create:{_target_: builtins.open, file: '" + str(marker) + "', mode: w}}"}
    with pytest.raises(UntrustedConfig, match=r"refused a\._target_='builtins\.open'"):
        build(hidden, "probe")
    assert not marker.exists()


def test_instantiate_keys_only_on_a_node_that_builds_a_component(tmp_path):
    adam = {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.1}
    assert check_buildable({"optimizer": adam}, "probe") is None  # as configs/model/*.yaml give it
    with pytest.raises(UntrustedConfig, match=r"refused optimizer\._args_=.*a node that builds nothing"):
        check_buildable({"optimizer": {"_args_": [[1.0]]}}, "probe")
    with pytest.raises(UntrustedConfig, match=r"refused _target_='builtins\.open'"):
        check_buildable({"_target_": "builtins.open", "_partial_": True}, "probe")


def test_locate_refuses_before_it_imports(tmp_path, monkeypatch):
    """Importing the module a target names runs it: locate checks first. The control imports it."""
    marker = tmp_path / "marker"
    (tmp_path / "probe_module.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass X: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UntrustedConfig, match="probe_module.X"):
        locate("probe_module.X", "probe")
    assert not marker.exists()
    with granted(["probe_module.X"]):  # what the user names is imported
        assert locate("probe_module.X", "probe").__name__ == "X"
    assert marker.exists()
    sys.modules.pop("probe_module", None)


def test_a_grant_ends_with_its_block():
    with granted(["my_package.MyResNet"]):
        check_buildable({"_target_": "my_package.MyResNet"}, "probe")
    with pytest.raises(UntrustedConfig):
        check_buildable({"_target_": "my_package.MyResNet"}, "probe")


@pytest.mark.parametrize(("config", "key", "why"), [
    ({"defaults": ["/experiment/../../../tmp/evil"]}, "defaults", "Hydra gives 'defaults' meaning"),
    ({"data": {"defaults": [{"x": "y"}]}}, "data.defaults", "Hydra gives 'defaults' meaning"),
    ({"hydra": {"searchpath": ["file:///tmp"]}}, "hydra", "Hydra gives 'hydra' meaning"),
    ({"seed": "${oc.env:HOME}"}, "seed", "an interpolation"),
    ({"model": {"_target_": "builtins.open"}}, "model._target_", "only build the components"),
    ({"model": {"_partial_": True}}, "model._partial_", "a node that builds nothing"),
    ({"model": {"_args_": ["/tmp/x"], "x": 1}}, "model._args_", "a node that builds nothing"),
    ({"model": {"_convert_": "all", "x": 1}}, "model._convert_", "a node that builds nothing"),
    ({"model": {"_weird_": 1}}, "model._weird_", "Hydra and OmegaConf keep for themselves"),
    ({"seed": torch.tensor(1.0)}, "seed", "plain values only"),
    ({1: "a"}, "1", "config keys are strings"),
])
def test_plain_config_refuses_what_is_not_plain_data(config, key, why):
    with pytest.raises(UntrustedConfig) as refused:
        plain_config(config, "sent.ckpt")
    message = str(refused.value)
    assert message.startswith(f"sent.ckpt: refused {key}=") and why in message, message


def test_plain_config_takes_a_run_config_as_train_stores_it(tmp_path):
    cfg = shrink(compose_config(["experiment=rotmnist/cn_p4"], tmp_path))
    stored = OmegaConf.to_container(cfg, resolve=True)
    assert plain_config(stored, "run.ckpt") == stored


# --- the routes ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished one-epoch CN(p4) run folder on the embedded digits: real files to tamper with."""
    from canonical_network.train import run

    out = tmp_path_factory.mktemp("trained")
    run(shrink(compose_config(["experiment=rotmnist/cn_p4"], out)))
    return out


def _evil_yaml(folder: Path, marker: Path) -> Path:
    """A YAML file elsewhere on disk that adds a callback which creates ``marker``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "evil.yaml"
    path.write_text("# @package _global_\n" + OmegaConf.to_yaml({"callbacks": {"evil": opener(marker)}}))
    return path


def _with_stored(trained: Path, path: Path, edit) -> Path:
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    edit(state[RUN_CONFIG_KEY]["config"])
    torch.save(state, path)
    return path


def _evaluate(ckpt: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "canonical_network.evaluate", f"ckpt_path={ckpt}", "logger=none",
                           f"hydra.run.dir={out}", *extra], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=300)


def test_a_defaults_list_in_a_stored_config_composed_the_payload_before(trained, tmp_path):
    """The control: registered as it is, a stored ``defaults`` list makes Hydra compose a file outside configs/,
    whose callback evaluate would then build."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from canonical_network.evaluate import register_run_config
    from canonical_network.utils.config import CONFIG_DIR

    evil = _evil_yaml(tmp_path / "elsewhere", tmp_path / "marker")
    stored = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)[RUN_CONFIG_KEY]["config"]
    relative = Path("..") / Path(*[".."] * len(CONFIG_DIR.parts)) / evil.with_suffix("").relative_to("/")
    register_run_config({**stored, "defaults": [f"/{relative.as_posix()}", "_self_"]})
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[f"ckpt_path={trained}/checkpoints/last.ckpt"])
    assert cfg.callbacks.evil.file == str(tmp_path / "marker")


def test_a_stored_defaults_list_is_refused_naming_the_file_and_the_key(trained, tmp_path):
    from canonical_network.utils.config import CONFIG_DIR

    marker = tmp_path / "marker"
    evil = _evil_yaml(tmp_path / "elsewhere", marker)
    relative = Path("..") / Path(*[".."] * len(CONFIG_DIR.parts)) / evil.with_suffix("").relative_to("/")
    for name, edit in [
        ("defaults", lambda c: c.update(defaults=[f"/{relative.as_posix()}", "_self_"])),
        ("hydra", lambda c: c.update(hydra={"searchpath": [f"file://{evil.parent}"]})),
        ("callbacks.evil._target_", lambda c: c.update(callbacks={"evil": opener(marker)})),
        ("data.augment._target_", lambda c: c["data"].update(augment=opener(marker))),
    ]:
        ckpt = _with_stored(trained, tmp_path / f"{name}.ckpt", edit)
        result = _evaluate(ckpt, tmp_path / f"eval_{name}")
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"{ckpt}: refused {name}=" in result.stderr, result.stderr[-2000:]
        assert not marker.exists() and not (tmp_path / f"eval_{name}").exists()


def test_the_composed_evaluation_is_checked_whatever_composing_added(trained, tmp_path):
    """Defence in depth: a node that reaches the composed config by any route (here a user's override naming a
    file's option would; simulated by editing the composed config) is refused before anything is built."""
    from omegaconf import open_dict

    from canonical_network.evaluate import compose_evaluation, evaluate

    marker = tmp_path / "marker"
    cfg = compose_evaluation(trained / "checkpoints" / "last.ckpt", ["logger=none"], tmp_path / "eval")
    with open_dict(cfg):
        cfg.callbacks = {"evil": opener(marker)}
    with pytest.raises(ConfigError, match=r"refused callbacks\.evil\._target_='builtins\.open'"):
        evaluate(cfg)
    assert not marker.exists() and not (tmp_path / "eval").exists()


def test_the_trust_a_checkpoint_carries_is_not_taken(trained, tmp_path):
    marker = tmp_path / "marker"
    ckpt = _with_stored(trained, tmp_path / "trusting.ckpt", lambda c: c.update(
        trusted_targets=["builtins.open"], callbacks={"evil": opener(marker)}))
    result = _evaluate(ckpt, tmp_path / "eval")
    assert result.returncode == 2 and "refused callbacks.evil._target_='builtins.open'" in result.stderr
    assert not marker.exists()


def test_a_run_folders_hydra_files_are_never_built_from(trained, tmp_path):
    """scripts/plot_canonicalized.py used to check the model node of .hydra/config.yaml and build its data node
    unchecked; it now rebuilds the run from its checkpoint, and the folder's .hydra/ is a record only."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    marker = tmp_path / "marker"
    (run_dir / ".hydra").mkdir(exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml({"model": {}, "data": opener(marker)}))
    result = subprocess.run([sys.executable, "scripts/plot_canonicalized.py", "--runs", f"p4={run_dir}",
                             "--num-images", "4", "--out", str(tmp_path / "fig.png")],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "fig.png").is_file() and not marker.exists()


def test_a_pretrained_canonicalizer_is_never_built_from_a_run_folders_hydra_files(trained, tmp_path):
    from canonical_network.canonicalization.pretrained import from_checkpoint

    marker = tmp_path / "marker"
    folder = tmp_path / "old" / "checkpoints"
    folder.mkdir(parents=True)
    state = torch.load(trained / "checkpoints" / "last.ckpt", weights_only=True)
    del state[RUN_CONFIG_KEY]  # a checkpoint without its run config, beside a .hydra/config.yaml
    torch.save(state, folder / "last.ckpt")
    (tmp_path / "old" / ".hydra").mkdir()
    (tmp_path / "old" / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml({"canonicalization": opener(marker)}))
    with pytest.raises(ValueError, match="carries no run config"):
        from_checkpoint(str(folder / "last.ckpt"))
    assert not marker.exists()


def test_a_checkpoints_data_folder_is_read_never_written(trained, tmp_path):
    from canonical_network.evaluate import data_for_this_machine

    data = data_for_this_machine({"data_dir": "/elsewhere/nbody", "generate_if_missing": True, "download": True,
                                  "root": "/them/data/x"}, {"data_dir": "/them/data"})
    assert data == {"data_dir": "/elsewhere/nbody", "generate_if_missing": False, "download": False,
                    "root": "${paths.data_dir}/x"}


# --- a record's overrides ------------------------------------------------------------------------------------


def test_a_records_group_choice_outside_configs_composed_the_payload_before(tmp_path):
    """The control: Hydra composes a group option that is a path out of configs/."""
    from canonical_network.utils.config import CONFIG_DIR, compose_experiment

    evil = _evil_yaml(tmp_path / "elsewhere", tmp_path / "marker")
    relative = Path(*[".."] * (len(CONFIG_DIR.parts) + 1)) / evil.with_suffix("").relative_to("/")
    cfg = compose_experiment([f"experiment={relative.as_posix()}"])
    assert cfg.callbacks.evil.file == str(tmp_path / "marker")


@pytest.mark.parametrize(("override", "why"), [
    ("experiment=../../../../tmp/evil", "chooses one of its group's files"),
    ("canonicalization=../experiment/x", "chooses one of its group's files"),
    ("hydra.searchpath=[file:///tmp]", "the user's to set"),
    ("--config-dir=/tmp", "a command-line flag"),
    ("-cd=/tmp", "a command-line flag"),
    ("+callbacks.evil._target_=builtins.open", "may not choose what is built"),
    ("model.optimizer._partial_=true", "may not choose what is built"),
    ("+defaults=[x]", "may not choose what is built"),
    ("trusted_targets=[builtins.open]", "the user's to set"),
    ("data.data_dir=${oc.env:HOME}", "an interpolation"),
    ("seed=0,1,2", "holds no sweep"),
    ("data@evil=rotated_mnist", "not a dotted name"),
])
def test_record_overrides_refuse_what_a_record_may_not_replay(override, why):
    with pytest.raises(UntrustedConfig) as refused:
        record_overrides(["experiment=rotmnist/cn_p4", override], "run/results.json")
    assert str(refused.value).startswith(f"run/results.json: refused overrides={override!r}") and why in str(
        refused.value), str(refused.value)


def test_record_overrides_take_a_protocols_own():
    overrides = ["experiment=rotmnist/cn_p4", "seed=3", "trainer.max_epochs=100", "callbacks.early_stopping=null",
                 "canonicalization.num_rotations=8", "++data.scale_jitter=0.65", "~callbacks.rich_progress_bar",
                 "data=rotated_mnist_5k", "logger=csv"]
    assert record_overrides(overrides, "r") == overrides


def test_diagnose_runs_refuses_a_record_whose_overrides_would_run_the_payload(tmp_path, monkeypatch):
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import diagnose_runs

    marker = tmp_path / "marker"
    evil = _evil_yaml(tmp_path / "elsewhere", marker)
    run = tmp_path / "runs" / "rotmnist" / "cn_p4" / "seed0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "epoch_001.ckpt").write_bytes(b"")
    calls = []
    monkeypatch.setattr(diagnose_runs.subprocess, "call", lambda command, **_: calls.append(command) or 0)
    for overrides in (["experiment=../../../../../../../../.." + str(evil.with_suffix(""))],
                      ["experiment=rotmnist/cn_p4", f"--config-dir={evil.parent}"],
                      ["experiment=rotmnist/cn_p4", "+model.evil._target_=builtins.open"]):
        (run / "results.json").write_text(json.dumps({
            "experiment": "rotmnist/cn_p4", "status": "completed", "seed": 0, "metrics": {"test/error": 1.0},
            "checkpoint": "checkpoints/epoch_001.ckpt", "overrides": overrides}))
        out = subprocess.run([sys.executable, "scripts/diagnose_runs.py", str(tmp_path / "runs")], cwd=PROJECT_ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 1 and f"FAILED {run}: {run / 'results.json'}: refused overrides=" in out.stdout, \
            out.stdout + out.stderr
        assert not (run / "diagnose").exists()
    assert not marker.exists() and calls == []


def test_diagnose_runs_refuses_a_checkpoint_outside_its_run(tmp_path):
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    from diagnose_runs import diagnose_command

    run = tmp_path / "run"
    run.mkdir()
    record = {"seed": 0, "overrides": ["experiment=rotmnist/cn_p4"], "checkpoint": str(tmp_path / "other.ckpt")}
    with pytest.raises(UntrustedConfig, match="resolves outside the run folder"):
        diagnose_command(run, record, 8)
    with pytest.raises(UntrustedConfig, match="refused seed='0 hydra.searchpath"):
        diagnose_command(run, {**record, "seed": "0 hydra.searchpath=[file:///tmp]"}, 8)


# --- the working directory of ``python -m`` --------------------------------------------------------------------


def _planted(folder: Path, marker: Path) -> Path:
    """A folder holding a Hydra plugin and a module named like a dependency, each creating ``marker``."""
    (folder / "hydra_plugins").mkdir(parents=True)
    (folder / "hydra_plugins" / "planted_plugin.py").write_text(f"open({str(marker) + '.plugin'!r}, 'w').close()\n")
    (folder / "omegaconf.py").write_text(f"open({str(marker) + '.module'!r}, 'w').close()\n")
    return folder


def test_the_planted_files_run_from_a_working_directory_on_the_path(tmp_path):
    """The control: a plain ``python -c`` there imports the planted module; Hydra's plugin scan the plugin."""
    marker = tmp_path / "marker"
    folder = _planted(tmp_path / "cwd", marker)
    subprocess.run([sys.executable, "-c", "import omegaconf; from hydra.core.plugins import Plugins; "
                    "Plugins.instance()"], cwd=folder, check=False, capture_output=True, timeout=120)
    assert Path(str(marker) + ".module").exists()


def test_python_dash_m_runs_nothing_from_its_working_directory(tmp_path):
    marker = tmp_path / "marker"
    folder = _planted(tmp_path / "cwd", marker)
    result = subprocess.run(
        [sys.executable, "-m", "canonical_network.train", "experiment=rotmnist/cnn", "trainer.max_epochs=1",
         "+trainer.limit_train_batches=1", "+trainer.limit_val_batches=1", "+trainer.limit_test_batches=1",
         "logger=csv", f"hydra.run.dir={tmp_path / 'run'}", "hydra/launcher=local"],
        cwd=folder, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "results.json").is_file()
    assert not Path(str(marker) + ".plugin").exists() and not Path(str(marker) + ".module").exists()


# --- a finished run folder is never written again ---------------------------------------------------------


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_diagnose_refuses_a_finished_run_folder_and_leaves_it_as_it_was(trained, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / ".hydra").mkdir(exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text("the training run's record\n")
    before = _files(run_dir)
    result = subprocess.run(
        [sys.executable, "-m", "canonical_network.diagnose", "experiment=rotmnist/cn_p4", "logger=none",
         f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={run_dir}", "diagnose.num_samples=4"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"hydra.run.dir={run_dir} already holds results.json, checkpoints, .hydra" in result.stderr
    assert _files(run_dir) == before


@pytest.mark.parametrize("target", ["builtins.open", "shutil.copyfile", "os.symlink", "torch.save", "numpy.save",
                                    "os.system", "subprocess.run", "builtins.exec", "torch.load"])
def test_what_hydras_blocklist_lets_through_is_refused_on_every_route(target, tmp_path):
    """hydra-core 1.3's own blocklist stops os.system and subprocess, not these, each of which can write any file
    the user can; the boundary refuses them all, read from a file and at build time."""
    node = {"_target_": target, "_args_": [str(tmp_path / "marker")]}
    with pytest.raises(UntrustedConfig, match=rf"refused model\.predictor\._target_='{target}'"):
        plain_config({"model": {"predictor": node}}, "sent.ckpt")
    with pytest.raises(UntrustedConfig, match=rf"refused _target_='{target}'"):
        build(node, "probe")
    assert not (tmp_path / "marker").exists()
