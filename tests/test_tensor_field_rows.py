"""The rows of Table 3 that the paper quotes from the EGNN paper: Radial Field, TFN and SE(3)-Transformer
(``nbody/radial_field``, ``nbody/tfn``, ``nbody/se3_transformer``), built from their real configs and checked
on real simulated frames for the equivariance each claims.

Radial Field is E(3)-equivariant (rotations and reflections); TFN and the SE(3)-Transformer, like the
EGNN repository's, are SE(3)-equivariant only: their kernels keep the parity-violating couplings (a cross
product of two vectors), and this file also checks that reflections break them.

Training: ``tests/test_nbody_task.py::test_experiment_trains_tests_and_writes_results`` runs every nbody
experiment, these rows included, through ``canonical_network.train.run`` (shrunk to a few batches) and
checks its finite test/mse.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import hydra
import pytest
import torch

import canonical_network as cn
from canonical_network.data.nbody import NBodyDataModule
from canonical_network.groups.euclidean import EuclideanTransform, random_rotations
from canonical_network.prediction.radial_field import RadialField
from canonical_network.prediction.se3_transformer import SE3Transformer
from canonical_network.prediction.tfn import TFN
from tests.helpers import DEEP64, EPS64, rel_tol
from tests.test_nbody_task import MEANINGFUL, NBODY_TERMS, SHIFT_SCALE, TINY, row_config

#: row → (predictor class, whether reflections are symmetries too)
ROWS = {"radial_field": (RadialField, True), "tfn": (TFN, False), "se3_transformer": (SE3Transformer, False)}
#: The issue's bound on the float64 equivariance error, relative to the outputs' scale. The tolerances used are
#: derived (tests/helpers.py) and lie below it: the Radial Field, a shallow network with no division by a
#: small quantity, gets ``n = NBODY_TERMS = 2¹¹`` and ``κ = 1`` (2¹¹ · 2⁻⁵² ≈ 4.5e-13 of the scale); TFN and
#: the SE(3)-Transformer get the deep-network factor DEEP64 = 2²⁰ (≈ 2.3e-10 of the scale): ``n ≤ 2¹³`` (an
#: output component of an edge kernel sums ≤ 38 nonzero Clebsch–Gordan terms — input degrees 0-2 into degree
#: 2, all coupling degrees — × 21 channels ≈ 800 terms; radial MLPs of 32; means and attention sums over 4
#: neighbours; 5 layers: ≈ 4·10³) and ``κ ≤ 2⁷``, the suite's assumption for deep networks, here for the norm
#: nonlinearity's division by ‖v‖ and its LayerNorm's by the spread of the norms.
ISSUE_BOUND = 1e-9
FACTORS = {"radial_field": float(NBODY_TERMS), "tfn": DEEP64, "se3_transformer": DEEP64}


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real inputs at frame 30 of a tiny dataset (tests/test_nbody_task.py's TINY): loc (16, 5, 3),
    vel (16, 5, 3), charges (16, 5, 1), float32."""
    data_dir = tmp_path_factory.mktemp("nbody_tiny")
    dm = NBodyDataModule(data_dir=str(data_dir), batch_size=TINY["num_test"], **TINY)
    dm.prepare_data()
    dm.setup()
    loc, vel, charges, _ = next(iter(dm.test_dataloader()))
    return loc, vel, charges


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build(row: str, dtype: torch.dtype) -> torch.nn.Module:
    """The LightningModule of ``experiment=nbody/<row>`` (seed 0) in ``dtype``, in eval mode.

    Built with ``dtype`` as torch's default: e3nn computes its coupling coefficients in the default dtype when
    a layer is built, so a float32-built model converted to float64 keeps float32-rounded coefficients (and is
    equivariant only to ~1e-8 of the scale).
    """
    torch.manual_seed(0)
    with default_dtype(dtype):
        model = hydra.utils.instantiate(row_config(row).model)
    return model.to(dtype).eval()


def transforms(batch_size: int, reflections: bool) -> Iterator[EuclideanTransform]:
    """One Haar rotation and translation per system; then, if asked, the same rotations composed with −I."""
    gen = torch.Generator().manual_seed(0)
    rotation = random_rotations(batch_size, gen, dtype=torch.float64)
    shift = SHIFT_SCALE * torch.randn(batch_size, 3, generator=gen, dtype=torch.float64)
    yield EuclideanTransform(rotation, shift)
    if reflections:
        yield EuclideanTransform(-rotation, shift)


def equivariance_errors(model, frames, reflections: bool) -> tuple[float, float, float]:
    """In float64: ``max |model(x Rᵀ + t, v Rᵀ, q) − (model(x, v, q) Rᵀ + t)|`` over the sampled transforms
    (measured by ``cn.check_equivariance``; the tests below hold it to their own tolerances), the outputs'
    scale, and the scale of what the network adds to the input positions (``max |out − x|``)."""
    loc, vel, charges = (x.double() for x in frames)
    result = cn.check_equivariance(model, (loc, vel, charges), list(transforms(len(loc), reflections)),
                                   output_action="points")
    with torch.no_grad():
        moved = (model(loc, vel, charges) - loc).abs().max().item()
    return result.max_abs_error, max(e.scale for e in result.elements), moved


