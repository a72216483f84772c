"""What reports, tables and config checks know of the project's data modules, read from the classes' source.

Each data module class states its own facts as class attributes: ``config_name`` (its ``configs/data``
option), ``display_name`` (the name reports and tables print), ``paper_data`` (whether the paper's numbers
were measured on (a subset of) that data) and ``tasks`` (the task classes, by name, that read it).

Records name their data module by a ``config.data._target_`` string. A record is never a reason to import
code, and importing a data module costs Lightning's import (seconds), so the facts are read from the source
files of the modules listed in :data:`DATA_MODULES` (the literal class attributes, with :mod:`ast`), never
from the record's target: a target is matched by its class name, as the records have always been read.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

# The project's data modules (full targets), in the order config errors list a task's data options.
DATA_MODULES = (
    "canonical_network.data.rotated_mnist.RotatedMNISTDataModule",
    "canonical_network.data.rotated_mnist.RotatedMNIST5kDataModule",
    "canonical_network.data.torchvision_images.CIFAR10DataModule",
    "canonical_network.data.torchvision_images.STL10DataModule",
    "canonical_network.data.nbody.NBodyDataModule",
    "canonical_network.data.modelnet.ModelNet40DataModule",
    "canonical_network.data.shapenet.ShapeNetPartDataModule",
    "canonical_network.data.synthetic_shapes.SyntheticShapesDataModule",
    "canonical_network.data.synthetic_shapes40.SyntheticShapes40DataModule",
)
FACTS = ("config_name", "display_name", "paper_data", "tasks")


@dataclass(frozen=True)
class DataFacts:
    """One data module's facts (its class attributes of the same names)."""

    target: str
    config_name: str
    display_name: str
    paper_data: bool
    tasks: tuple[str, ...]

    @property
    def class_name(self) -> str:
        return self.target.rsplit(".", 1)[-1]


def _class_attributes(target: str) -> dict[str, object]:
    module, name = target.rsplit(".", 1)
    path = Path(__file__).with_name(module.rsplit(".", 1)[-1] + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    values: dict[str, object] = {}
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            key, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            key, value = statement.target, statement.value
        else:
            continue
        if isinstance(key, ast.Name) and key.id in FACTS:
            values[key.id] = ast.literal_eval(value)
    return values


@functools.cache
def all_data_facts() -> tuple[DataFacts, ...]:
    """The facts of every module in :data:`DATA_MODULES`, in that order."""
    return tuple(DataFacts(target=target, **_class_attributes(target)) for target in DATA_MODULES)


def data_facts(target: object) -> DataFacts | None:
    """The facts of the project's data module whose class name ``target`` (a ``_target_`` or a class name)
    ends with; ``None`` for anything else (no target, another project's data module)."""
    name = str(target or "").rsplit(".", 1)[-1]
    return next((facts for facts in all_data_facts() if facts.class_name == name), None)


def data_for_task(task: str) -> tuple[DataFacts, ...]:
    """The data modules a task (by class name) reads, in :data:`DATA_MODULES` order."""
    return tuple(facts for facts in all_data_facts() if task in facts.tasks)
