"""canonical_network.utils.checks: one message format, ``<key> must be <what>; got <value!r>``, everywhere."""

from __future__ import annotations

import math

import pytest
from torch import nn

from canonical_network.canonicalization.identity import IdentityCanonicalizer
from canonical_network.canonicalization.image import GCNNCanonicalizer
from canonical_network.canonicalization.image_optimization import OptimizationCanonicalizer
from canonical_network.canonicalization.nbody import VNDeepSetsCanonicalizer
from canonical_network.canonicalization.pointcloud import VNPointCloudCanonicalizer
from canonical_network.canonicalization.test_time import TestTimeCanonicalizer
from canonical_network.nn.message_passing import EquivariantGraphConvLayer, GraphConvLayer
from canonical_network.prediction.dgcnn import DGCNN
from canonical_network.prediction.gnn import GNN
from canonical_network.prediction.pointnet import PointNet
from canonical_network.tasks.base import CanonicalizedTask
from canonical_network.tasks.pointcloud_classification import PointCloudClassificationTask
from canonical_network.utils.checks import (
    check_bool,
    check_choice,
    check_fraction,
    check_int,
    check_number,
    check_positive,
)


def message(call) -> str:
    with pytest.raises(ValueError) as error:
        call()
    return str(error.value)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: check_int("data.batch_size", 0, low=1), "data.batch_size must be an integer >= 1; got 0"),
        (lambda: check_int("seed", "abc"), "seed must be an integer; got 'abc'"),
        (lambda: check_int("a.k", 4, low=1, high=3), "a.k must be an integer in [1, 3]; got 4"),
        (lambda: check_int("a.k", 4, high=3), "a.k must be an integer <= 3; got 4"),
        (lambda: check_int("a.k", 2.0, low=1), "a.k must be an integer >= 1; got 2.0"),
        (lambda: check_int("a.k", 0, low=1, optional=True), "a.k must be null or an integer >= 1; got 0"),
        (lambda: check_number("a.x", "1"), "a.x must be a number; got '1'"),
        (lambda: check_number("a.x", -1, low=0), "a.x must be a number >= 0; got -1"),
        (lambda: check_number("a.x", 2.5, low=0, high=1, low_inclusive=False),
         "a.x must be a number in (0, 1]; got 2.5"),
        (lambda: check_number("a.x", 1, high=1, high_inclusive=False), "a.x must be a number < 1; got 1"),
        (lambda: check_number("a.x", math.inf, finite=True), "a.x must be a finite number; got inf"),
        (lambda: check_number("a.x", math.nan, low=0), "a.x must be a number >= 0; got nan"),
        (lambda: check_positive("model.optimizer.lr", 0), "model.optimizer.lr must be a number > 0; got 0"),
        (lambda: check_positive("model.canonicalizer_lr", -0.1, optional=True),
         "model.canonicalizer_lr must be null or a number > 0; got -0.1"),
        (lambda: check_fraction("prediction.dropout", 1.0), "prediction.dropout must be a number in [0, 1); got 1.0"),
        (lambda: check_bool("prediction.residual", 1), "prediction.residual must be true or false; got 1"),
        (lambda: check_bool("prediction.residual", "true"), "prediction.residual must be true or false; got 'true'"),
        (lambda: check_choice("data.val_split", "dev", ("holdout", "test")),
         "data.val_split must be one of ['holdout', 'test']; got 'dev'"),
    ],
)
def test_message_format(call, expected):
    assert message(call) == expected


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize(
    "check",
    [
        lambda v: check_int("a.n", v),
        lambda v: check_int("a.n", v, low=0, optional=True),
        lambda v: check_number("a.x", v),
        lambda v: check_positive("a.x", v),
        lambda v: check_fraction("a.x", v),
    ],
)
def test_bools_are_not_numbers(check, value):
    assert message(lambda: check(value)).endswith(f"; got {value!r}")


def test_passing_values_come_back_normalised():
    assert check_int("a.n", 3, low=1) == 3 and type(check_int("a.n", 3)) is int
    assert check_number("a.x", 2) == 2.0 and type(check_number("a.x", 2)) is float
    assert check_positive("a.x", None, optional=True) is None and check_int("a.n", None, optional=True) is None
    assert check_fraction("a.x", 0) == 0.0 and check_bool("a.b", False) is False
    assert check_choice("a.c", "b", ["a", "b"]) == "b"


def _task(**kwargs):
    return PointCloudClassificationTask(IdentityCanonicalizer(), nn.Identity(), optimizer=None, **kwargs)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: VNDeepSetsCanonicalizer(hidden_dim=0), "canonicalization.hidden_dim must be an integer >= 1; got 0"),
        (lambda: VNDeepSetsCanonicalizer(dropout=1.0), "canonicalization.dropout must be a number in [0, 1); got 1.0"),
        (lambda: VNDeepSetsCanonicalizer(translation="mean"),
         "canonicalization.translation must be one of ['learned', 'centroid']; got 'mean'"),
        (lambda: VNPointCloudCanonicalizer(negative_slope=1.0),
         "canonicalization.negative_slope must be a number in [0, 1); got 1.0"),
        (lambda: OptimizationCanonicalizer(step_size=0), "canonicalization.step_size must be a number > 0; got 0"),
        (lambda: OptimizationCanonicalizer(intensity_feature=1),
         "canonicalization.intensity_feature must be true or false; got 1"),
        # a string is not a bool: bool("false") is True, which would have built D4 or frozen the weights
        (lambda: GCNNCanonicalizer(reflection="false"), "canonicalization.reflection must be true or false; got 'false'"),
        (lambda: GCNNCanonicalizer(freeze="false"), "canonicalization.freeze must be true or false; got 'false'"),
        (lambda: VNPointCloudCanonicalizer(batch_norm="no"),
         "canonicalization.batch_norm must be true or false; got 'no'"),
        (lambda: TestTimeCanonicalizer(reflection=1), "canonicalization.reflection must be true or false; got 1"),
        (lambda: PointNet(width=True), "prediction.width must be a number > 0; got True"),
        (lambda: PointNet(dropout=1.0), "prediction.dropout must be a number in [0, 1); got 1.0"),
        (lambda: PointNet(head="regression"),
         "prediction.head must be one of ['classification', 'segmentation']; got 'regression'"),
        (lambda: DGCNN(negative_slope=-0.1), "prediction.negative_slope must be a number in [0, 1); got -0.1"),
        (lambda: GNN(num_layers=True), "prediction.num_layers must be an integer >= 1; got True"),
        (lambda: GraphConvLayer(hidden_dim=0), "prediction.hidden_dim must be an integer >= 1; got 0"),
        (lambda: EquivariantGraphConvLayer(coords_weight=math.nan),
         "prediction.coords_weight must be a finite number; got nan"),
        (lambda: EquivariantGraphConvLayer(residual="yes"), "prediction.residual must be true or false; got 'yes'"),
        (lambda: _task(label_smoothing=1.0), "model.label_smoothing must be a number in [0, 1); got 1.0"),
        (lambda: CanonicalizedTask(IdentityCanonicalizer(), nn.Identity(), optimizer=None, canonicalizer_lr=0),
         "model.canonicalizer_lr must be null or a number > 0; got 0"),
    ],
)
def test_components_name_the_full_config_key(build, expected):
    assert message(build) == expected


def test_checks_is_a_leaf_module():
    """Every component imports checks.py, so it imports nothing of the project (no cycle with checkpoints.py)."""
    import ast
    import inspect

    import canonical_network.utils.checks as checks

    tree = ast.parse(inspect.getsource(checks))
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if name.startswith("canonical_network")]