def test_rows_build_the_egnn_runs_models():
    """Hyperparameters of the EGNN repository's runs (README commands; main_nbody.py passes nf / degree
    channels per degree to the TFN and SE(3)-Transformer)."""
    expected = {
        "radial_field": ({"hidden_dim": 64, "num_layers": 4}, 2e-4),
        "tfn": ({"channels": 16, "num_degrees": 2, "num_layers": 4}, 1e-3),
        "se3_transformer": ({"channels": 21, "num_degrees": 3, "num_layers": 4}, 5e-3),
    }
    for row, (sizes, lr) in expected.items():
        cfg = row_config(row)
        assert cfg.experiment_name == f"nbody/{row}"
        assert {k: cfg.prediction[k] for k in sizes} == sizes
        assert cfg.model.optimizer.lr == lr and cfg.model.optimizer.weight_decay == 1e-12
        assert cfg.canonicalization._target_.endswith("IdentityCanonicalizer")


@pytest.mark.parametrize("row", ROWS)
def test_forward_contract(row, frames):
    model = build(row, torch.float32)
    assert isinstance(model.network.predictor, ROWS[row][0])
    loc, vel, charges = frames
    with torch.no_grad():
        out = model(loc, vel, charges)
    assert out.shape == loc.shape and out.dtype == torch.float32 and torch.isfinite(out).all()


@pytest.mark.parametrize("row", ROWS)
def test_row_is_equivariant_in_float64(row, frames):
    """SE(3) for every row, E(3) for the Radial Field: error below the derived tolerance, itself below the
    issue's 1e-9 of the outputs' scale, and far below what the network adds to the positions (so that the
    check is not passed by the input positions alone: the SE(3)-Transformer starts with a 0.01 output scale)."""
    model = build(row, torch.float64)
    error, scale, moved = equivariance_errors(model, frames, reflections=ROWS[row][1])
    tol = FACTORS[row] * EPS64 * scale
    assert tol < ISSUE_BOUND * scale
    assert tol < MEANINGFUL * moved, f"nbody/{row}: the network barely moves the particles ({moved:.3g})"
    assert error < tol, f"nbody/{row}: max error {error:.3g} vs tolerance {tol:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("row", ["tfn", "se3_transformer"])
def test_tensor_field_rows_are_not_reflection_equivariant(row, frames):
    """As the reference's, whose kernels keep the parity-odd couplings: a reflection changes what the network
    adds to the positions by much more than 1 % of it."""
    model = build(row, torch.float64)
    error, _, moved = equivariance_errors(model, frames, reflections=True)
    assert error > MEANINGFUL * moved


def test_plain_gnn_fails_the_same_check(frames):
    """Negative control: the plain GNN row (not equivariant) misses the same float64 check by more than 1 % of
    the outputs' scale, ~10⁷ times the loosest tolerance above."""
    error, scale, _ = equivariance_errors(build("gnn", torch.float64), frames, reflections=False)
    assert error > MEANINGFUL * scale
    assert error > rel_tol(torch.tensor(scale, dtype=torch.float64), factor=DEEP64)


@pytest.mark.parametrize(("irreps_in", "irreps_out"), [("21x1e", "21x1e"), ("21x2e", "21x2e"), ("21x1e", "21x2e")])
def test_pair_kernel_paths_give_the_fully_connected_product_bit_for_bit(frames, irreps_in, irreps_out):
    """A pair kernel computed one coupling path at a time (split radial weights, one-path products with the
    fully connected product's constants) is the fully connected product itself: the same outputs and the same
    gradients, bit for bit (only the backward's memory traffic differs), and the same checkpoint keys."""
    from e3nn import o3

    from canonical_network.prediction.tfn import PairKernel, harmonics_irreps

    torch.manual_seed(0)
    kernel = PairKernel(o3.Irreps(irreps_in), harmonics_irreps(2), o3.Irreps(irreps_out))
    assert kernel.by_paths and len(kernel.paths) > 1  # wide, several coupling degrees: the case the split is for
    loc = frames[0]
    relative = (loc[:, :, None] - loc[:, None, :]).reshape(-1, 3)
    relative = relative[relative.norm(dim=-1) > 0]
    harmonics = o3.spherical_harmonics(harmonics_irreps(2), relative, normalize=True, normalization="component")
    distance = relative.norm(dim=-1, keepdim=True)
    x = torch.randn(relative.shape[0], o3.Irreps(irreps_in).dim, generator=torch.Generator().manual_seed(1))

    def run(forward):
        kernel.zero_grad()
        out = forward(x, harmonics, distance)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), [p.grad.clone() for p in kernel.parameters()]

    split_out, split_grads = run(kernel)
    full_out, full_grads = run(lambda a, b, c: kernel.tensor_product(a, b, kernel.radial(c)))
    assert torch.equal(split_out, full_out)
    assert all(torch.equal(a, b) for a, b in zip(split_grads, full_grads, strict=True))
    assert not any(key.startswith("paths.") for key in kernel.state_dict())


def test_narrow_kernels_call_the_product_itself():
    """TFN's kernels (16 channels) stay below PATHS_MIN_WEIGHTS: no path modules, the product called as before;
    the SE(3)-Transformer's wide ones are split."""
    from canonical_network.prediction.tfn import PairKernel

    tfn_kernels = [m for m in TFN().modules() if isinstance(m, PairKernel)]
    assert tfn_kernels and not any(m.by_paths or len(m.paths) for m in tfn_kernels)
    wide = [m for m in SE3Transformer().modules() if isinstance(m, PairKernel)
            and m.tensor_product.irreps_in1.num_irreps == m.tensor_product.irreps_out.num_irreps == 21
            and len(m.tensor_product.instructions) > 1]
    assert wide and all(m.by_paths for m in wide)
