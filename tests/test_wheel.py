"""The package outside its checkout: a wheel carries the configs and the package data, and an installed
``cn-train`` composes from the configs inside the package and writes ``./outputs`` in the directory it runs in.
A user's own configs join through Hydra's search path (docs/configs.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from canonical_network.utils import config
from canonical_network.utils.config import CHECKOUT_ROOT

REPO = Path(__file__).resolve().parents[1]
#: what a wheel is built from (pyproject.toml names the rest: README.md as the long description)
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "canonical_network", "hydra_plugins", "configs",
           "data/README.md")
#: data a user-written experiment file adds through ``hydra.searchpath``
USER_EXPERIMENT = """\
# @package _global_
defaults:
  - override /data: rotated_mnist_5k
  - override /prediction: cnn
experiment_name: mine/tiny
data:
  batch_size: 16
"""
#: the smallest real run: one epoch of two batches on the CPU (configs/debug/fast.yaml)
TINY = ["debug=fast", "trainer.accelerator=cpu"]


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process that must not see the checkout: no PYTHONPATH, no active venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built (offline, with the current environment's setuptools) from a copy of the checkout, so
    that the build writes nothing (build/, egg-info) into the checkout. The copy holds a site config in
    configs/local/, which is one machine's and must stay out of the wheel."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    local = source / "configs" / "local"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir()
    (local / "default.yaml").write_text("site_secret: 1\n")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(root / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300, env=_clean_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = (root / "dist").glob("canonical_network-*.whl")
    return built


def test_the_wheel_carries_the_configs_and_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.yaml")}
    configs = {c for c in configs if not c.startswith("local/")}
    assert {"train.yaml", "evaluate.yaml", "diagnose.yaml", "experiment/rotmnist/cnn.yaml"} <= configs
    missing = sorted(c for c in configs if f"canonical_network/configs/{c}" not in names)
    assert not missing, f"configs missing from the wheel: {missing}"
    assert not [n for n in names if n.startswith("canonical_network/configs/local/")], "a site config was shipped"
    # every module and every data file of the package (pyproject.toml's package-data: *.json, *.yaml, *.npz)
    package = [p for folder in ("canonical_network", "hydra_plugins") for p in (REPO / folder).rglob("*")
               if p.is_file() and p.suffix in (".py", ".json", ".yaml", ".npz") and "__pycache__" not in p.parts]
    missing = sorted(p.relative_to(REPO).as_posix() for p in package if p.relative_to(REPO).as_posix() not in names)
    assert not missing, f"package files missing from the wheel: {missing}"
    for data in ("paper_results.json", "paper_claims.yaml", "paper_inference.json"):
        assert f"canonical_network/{data}" in names
    # the datasets' manual route, which the data modules' errors name (a wheel has no data/ of its own)
    shipped = zipfile.ZipFile(wheel).read("canonical_network/data/README.md").decode()
    assert shipped == (REPO / "data" / "README.md").read_text()
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for command in ("cn-train", "cn-evaluate", "cn-diagnose", "cn-download"):
        assert f"{command} = " in scripts
    # the licence the metadata states travels with it
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert "License-Expression: MIT" in zipfile.ZipFile(wheel).read(metadata).decode()
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], "no LICENSE in the wheel"


def test_in_the_checkout_the_configs_and_outputs_are_the_checkouts():
    """A checkout (or an editable install of one) composes from its own configs/, so editing them takes effect,
    and keeps data/ and outputs/ in it whatever the working directory."""
    assert CHECKOUT_ROOT == REPO
    assert config.CONFIG_DIR == REPO / "configs" and config.PROJECT_ROOT == REPO
    assert config.compose_experiment(["experiment=rotmnist/cnn"]).paths.data_dir == str(REPO / "data")
    from canonical_network.data.sources import data_readme

    assert data_readme() == "data/README.md" and (REPO / data_readme()).is_file()  # what the data errors name


def test_a_folder_is_a_checkout_only_with_its_configs_beside_its_pyproject(tmp_path):
    assert config._checkout_root(tmp_path) is None  # site-packages
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "train.yaml").write_text("{}\n")
    assert config._checkout_root(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text("")
    assert config._checkout_root(tmp_path) == tmp_path


# Run inside the unpacked wheel, from an empty folder holding only a user's my_configs/.
INSTALLED_LOOKUP = """
import json, sys
import canonical_network
from canonical_network.utils import config as c
folders, complete = c.search_dirs(["hydra.searchpath=[file://my_configs]"])
cfg = c.compose_experiment(["experiment=rotmnist/cnn"])
mine = c.compose_experiment(["hydra.searchpath=[file://my_configs]", "experiment=mine/tiny"])
try:
    c.check_experiment_names(["hydra.searchpath=[file://my_configs]", "experiment=mine/tinny"])
    typo = None
except SystemExit as exit:
    typo = str(exit)
