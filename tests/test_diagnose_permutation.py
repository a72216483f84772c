"""``diagnose`` for canonicalizers with an S_n factor: the ``permutation`` section of ``diagnostics.json``.

Models come from the experiment files through the overrides a user would type: N-body with the S_n
canonicalizer alone (``canonicalization=permutation``) in front of an order-dependent MLP (a test double: an
MLP on the flattened particle array, neither permutation-equivariant nor invariant), with the identity
canonicalizer as its control; ModelNet's PointNet behind SO(3)×S_n (``canonicalization=so3_permutation``),
where the S_n factor reads the first factor's canonical points. Untrained (seed 0), diagnosed in float64.
"""

from __future__ import annotations

import math

import hydra
import pytest
import torch
from torch import nn

from canonical_network.diagnose import in_dtype, run, select_inputs
from canonical_network.diagnostics.measures import (
    SCORE_ROUNDING_TERMS,
    coordinate_element,
    diagnose,
    has_permutation_factor,
    permutation_measures,
)
from canonical_network.diagnostics.summary import flat_metrics, summary_table
from canonical_network.diagnostics.symmetries import rotation_group_3d, symmetry_for
from canonical_network.groups.euclidean import EuclideanTransform
from canonical_network.groups.permutation import PermutationElement
from canonical_network.groups.product import ProductElement
from canonical_network.utils.config import compose_experiment
from tests.helpers import EPS64
from tests.test_diagnose import NBODY, NBODY_TINY, NUM_SAMPLES, POINTS, diagnose_config

pytestmark = pytest.mark.usefixtures("one_thread")

#: how far an order-dependent model must miss (as tests/test_diagnose.py's FAIL: they miss by O(1))
FAIL = 1e-2
#: N-body systems have 5 particles; the test double flattens them
PARTICLES = 5


class FlatParticleMLP(nn.Module):
    """Test double: an MLP on the flattened, ordered particle array ``[loc, vel, q]`` ``(B, 5·7)`` → positions
    ``(B, 5, 3)``; depends on the particles' order (and on rotations). Takes the GNN config's keys."""

    def __init__(self, hidden_dim: int = 32, **unused) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(PARTICLES * 7, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, PARTICLES * 3))

    def forward(self, loc, vel, charges):
        return self.net(torch.cat([loc, vel, charges], dim=-1).flatten(1)).view(len(loc), PARTICLES, 3)


def nbody_overrides(nbody_dir, canonicalization: str) -> list[str]:
    return ["experiment=nbody/gnn", f"canonicalization={canonicalization}", *NBODY, f"data.data_dir={nbody_dir}",
            f"prediction._target_={__name__}.FlatParticleMLP", f"trusted_targets=[{__name__}.FlatParticleMLP]"]


@pytest.fixture(scope="module")
def nbody_dir(tmp_path_factory):
    from canonical_network.data.nbody import NBodyDataModule

    out = tmp_path_factory.mktemp("nbody_tiny")
    NBodyDataModule(data_dir=str(out), **NBODY_TINY).prepare_data()
    return out


def built(overrides: list[str]):
    """The untrained model (seed 0) in eval mode, its data module and ``NUM_SAMPLES`` test inputs."""
    cfg = compose_experiment(overrides, config_name="diagnose")
    torch.manual_seed(0)
    model = hydra.utils.instantiate(cfg.model).eval()
    datamodule = hydra.utils.instantiate(cfg.data)
    inputs, _ = select_inputs(datamodule, model, NUM_SAMPLES)
    return model, datamodule, inputs


