"""data/catalog.py reads each data module's facts from its source: they match the imported classes and the
configs/data options, and a record's target is never imported."""

from __future__ import annotations

import importlib
import sys

import pytest
from omegaconf import OmegaConf

from canonical_network.data.catalog import DATA_MODULES, FACTS, all_data_facts, data_facts, data_for_task
from canonical_network.utils.config import CONFIG_DIR


@pytest.mark.parametrize("facts", all_data_facts(), ids=lambda f: f.class_name)
def test_facts_are_the_class_attributes(facts):
    module, name = facts.target.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    for key in FACTS:
        assert key in vars(cls), f"{name} states its own {key}"
        assert getattr(cls, key) == getattr(facts, key)
    config = OmegaConf.load(CONFIG_DIR / "data" / f"{facts.config_name}.yaml")
    assert config.data._target_ == facts.target


def test_every_data_option_is_in_the_catalog():
    targets = {str(OmegaConf.load(path).data._target_) for path in sorted((CONFIG_DIR / "data").glob("*.yaml"))}
    assert targets == set(DATA_MODULES)


def test_lookup_by_class_name_and_unknown_targets():
    assert data_facts("canonical_network.data.nbody.NBodyDataModule").display_name == "N-body charged particles"
    assert data_facts("NBodyDataModule").config_name == "nbody"
    assert data_facts("os.system") is None and data_facts(None) is None and data_facts("") is None
    assert [f.config_name for f in data_for_task("ImageClassificationTask")] == [
        "rotated_mnist", "rotated_mnist_5k", "cifar10", "stl10"]
    assert [f.config_name for f in data_for_task("PartSegmentationTask")] == ["shapenet_part", "synthetic_shapes"]
    assert data_for_task("NoSuchTask") == ()


def test_records_do_not_import_data_modules():
    """dataset_of reads the source, so reports need no Lightning import."""
    import subprocess

    code = ("import sys; from canonical_network.records import dataset_of; "
            "print(dataset_of({'config.data._target_': 'canonical_network.data.modelnet.ModelNet40DataModule'})); "
            "print(any(m.startswith('canonical_network.data.modelnet') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["('ModelNet40', True)", "False"]