c.check_experiment_names(["hydra.searchpath=[file://my_configs]", "experiment=mine/tiny"])
from canonical_network.data.sources import data_readme
print(json.dumps({
    "data_readme": data_readme(),
    "package": canonical_network.__file__, "checkout": c.CHECKOUT_ROOT and str(c.CHECKOUT_ROOT),
    "config_dir": str(c.CONFIG_DIR), "project_root": str(c.PROJECT_ROOT),
    "data_dir": cfg.paths.data_dir, "log_dir": cfg.paths.log_dir,
    "experiments": c.known_experiments(folders), "complete": complete,
    "mine": [mine.experiment_name, mine.data.batch_size], "typo": typo,
}))
"""


def test_an_installed_package_composes_its_own_configs_and_writes_into_the_working_directory(wheel, tmp_path):
    """The wheel unpacked (what pip installs into site-packages) and imported from an empty folder: configs come
    from inside the package, data/ and outputs/ are the working directory's, and a user's experiment joins
    through ``hydra.searchpath`` (its typo still gets the close-match message)."""
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    (work / "my_configs" / "experiment" / "mine").mkdir(parents=True)
    (work / "my_configs" / "experiment" / "mine" / "tiny.yaml").write_text(USER_EXPERIMENT)
    # PYTHONPATH comes before the environment's site-packages (and the checkout's editable-install finder)
    done = subprocess.run([sys.executable, "-c", INSTALLED_LOOKUP], cwd=work, capture_output=True, text=True,
                          timeout=120, env=_clean_env(PYTHONPATH=str(site)))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["package"] == str(site / "canonical_network" / "__init__.py")
    assert seen["checkout"] is None
    assert seen["config_dir"] == str(site / "canonical_network" / "configs")
    assert seen["project_root"] == str(work.resolve())
    assert seen["data_dir"] == str(work.resolve() / "data") and seen["log_dir"] == str(work.resolve() / "outputs")
    assert "rotmnist/cnn" in seen["experiments"] and "mine/tiny" in seen["experiments"] and seen["complete"]
    assert seen["mine"] == ["mine/tiny", 16]
    assert seen["data_readme"] == str(site / "canonical_network" / "data" / "README.md")  # a file it has
    assert "experiment=mine/tinny does not exist" in seen["typo"] and "Did you mean: mine/tiny?" in seen["typo"]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A new virtual environment holding the wheel (pip install --no-deps, offline) whose dependencies are the
    current environment's: a .pth file names its site-packages. Paths a .pth file adds are not site folders, so
    the checkout's editable install (itself a .pth there) stays out. Returns the environment's bin/."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_dir = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True, env=_clean_env()).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site_dir) / "canonical_network_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    # the current environment's pip, run by the new interpreter, installs into the new environment
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=300, env=_clean_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return venv / "bin"


def test_cn_train_from_the_wheel_runs_in_an_empty_directory(installed, tmp_path):
    """The issue's acceptance command (issue 35 item 5), shrunk to two batches: from an empty directory, with only
    the wheel installed, it trains, tests and writes ./outputs/runs/.../results.json there; a user's experiment
    in ./my_configs composes through hydra.searchpath."""
    work = tmp_path / "empty"
    work.mkdir()
    env = _clean_env(PATH=f"{installed}{os.pathsep}{os.environ.get('PATH', '')}")
    probe = subprocess.run([str(installed / "python"), "-c", "import canonical_network, json, sys; "
                            "print(json.dumps([canonical_network.__file__, sys.path]))"],
                           cwd=work, capture_output=True, text=True, timeout=120, env=env)
    assert probe.returncode == 0, probe.stderr[-3000:]
    package, path = json.loads(probe.stdout)
    assert Path(package).is_relative_to(installed.parent) and not Path(package).is_relative_to(REPO), package
    assert str(REPO) not in path  # the checkout is not importable there (its .venv's site-packages are)

    command = ["cn-train", "experiment=rotmnist/cnn", "trainer.max_epochs=1", "logger=csv", *TINY]
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (results,) = (work / "outputs" / "runs").glob("*/*/results.json")
    record = json.loads(results.read_text())
    assert record["experiment"] == "rotmnist/cnn" and "test/error" in record["metrics"]
    assert record["run_dir"] == results.parent.relative_to(work).as_posix()  # relative to the working directory
    assert record["code_version"]["commit"] is None and record["code_version"]["package"]
    assert (results.parent / "csv" / "metrics.csv").is_file()
    assert (results.parent / "checkpoints").is_dir()
    assert sorted(p.name for p in work.iterdir()) == ["outputs"]  # the embedded data needs no ./data

    (work / "my_configs" / "experiment" / "mine").mkdir(parents=True)
    (work / "my_configs" / "experiment" / "mine" / "tiny.yaml").write_text(USER_EXPERIMENT)
    shown = subprocess.run(["cn-train", "hydra.searchpath=[file://my_configs]", "experiment=mine/tiny", "--cfg",
                            "job", "--resolve"], cwd=work, capture_output=True, text=True, timeout=120,
                           env=env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "experiment_name: mine/tiny" in shown.stdout and "batch_size: 16" in shown.stdout
    assert f"data_dir: {work.resolve() / 'data'}" in shown.stdout