def test_nbody_sn_row_is_permutation_equivariant_and_its_control_is_not(nbody_dir, tmp_path):
    results = {}
    for canonicalization in ("permutation", "identity"):
        cfg = diagnose_config([*nbody_overrides(nbody_dir, canonicalization), "diagnose.figures=false"],
                              tmp_path / canonicalization)
        results[canonicalization] = run(cfg)
    sn, control = results["permutation"], results["identity"]
    part = sn["permutation"]
    assert part["group"] == "S_n" and part["n"] == PARTICLES and part["selection"] == "ste"
    eq = part["equivariance"]
    assert eq["outputs"].startswith("per element")
    # exact: the S_n factor hands the predictor the same numbers in the same order (a gather), and maps the
    # outputs back by a scatter; the scores of permuted inputs differ by rounding only (mean pooling summed in
    # another order), far below every gap here (ambiguity_rate 0), so the order is σ-consistent
    assert eq["order_mismatch_rate"] == 0.0 and eq["canonical_max_rel"] == 0.0 and eq["max_rel"] == 0.0
    ties = part["ties"]
    assert ties["ambiguity_rate"] == ties["ambiguity_rate_distinct"] == ties["duplicate_rate"] == 0.0
    assert 0.0 <= ties["near_tie_rate"] <= 1.0 and ties["min_gap_over_std"]["min"] > 0
    # the rounding threshold is 2¹³ eps64 of the read-out's scale: ~1e-12 relative, far below the spread
    assert 0 < ties["threshold_max"] < 1e-9
    moved = part["continuity"]
    for key in ("jump_rate", "order_change_rate", "displaced_fraction"):
        assert 0.0 <= moved[key] <= 1.0, key
    # a 1e-3 jitter moves a continuous, well-separated order's outputs by O(1e-3), not by a jump
    assert moved["max_rel"] < 0.1 and moved["jump_rate"] == 0.0
    # the control: the same MLP, no canonicalizer, fails the permutation check of the exact section
    assert control["permutation"] is None
    assert control["equivariance"]["exact"]["by_element"]["S_P"]["max_rel"] > FAIL
    assert sn["equivariance"]["exact"]["by_element"]["S_P"]["max_rel"] == 0.0
    # S_n alone has no coordinate action: no pose, no frame check, and the table says why
    assert sn["pose"] is None and sn["canonicalizer"] is None and sn["continuity"]["element_change_rate"] is None
    table = summary_table(sn)
    assert "S_n: no coordinate action" in table and "permutation.ties" in table
    assert "permutation" not in summary_table(control)
    assert "diagnose/permutation/ties/ambiguity_rate" in flat_metrics(sn)


def test_duplicated_particles_are_ambiguous_and_break_per_element_equivariance(nbody_dir):
    """Two identical particles tie (equal features, equal scores): every input is ambiguous, none between
    distinct elements, and for per-element outputs the tie-break by index decides which copy gets which of
    the MLP's two outputs, so φ(σx) ≠ σφ(x) once σ swaps the copies (the stabiliser)."""
    model, datamodule, inputs = built(nbody_overrides(nbody_dir, "permutation"))
    loc, vel, charges = (x.clone() for x in inputs)
    for x in (loc, vel, charges):
        x[:, 1] = x[:, 0]
    symmetry = symmetry_for(model, datamodule)
    with in_dtype(model, (loc, vel, charges), torch.float64, "cpu") as (model, moved, _):
        result = diagnose(model, symmetry, moved).results["permutation"]
    ties = result["ties"]
    assert ties["ambiguity_rate"] == 1.0 and ties["duplicate_rate"] == 1.0
    assert ties["ambiguity_rate_distinct"] == 0.0 and ties["min_gap_over_std"]["min"] == 0.0
    assert result["equivariance"]["canonical_max_rel"] == 0.0  # the canonical input is the same either way
    assert result["equivariance"]["max_rel"] > FAIL and result["equivariance"]["order_mismatch_rate"] > 0


def test_near_ties_of_distinct_elements_are_counted_apart(nbody_dir):
    """Scores of distinct elements within the rounding threshold: ambiguous, and distinct."""
    model, datamodule, inputs = built(nbody_overrides(nbody_dir, "permutation"))
    h = model.canonicalizer
    with in_dtype(model, inputs, torch.float64, "cpu") as (model, inputs64, _), torch.no_grad():
        h.readout.weight.zero_()  # every score 0: all ties, between elements that all differ
        symmetry = symmetry_for(model, datamodule)
        ties = permutation_measures(model, symmetry, inputs64, model(*inputs64), num_elements=1, margin=0.01,
                                    jump=0.1, generator=torch.Generator().manual_seed(0))["ties"]
    assert ties["ambiguity_rate"] == ties["ambiguity_rate_distinct"] == 1.0 and ties["duplicate_rate"] == 0.0
    assert ties["near_tie_rate"] == 1.0


def test_so3_sn_product_point_cloud_row(tmp_path):
    """ModelNet's PointNet behind SO(3)×S_n: the S_n factor is found inside the product and reads the SO(3)
    factor's canonical points; class logits are invariant; the frame's measures stay with the SO(3) factor."""
    overrides = ["experiment=modelnet/pointnet", "canonicalization=so3_permutation", *POINTS]
    results = run(diagnose_config([*overrides, "diagnose.figures=false"], tmp_path / "so3_sn"))
    assert results["model"]["group"] == "SO(3)×S_n"
    part = results["permutation"]
    assert part is not None and part["factor"] == "PermutationCanonicalizer" and part["n"] == 64
    eq = part["equivariance"]
    assert eq["outputs"].startswith("invariant")
    # the SO(3) frame of a permuted cloud is the same up to rounding (its means summed in another order), so
    # the canonical points agree to rounding and the order with them
    bound = SCORE_ROUNDING_TERMS * EPS64 * math.sqrt(64 * 3)
    assert eq["canonical_max_rel"] < bound and eq["order_mismatch_rate"] == 0.0
    assert eq["max_rel"] < bound
    # the coordinate factor's measures: a 3×3 frame, compared as SO(3) (the product's first factor)
    assert results["canonicalizer"]["max_rel"] < bound and results["pose"]["kind"] == "continuous"
    assert results["symmetry"]["rotation_group"] == "SO3"
    ties = part["ties"]
    assert 0.0 <= ties["ambiguity_rate_distinct"] <= ties["ambiguity_rate"] <= 1.0


def test_models_without_an_sn_factor_get_no_permutation_section(nbody_dir):
    model, datamodule, inputs = built(["experiment=nbody/cn_gnn", *NBODY, f"data.data_dir={nbody_dir}",
                                       "canonicalization.hidden_dim=8"])
    assert not has_permutation_factor(model.canonicalizer)
    with torch.no_grad():
        assert permutation_measures(model, symmetry_for(model, datamodule), inputs, model(*inputs), num_elements=1,
                                    margin=0.01, jump=0.1, generator=torch.Generator()) is None


def test_coordinate_element_and_the_product_group_name():
    perm = PermutationElement(torch.arange(4).expand(2, 4))
    frame = EuclideanTransform(torch.eye(3).expand(2, 3, 3), torch.zeros(2, 3))
    assert coordinate_element(perm) is None
    assert coordinate_element(ProductElement(frame, perm)) is frame
    assert coordinate_element(frame) is frame
    assert rotation_group_3d("E(3)×S_n", None, default="SO3") == "O3"
    assert rotation_group_3d("SO(3)×S_n", "z") == "SO3"
    assert rotation_group_3d("S_n", "z") == "z"  # no coordinate claim: the data's protocol


def test_continuity_compares_a_sampled_frame_at_common_random_numbers_and_reports_its_redraws():
    """A sampled-mode model draws anew at every pass: its continuity is measured for one draw (the same seed
    before φ(x) and φ(x′)), and its draw-to-draw change is a part of its own."""
    import types

    from canonical_network.diagnostics.measures import continuity

    class Noisy(torch.nn.Module):  # φ(x) = x + 0.5 · (a fresh standard normal draw): smooth for one draw
        def __init__(self, mode: str) -> None:
            super().__init__()
            self.canonicalizer = types.SimpleNamespace(symmetrization=mode)

        def forward(self, x):
            return x + 0.5 * torch.randn(x.shape, dtype=x.dtype)

    class Jitter:  # the identity group with one perturbation: noise of 1e-6 of the input's size
        jitter = 1e-6

        def perturbations(self, inputs, generator):
            (x,) = inputs
            return {"jitter": (None, (x + 1e-6 * torch.randn(x.shape, generator=generator, dtype=x.dtype),))}

    x = 1.0 + torch.rand(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sampled = Noisy("sampled")
    result = continuity(sampled, Jitter(), (x,), sampled(x), None, 0.1, torch.Generator().manual_seed(1))
    jitter, redraw = result["by_perturbation"]["jitter"], result["by_perturbation"]["redraw"]
    # one draw moves by the jitter only: ≤ 1e-6 · ‖noise‖ / ‖x‖ ≤ 1e-6 · ~1 (|x| ≥ 1 per entry)
    assert jitter["max_rel"] < 2e-6 and jitter["jump_rate"] == 0.0
    # two draws differ by 0.5 · √2 · ‖ε‖ / ‖φ(x)‖: O(0.3), well above the 0.1 jump threshold for most inputs
    assert redraw["mean_rel"] > 0.1 and redraw["jump_rate"] > 0.5
    assert result["jump_rate"] == 0.0  # the redraw is not pooled into the perturbations' figures
    # the same model taken for a deterministic one (canonical) is compared draw against draw: it looks like jumps
    canonical = Noisy("canonical")
    naive = continuity(canonical, Jitter(), (x,), canonical(x), None, 0.1, torch.Generator().manual_seed(1))
    assert naive["by_perturbation"]["jitter"]["jump_rate"] > 0.5 and "redraw" not in naive["by_perturbation"]


def test_continuity_splits_the_jumps_by_whether_the_chosen_element_changed():
    """Four inputs of a toy C2 canonicalizer (element: the sign of x₀) under one shift by 1e-6: A jumps because
    its element flips, B jumps under the same element (its output steps at x₁ = 0), C's element flips without
    a jump, D moves nowhere. The split attributes A and B to the two parts, which sum to the jump rate."""
    import types

    from canonical_network.diagnostics.measures import continuity

    def element(x):
        return types.SimpleNamespace(index=x[:, 0] > 0)

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.canonicalizer = types.SimpleNamespace(symmetrization="canonical",
                                                       group_element_index=lambda g: g.index)
            self.network = types.SimpleNamespace(canonicalize=lambda x: (x, element(x)))

        def forward(self, x):  # a step of 9 with the element (while x₁ < 6) and a step of 9 at x₁ = 0
            chosen = element(x).index
            return (1.0 + 9.0 * (chosen & (x[:, 1] < 6)) + 9.0 * (x[:, 1] > 0)).unsqueeze(-1).double()

    class Shift:
        jitter = 1e-6

        def perturbations(self, inputs, generator):
            return {"jitter": (None, (inputs[0] + 1e-6,))}

    x = torch.tensor([[-1e-7, 5.0], [5.0, -1e-7], [-1e-7, 7.0], [5.0, 5.0]], dtype=torch.float64)  # A, B, C, D
    model = Toy()
    result = continuity(model, Shift(), (x,), model(x), element(x), 0.1, torch.Generator().manual_seed(0))
    part = result["by_perturbation"]["jitter"]
    assert part["jump_rate"] == 0.5 and part["element_change_rate"] == 0.5  # A, B jump; A, C change
    assert part["jump_with_element_change_rate"] == 0.25  # A
    assert part["jump_without_element_change_rate"] == 0.25  # B
    for key in ("jump_rate", "element_change_rate", "jump_with_element_change_rate",
                "jump_without_element_change_rate"):
        assert result[key] == part[key]  # one perturbation: the pooled figures are its own
